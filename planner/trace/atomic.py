"""Write a text file all at once or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write the whole file at; when the
    block ends it is fsync'ed and os.replace'd over `path`. If the block
    raises, the temporary file is removed and `path` is left as it was
    (absent or the old file). The new file gets the usual permissions (0666
    less the umask)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield Path(tmp_name)
        with open(tmp_name, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(directory)


def atomic_write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write `lines` (each without its newline) to `path` atomically (see
    atomic_output)."""
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line)
            f.write("\n")


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; some platforms cannot open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
