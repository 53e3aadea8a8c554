"""What compiled code depends on of the machine it was compiled on, for the keys of the files that keep it:
a saved owner's (`saved.key`) and those of torch's own caches (`tag_caches`).

Inductor writes CPU kernels for the vector instruction set it picks from the CPU's flags and
`ATEN_CPU_CAPABILITY`, but torch 2.11 to 2.15 key its compiled graphs without it: a cache directory made on
one CPU and shipped to another served code for the other's vector width, which gave wrong numbers or
corrupted memory (docs/torch-workarounds.md)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform

import torch

from .internals.cpu import cpu_identity

_TAG = "regionalize-cpu:"


@functools.cache
def machine() -> tuple:
    """The architecture, the CPU's flags and the instruction set asked for (`ATEN_CPU_CAPABILITY`), from
    which Inductor picks the vector code it writes, and the C++ compiler it builds with (its file, size and
    time)."""
    identity = cpu_identity() or {}
    return (
        platform.machine(),
        cpu_flags(),
        os.environ.get("ATEN_CPU_CAPABILITY", ""),
        identity.get("compiler"),
    )


def cpu_flags() -> list[str] | None:
    """The CPU's flags as Linux lists them (`/proc/cpuinfo`, x86's "flags", Arm's "Features"), sorted; None
    where there are none to read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            for line in file:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return sorted(value.split())
    except OSError:
        pass
    return None


def tag_caches() -> None:
    """Put the machine (`machine`) in the keys of torch's caches, through the tag torch adds to every compile
    cache's key (`torch.compiler.config.cache_key_tag`), after the user's own tag where one is set: a cache
    made on a CPU that picks other vector code then misses, and compiles afresh, where it gave wrong
    numbers. It holds for every compile of the process from then on."""
    config = torch.compiler.config
    tag = getattr(config, "cache_key_tag", None)
    if tag is None:  # a torch without the tag: nothing to add it to
        return
    mine = _TAG + hashlib.sha256(repr(machine()).encode()).hexdigest()[:16]
    if mine not in tag:
        config.cache_key_tag = f"{tag}|{mine}" if tag else mine
