"""Keeps the answers of Inductor's CPU check for later processes, so that a restart skips its builds.

The builds that worked are kept in `<torch cache dir>/regionalize/cpu/<key>.json`, where the key names the
CPU's flags, the compiler, torch's build, Python and Inductor's configuration
(docs/saved-owners.md#the-cpu-check)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
import threading

from .cpu_keys import cpu_flags
from .files import distrust, write_whole
from .internals.aot import config_hash, is_cache_disabled
from .internals.cpu import cpu_check, cpu_identity, remember_builds

FORMAT = 1  # of the key and the file


@functools.cache
def start_cpu_check() -> threading.Thread | None:
    """Starts Inductor's CPU check once per process, answering its builds from the kept file if there is one.

    The builds that work are added to that file."""
    install, path = remember_builds(), answers_path()
    if install is not None and path is not None and distrust(path) is None:  # never answers others wrote
        known = read(path)
        install(known, functools.partial(write, path, known))
    return cpu_check()


def answers_path() -> str | None:
    """Returns the file that keeps the answers for this CPU, compiler and torch, or None.

    It is None without CPU flags to read, without a compiler, or with Inductor's caches off."""
    flags, identity = cpu_flags(), cpu_identity()
    if flags is None or identity is None or is_cache_disabled():
        return None
    where = identity.pop("cache")
    parts = (FORMAT, platform.machine(), flags, sys.executable, config_hash(), sorted(identity.items()))
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:40]
    return os.path.join(where, "regionalize", "cpu", key + ".json")


def read(path: str) -> set[str]:
    """Returns the keys of the builds that worked, as kept at `path`.

    A missing or unreadable file gives none, and the check then builds and writes the file afresh."""
    try:
        with open(path, encoding="utf-8") as file:
            builds = json.load(file)["builds"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {key for key in builds if isinstance(key, str)} if isinstance(builds, list) else set()


def write(path: str, known: set[str]) -> None:
    """Writes `known` to `path`, whole or not at all.

    Where the folder cannot be written nothing is kept, and the next process checks as Inductor does."""

    def fill(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as file:
            json.dump({"builds": sorted(known)}, file)

    with contextlib.suppress(OSError):
        write_whole(path, fill)
