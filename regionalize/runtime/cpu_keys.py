"""Puts the machine that compiled code depends on into the keys of saved owners and of torch's caches.

Inductor writes CPU kernels for the vector instruction set of the CPU, but torch keys its compiled graphs
without it, so a cache made on one CPU could serve wrong code on another (docs/saved-owners.md#mixed-cpus)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from typing import Any

import torch

from .internals.cpu import cpu_identity

_TAG = "regionalize-cpu:"


@functools.cache
def machine() -> tuple[Any, ...]:
    """Returns what Inductor's vector code depends on: the architecture, the CPU's flags, and the compiler.

    It includes the instruction set asked for (`ATEN_CPU_CAPABILITY`) and the compiler's file, size and
    time."""
    identity = cpu_identity() or {}
    return (
        platform.machine(),
        cpu_flags(),
        os.environ.get("ATEN_CPU_CAPABILITY", ""),
        identity.get("compiler"),
    )


def cpu_flags() -> list[str] | None:
    """Returns the CPU's flags as Linux lists them in `/proc/cpuinfo`, sorted, or None where there are none.

    x86 names them "flags" and Arm "Features"."""
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
    """Adds the machine (`machine`) to the tag that torch puts in every compile cache's key.

    The tag is `torch.compiler.config.cache_key_tag`, kept after any tag of the user's. A cache made on a
    CPU that picks other vector code then misses, and the code is compiled afresh."""
    config = torch.compiler.config
    tag = getattr(config, "cache_key_tag", None)
    if tag is None:  # this torch has no such tag
        return
    mine = _TAG + hashlib.sha256(repr(machine()).encode()).hexdigest()[:16]
    if mine not in tag:
        config.cache_key_tag = f"{tag}|{mine}" if tag else mine
