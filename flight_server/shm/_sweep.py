"""Removal of the arena directories that killed servers left on tmpfs.

An auto-named arena (``trajflight-<uuid>``, new for every server) is never started on again, so each new
auto-named arena also removes the auto-named directories beside it whose lock nobody holds and that
nobody touched for a minute (:func:`sweep_dead_arenas`): a killed server's memory comes back with the
next server started on the machine.

This module touches only directories of that name whose every ``.lock`` it can take; it does not remove
directories of live servers, of other names or of other users.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time

__all__ = ["ORPHAN_AGE", "remove_dead_arena", "sweep_dead_arenas"]

log = logging.getLogger("trajflight.flight_server.shm")


ORPHAN_AGE = 60.0
"""Seconds an auto-named arena directory must have been left untouched before another arena removes it
(a server starting on it takes its lock within microseconds; this leaves it ample room)."""
_AUTO_NAME = re.compile(r"trajflight-[0-9a-f]{32}\Z")


def sweep_dead_arenas(base: str, *, keep: str = "") -> int:
    """Remove the auto-named arena directories (``trajflight-<uuid>``) under ``base`` whose servers are
    dead: nobody holds their ``.lock`` and nothing changed in them for :data:`ORPHAN_AGE` seconds. Returns
    how many were removed; directories of live servers, of other names or of other users are left alone.

    A directory is an arena (``.lock`` inside) or holds one arena per server one level down
    (``server-<i>/.lock``, as :class:`~trajflight.LocalCluster` lays them out); it goes only when every
    lock in it can be taken, or when it holds no file at all. Readers' mappings of the removed segments
    stay valid until dropped, as after any unlink.
    """
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        if not _AUTO_NAME.match(entry.name) or entry.path == keep:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or now - entry.stat().st_mtime < ORPHAN_AGE:
                continue
        except OSError:
            continue
        if remove_dead_arena(entry.path):
            removed += 1
        elif _no_files(entry.path):  # what servers that stopped cleanly left of a crashed cluster's
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        # else a live server, or not an arena this module made
    if removed:
        log.warning("shared-memory arenas: removed %d directories of dead servers under %s", removed, base)
    return removed


def remove_dead_arena(path: str) -> bool:
    """Remove the arena directory ``path`` now if its server is dead (its ``.lock`` can be taken), as
    the owner of a server it knows was killed does (no wait of :data:`ORPHAN_AGE`). Returns whether it
    was removed; a live server's directory, a missing one, or one without a lock is left alone."""
    locks = _dead_locks(path)
    if locks is None:
        return False
    try:  # holding every lock: a server starting on it meanwhile is refused
        shutil.rmtree(path, ignore_errors=True)
    finally:
        for fd in locks:
            os.close(fd)
    return not os.path.exists(path)


def _no_files(path: str) -> bool:
    """Whether the directory tree at ``path`` holds directories only (no file, socket or link)."""
    try:
        return all(not files for _, _, files in os.walk(path))
    except OSError:
        return False


def _dead_locks(path: str) -> list[int] | None:
    """The ``.lock`` files of the arena directory ``path`` (its own, or its subdirectories'), opened and
    locked exclusively; None (and nothing held) when there is none or a live server holds one."""
    candidates = [os.path.join(path, ".lock")]
    with contextlib.suppress(OSError):
        candidates += [
            os.path.join(e.path, ".lock") for e in os.scandir(path) if e.is_dir(follow_symlinks=False)
        ]
    held: list[int] = []
    try:
        for lock in candidates:
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue  # no lock file there
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise  # its server is alive
            held.append(fd)
    except OSError:
        for fd in held:
            os.close(fd)
        return None
    return held or None
