"""Writes the runtime's files under torch's cache directory whole, and trusts only the user's own folders.

These files are saved owners and the CPU check's answers (docs/saved-owners.md#a-cache-directory-is-code)."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
from collections.abc import Callable

_STALE = 3600  # the age in seconds after which a temporary file belongs to a killed writer


def write_whole(path: str, fill: Callable[[str], None]) -> None:
    """Writes the file at `path` whole or not at all, and raises OSError where it cannot.

    `fill(temp)` writes a temporary file in the same folder, which is then renamed over `path`, so two
    processes that write at once each write whole files. A later write removes a killed writer's file."""
    folder = os.path.dirname(path)
    make_folder(folder)
    temp = os.path.join(folder, f".{uuid.uuid4().hex}.tmp")
    try:
        fill(temp)
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    _sweep(folder)


def make_folder(folder: str) -> None:
    """Makes `folder` and any missing folders above it, each writable by the user alone.

    The umask is not read: a folder that others could write would not be trusted (`distrust`)."""
    parent = os.path.dirname(folder)
    if parent != folder and not os.path.isdir(parent):
        make_folder(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)


def _sweep(folder: str) -> None:
    """Removes the temporary files of writers that were killed long ago."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(".tmp") and now - entry.stat().st_mtime > _STALE:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def distrust(path: str) -> str | None:
    """Returns why a file at `path` could hold code that is not the user's, or None where it is safe.

    Whoever can write a file that the runtime unpickles can run code in this process. So, as ssh checks its
    keys, the file, the folders above it and the targets of links among them must belong to the user or to
    root, and no one else may write to them; a sticky folder that root owns, such as /tmp, is allowed. On a
    system without file owners (Windows) the answer is None."""
    if not hasattr(os, "geteuid"):
        return None
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        current = candidate
        while True:
            try:
                why = _unsafe(current, os.lstat(current))
            except (FileNotFoundError, NotADirectoryError):  # not made yet; `make_folder` makes it safe
                why = None
            if why is not None:
                return why
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    return None


def _unsafe(path: str, info: os.stat_result) -> str | None:
    uid = os.geteuid()
    if info.st_uid not in (uid, 0):
        return f"{path} belongs to another user"
    if stat.S_ISLNK(info.st_mode):  # a link's own mode means nothing; its target is checked separately
        return None
    shared = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and info.st_uid == 0
    if info.st_mode & stat.S_IWOTH and not shared:
        return f"{path} can be written by others"
    if info.st_mode & stat.S_IWGRP and not (shared or _own_group(info.st_gid, uid)):
        return f"{path} can be written by its group"
    return None


def _own_group(gid: int, uid: int) -> bool:
    """Returns whether `gid` is the user's primary group and has no other member."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
        return user.pw_gid == gid and set(grp.getgrgid(gid).gr_mem) <= {user.pw_name}
    except KeyError:
        return False
