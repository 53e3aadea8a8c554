"""The answers of Inductor's CPU check, kept for later processes. Inductor checks which vector instruction
sets the CPU runs by building small programs and loading each in a process of its own, once a process:
the floor of a restart that loads saved owners (docs/design-saved-owners.md, try 7).
The builds that worked are kept in `<torch cache dir>/regionalize/cpu/<key>.json`, the key naming the CPU's
flags, the compiler, torch's build, Python and Inductor's configuration; a later process with the same
key takes them from there (docs/saved-owners.md, "The CPU check")."""

import contextlib
import functools
import hashlib
import json
import os
import platform
import sys

from .cpu_keys import cpu_flags
from .files import distrust, write_whole
from .internals.aot import caches_off, config_hash
from .internals.cpu import cpu_check, cpu_identity, remember_builds

FORMAT = 1  # of the key and the file


@functools.cache
def start_cpu_check():
    """Start Inductor's CPU check (`cpu_check`), once a process, its builds answered from the kept file
    where there is one; the builds that work are added to it."""
    install, path = remember_builds(), answers_path()
    if install is not None and path is not None and distrust(path) is None:  # answers others wrote: none
        known = read(path)
        install(known, functools.partial(write, path, known))
    return cpu_check()


def answers_path():
    """The file that keeps the answers for this CPU, compiler and torch; None where there is none to keep
    (no CPU flags to read, no compiler, Inductor's caches off)."""
    flags, identity = cpu_flags(), cpu_identity()
    if flags is None or identity is None or caches_off():
        return None
    where = identity.pop("cache")
    parts = (FORMAT, platform.machine(), flags, sys.executable, config_hash(), sorted(identity.items()))
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:40]
    return os.path.join(where, "regionalize", "cpu", key + ".json")


def read(path):
    """The keys of the builds that worked, kept at `path`; none where the file is missing or unreadable
    (the check then builds, and writes it afresh)."""
    try:
        with open(path, encoding="utf-8") as file:
            builds = json.load(file)["builds"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {key for key in builds if isinstance(key, str)} if isinstance(builds, list) else set()


def write(path, known):
    """Keep `known` at `path`, whole or not at all. A folder that cannot be written keeps nothing: the next
    process checks as Inductor does."""

    def fill(temp):
        with open(temp, "w", encoding="utf-8") as file:
            json.dump({"builds": sorted(known)}, file)

    with contextlib.suppress(OSError):
        write_whole(path, fill)
