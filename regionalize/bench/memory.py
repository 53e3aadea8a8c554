"""The peak memory of a stretch of work: the most that torch's allocator held for the tensors the work
allocated, alive at once. On CUDA that is the caching allocator's own statistic; a CPU keeps none, so torch's
profiler reports each allocation and free of torch's CPU allocator on this thread, and the running sum's
largest value is the peak.

A CPU process's resident memory is no substitute: it also counts the free memory that the C library's heap
keeps, which depends on the work that ran before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile


@contextlib.contextmanager
def peak_memory(device: str, peaks: dict[str, int], name: str, wanted: bool = True) -> Iterator[None]:
    """Records in `peaks[name]` the most memory the block's tensors held at once, the largest over the
    blocks so recorded; records nothing where not `wanted`, or where this torch's profiler keeps no
    allocation events."""
    if not wanted:
        yield
        return
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        yield
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            yield
        results = getattr(profiler.profiler, "kineto_results", None)
        if results is None:  # a torch built without Kineto keeps no allocation events
            return
        peak = _largest_running_sum(results.experimental_event_tree())
    peaks[name] = max(peaks.get(name, 0), peak)


def _largest_running_sum(roots: Iterable[torch._C._profiler._ProfilerEvent]) -> int:
    """Returns the most bytes that the CPU allocations among the profiled events held at once.

    A free is reported only for a block allocated while profiling, so the sum counts the work's tensors."""
    changes: list[tuple[int, int]] = []
    events = list(roots)
    while events:
        event = events.pop()
        events.extend(event.children)
        fields = event.extra_fields
        if isinstance(fields, torch._C._profiler._ExtraFields_Allocation) and fields.device.type == "cpu":
            changes.append((event.start_time_ns, fields.alloc_size))
    held = peak = 0
    for _, change in sorted(changes):
        held += change
        peak = max(peak, held)
    return peak


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Sends what the block writes to the process's stderr nowhere.

    The profiler's C++ side reports its own start and stop, its device probes, and now and then a free of a
    block it never saw allocated; the runs measured repeat steps already run and shown, so nothing of the
    work's own is lost."""
    saved, sink = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)
