"""Output paths checked before a long run, so that a run does not end in a
failure to write its result: a file path that is a folder or a special
file, a folder that is a file, or a place the user cannot write (tried by
creating and removing an empty file there). Folders that do not exist yet
are fine (the writers create them); what is checked is the nearest one that
exists. A disk that fills up during the run can still fail the final write:
commands report that as one line too."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    def __init__(self, flag: str, path: Path, reason: str) -> None:
        super().__init__(f"{flag} {path}: {reason}")
        self.flag = flag
        self.path = path
        self.reason = reason


def check_output_file(flag: str, path: str | os.PathLike[str] | None) -> None:
    """OutputPathError unless a regular file can be written at path."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(flag, target, "is a folder, not a file")
    if target.exists() and not target.is_file():
        raise OutputPathError(flag, target, "exists and is not a regular file")
    _check_folder(flag, target, target.parent)


def check_output_folder(flag: str, path: str | os.PathLike[str] | None) -> None:
    """OutputPathError unless files can be written in the folder path."""
    if path is None:
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OutputPathError(flag, target, "exists and is not a folder")
    _check_folder(flag, target, target)


def _check_folder(flag: str, target: Path, folder: Path) -> None:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(flag, target, f"{existing} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".planner-write-check-")
    except OSError as exc:
        raise OutputPathError(
            flag, target, f"cannot write in {existing}: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    os.unlink(probe)
