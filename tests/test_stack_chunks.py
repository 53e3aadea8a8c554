"""An owner's call opens a chunk of Python's frame stack of its own (`fresh_stack`), so the
calls it makes a block cost the same wherever its caller's stack stands. On CPython 3.11 and 3.12 a call
whose frame straddles a chunk's end maps memory and takes a page fault each time (python/cpython issue
142183): at some depths of the caller, once a block."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from test_hierarchical import SOURCE, build

from regionalize.bench.timing import at_depth
from regionalize.runtime.stack import fresh_stack

resource = pytest.importorskip("resource")
DEPTHS = range(0, 150)  # frames of about 120 bytes: more than one chunk of 16 KiB
CALLS = 400


def _faults(fn: Any, *args: Any) -> int:
    """The fewest minor page faults of three runs of `fn(*args)`."""
    taken = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn(*args)
        taken.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(taken)


def _most_faults(fn: Any, *args: Any) -> int:
    """The most page faults `fn(*args)` takes at any depth of its caller's stack."""
    return max(_faults_by_depth(fn, *args).values())


def _faults_by_depth(fn: Any, *args: Any) -> dict[int, int]:
    """The page faults `fn(*args)` takes at each depth of its caller's stack."""
    return {depth: at_depth(depth, lambda: _faults(fn, *args)) for depth in DEPTHS}


def _block() -> None:
    return None


# A frame of about 1 KiB, as a compiled region's.
_block.__code__ = _block.__code__.replace(co_stacksize=_block.__code__.co_stacksize + 128)


def _blocks(n: int) -> None:
    for _ in range(n):
        _block()


def test_calls_under_a_fresh_stack_fault_at_no_depth() -> None:
    if _most_faults(_blocks, CALLS) < CALLS:
        pytest.skip("this Python keeps a freed chunk of its frame stack (3.10, or one with the fix)")
    fresh = fresh_stack(types.FunctionType(_blocks.__code__, globals()))
    assert _most_faults(fresh, CALLS) < CALLS // 10


def test_an_owners_blocks_fault_at_no_depth_of_its_caller() -> None:
    """The owner compiled whole by Inductor, which calls each of its 32 blocks' region on its own."""
    model, twin = build(source=SOURCE.replace("n=10", "n=32"), mode="default")
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
        faults = _faults_by_depth(model, x)
    # What a call faults at every depth (the owner's own chunk, and whatever the process's allocators map
    # then, which a long test run changes) is not the caller's depth's: a block straddling a chunk's end
    # faults at some depths only, once a block.
    assert max(faults.values()) - min(faults.values()) < len(model.blocks) // 2, faults
