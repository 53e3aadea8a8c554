"""The peak memory of a stretch of work: CUDA's allocator statistics on a GPU; on a Linux CPU, the process's
resident peak, which the kernel resets on request.

On a CPU, torch allocates with the C library's malloc, which keeps freed memory for reuse: the heap's free
memory is handed back first (`malloc_trim`), so that what the work allocates shows as new resident memory.
While the work runs, glibc maps every allocation of `_MAPPED_FROM` bytes or more on its own and unmaps it
when freed (`mallopt`), so the peak counts the tensors alive at once rather than how the heap's holes
happened to fit them: left to itself, the same training step's peak differed more from one process to the
next than between compiled forms.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import re
from collections.abc import Callable, Iterator

import torch

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"  # "5" resets the resident peak (VmHWM) to what is resident now
_M_MMAP_THRESHOLD = -3  # mallopt's parameter: the size from which malloc maps an allocation on its own
_MAPPED_FROM = 64 * 1024
# glibc's own adjustment raises the threshold towards this as mapped memory is freed; mallopt turns that
# adjustment off for good, so the threshold goes back to its ceiling once the work is measured.
_MAPPED_FROM_AFTER = 32 * 1024 * 1024


@contextlib.contextmanager
def peak_memory(device: str, peaks: dict[str, int], name: str, wanted: bool = True) -> Iterator[None]:
    """Records in `peaks[name]` the most memory the block took above what it found in use, the largest over
    the blocks so recorded; records nothing where not `wanted` or where the machine cannot tell."""
    cuda = device == "cuda"
    if not wanted or not (cuda or resident_peak_available()):
        yield
        return
    before = _start_cuda() if cuda else _start_resident()
    try:
        yield
        peak = _cuda_peak() if cuda else _resident_kib("VmHWM") * 1024
    finally:
        if not cuda:
            _map_from(_MAPPED_FROM_AFTER)
    peaks[name] = max(peaks.get(name, 0), peak - before)


def _start_cuda() -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _cuda_peak() -> int:
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def _start_resident() -> int:
    """Hands the heap's free memory back, has large allocations mapped on their own, resets the resident
    peak, and returns the resident bytes."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
    _map_from(_MAPPED_FROM)
    with open(_CLEAR_REFS, "w") as file:
        file.write("5")
    return _resident_kib("VmRSS") * 1024


@functools.cache
def resident_peak_available() -> bool:
    """Returns whether this process can reset and read its resident peak (Linux 4.0 and later)."""
    try:
        with open(_CLEAR_REFS, "w") as file:
            file.write("5")
        return _resident_kib("VmHWM") > 0
    except (OSError, ValueError):
        return False


def _resident_kib(field: str) -> int:
    with open(_STATUS) as file:
        found = re.search(rf"^{field}:\s+(\d+) kB", file.read(), re.MULTILINE)
    if found is None:
        raise ValueError(f"no {field} in {_STATUS}")
    return int(found.group(1))


def _map_from(size: int) -> None:
    """Has glibc map each allocation of `size` bytes or more on its own; does nothing under another C
    library."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, size)


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    """Returns glibc's function `name`, or None under another C library."""
    library = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(library), name, None) if library else None
