"""Opening a file a user names on the command line, with bounds.

Only regular files are read (or standard input, named "-"): a character
device such as /dev/zero, a named pipe, a socket or a directory is refused
before a byte is read, because it may never end. What is read is capped at
`max_bytes` (checked against the file's size first, and counted while
reading, since a file can grow and standard input has no size), and line
readers cap every line at `max_line_bytes`, so a file without a newline
cannot fill memory either.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

STDIN = "-"


class InputFileError(Exception):
    """A file that cannot or must not be read. str() names the file (and the
    1-based line, when one is at fault)."""

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {reason}")


def display_name(path: str | Path) -> str:
    return "standard input" if str(path) == STDIN else str(path)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


class _Capped(io.RawIOBase):
    """Raw bytes of `source`, refusing to go past max_bytes."""

    def __init__(self, source: BinaryIO, max_bytes: int, path: str, close_source: bool) -> None:
        super().__init__()
        self._source = source
        self._max_bytes = max_bytes
        self._path = path
        self._close_source = close_source
        self.seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        # One byte past the cap is enough to know it is exceeded.
        want = min(len(view), self._max_bytes + 1 - self.seen)
        if want <= 0:
            raise InputFileError(self._path, f"larger than {self._max_bytes:,} bytes")
        if isinstance(self._source, io.BufferedIOBase):
            data = self._source.read1(want)
        else:
            data = self._source.read(want) or b""
        n = len(data)
        view[:n] = data
        self.seen += n
        if self.seen > self._max_bytes:
            raise InputFileError(self._path, f"larger than {self._max_bytes:,} bytes")
        return n

    def close(self) -> None:
        if not self.closed and self._close_source:
            self._source.close()
        super().close()


def _open_regular(path: str) -> BinaryIO:
    # O_NONBLOCK: opening a named pipe without a writer must not hang.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputFileError(
                path, f"{_kind(mode)}, not a regular file (give a file, or - for standard input)"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def check_regular_file(path: str | Path, max_bytes: int) -> None:
    """InputFileError unless path is a regular file of at most max_bytes (for
    readers that open the file themselves)."""
    name = str(path)
    try:
        st = os.stat(name)
    except OSError as exc:
        raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(name, f"{_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise InputFileError(name, f"{st.st_size:,} bytes, larger than {max_bytes:,} bytes")


@contextmanager
def open_input(path: str | Path, max_bytes: int) -> Iterator[BinaryIO]:
    """A buffered binary stream of the regular file at path, or of standard
    input for "-", that raises InputFileError past max_bytes."""
    name = str(path)
    if name == STDIN:
        source: BinaryIO = sys.stdin.buffer
        close_source = False
    else:
        source = _open_regular(name)
        close_source = True
        try:
            size = os.fstat(source.fileno()).st_size
        except BaseException:
            source.close()
            raise
        if size > max_bytes:
            source.close()
            raise InputFileError(name, f"{size:,} bytes, larger than {max_bytes:,} bytes")
    capped = _Capped(source, max_bytes, display_name(name), close_source)
    stream = io.BufferedReader(capped)
    try:
        yield stream
    finally:
        stream.close()


def read_bytes(path: str | Path, max_bytes: int) -> bytes:
    """The whole content of path ("-": standard input), at most max_bytes."""
    try:
        with open_input(path, max_bytes) as f:
            return f.read()
    except OSError as exc:
        raise InputFileError(display_name(path), f"cannot read: {exc.strerror or exc}") from None


def read_lines(
    path: str | Path, max_bytes: int, max_line_bytes: int
) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line with its line ending) of path; a line
    longer than max_line_bytes (ending excluded) is an InputFileError naming
    it, before more of it is read."""
    try:
        with open_input(path, max_bytes) as f:
            number = 0
            while True:
                raw = f.readline(max_line_bytes + 2)
                if not raw:
                    return
                number += 1
                body = raw.rstrip(b"\n").rstrip(b"\r")
                if len(body) > max_line_bytes:
                    raise InputFileError(
                        display_name(path),
                        f"line longer than {max_line_bytes:,} bytes",
                        line=number,
                    )
                yield number, raw
    except OSError as exc:
        raise InputFileError(display_name(path), f"cannot read: {exc.strerror or exc}") from None
