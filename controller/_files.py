"""Checkpoint and snapshot files: written atomically, read whole.

A write goes to a temporary file in the same directory, is fsynced, renamed over the target, and the
directory is fsynced, so a crash leaves either the old file or the new one, never a mix. What the bytes
mean is :mod:`._checkpoint`'s business. It does not guarantee durability on file systems that ignore fsync.
"""

from __future__ import annotations

import os
from pathlib import Path

from trajflight.errors import CheckpointError, NotFoundError

__all__ = ["read_file", "write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, rename, dir fsync.

    Raises:
        CheckpointError: the file could not be written (the old file, if any, is untouched).
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(
            f"could not write {target}: {exc}; check that the directory exists and is writable",
            path=str(target),
        ) from exc


def read_file(path: str | os.PathLike[str]) -> bytes:
    """Read a checkpoint file.

    Raises:
        NotFoundError: no such file.
        CheckpointError: it could not be read.
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"no checkpoint at {path}") from None
    except OSError as exc:
        raise CheckpointError(f"could not read {path}: {exc}", path=str(path)) from exc
