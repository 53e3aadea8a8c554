"""Files the runtime keeps under torch's cache directory (saved owners, the CPU check's answers): each written
whole or not at all, and read only from a folder that no one but the running user can write."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
from collections.abc import Callable

_STALE = 3600  # seconds after which a temporary file is a killed writer's, not a running one's


def write_whole(path: str, fill: Callable[[str], None]) -> None:
    """Write the file at `path` whole or not at all: `fill(temp)` writes a file of this process's in the same
    folder (made where missing, readable by the user alone), renamed over `path`. Two processes writing at
    once each write whole files, and the last stays; a process killed while writing leaves its temporary
    file, which a later write removes. OSError where it cannot."""
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
    """Make `folder` and those above it that are missing, each writable by the user alone (whatever the
    umask says: a folder that others could write would not be trusted, `distrust`)."""
    parent = os.path.dirname(folder)
    if parent != folder and not os.path.isdir(parent):
        make_folder(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)


def _sweep(folder: str) -> None:
    """Remove the temporary files of writers killed long ago."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(".tmp") and now - entry.stat().st_mtime > _STALE:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def distrust(path: str) -> str | None:
    """Why a file at `path` could hold code that is not the user's, or None. Whoever can write a file the
    runtime unpickles can run code in this process, so, as ssh checks its keys: the file, every folder
    above it, and where a link among them leads must belong to the user or to root, and no one else may
    write to them: not others, and not the group unless it is the user's own. A folder that root owns
    and marks sticky (/tmp) may be open to all: others can add files there, but not replace the user's.
    Where the system has no owners to check (Windows), None."""
    if not hasattr(os, "geteuid"):
        return None
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        current = candidate
        while True:
            try:
                why = _unsafe(current, os.lstat(current))
            except (FileNotFoundError, NotADirectoryError):  # not made yet: made by this user (`make_folder`)
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
    if stat.S_ISLNK(info.st_mode):  # a link's own mode means nothing; where it leads is checked too
        return None
    shared = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and info.st_uid == 0
    if info.st_mode & stat.S_IWOTH and not shared:
        return f"{path} can be written by others"
    if info.st_mode & stat.S_IWGRP and not (shared or _own_group(info.st_gid, uid)):
        return f"{path} can be written by its group"
    return None


def _own_group(gid: int, uid: int) -> bool:
    """Is `gid` the user's own group: their primary group, with no member but them?"""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
        return user.pw_gid == gid and set(grp.getgrgid(gid).gr_mem) <= {user.pw_name}
    except KeyError:
        return False
