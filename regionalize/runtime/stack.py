"""Where an owner's call stands on Python's own stack of frames."""

import sys

# The stack slots an owner's call adds to its frame, 128 KiB: more than a chunk of 16 KiB holds.
chunk_slots = 16384


def fresh_stack(fn):
    """`fn`, its frame at the base of a chunk of Python's frame stack of its own, in which every frame of its
    call fits. CPython 3.11 and 3.12 keep a thread's frames in chunks of 16 KiB and free a chunk as soon as
    the frame at its base returns (python/cpython issue 142183): where an owner's deep call (Dynamo's,
    Inductor's, then a call a block) crossed a chunk's end, every block mapped and unmapped memory each
    call. A frame of 128 KiB of stack slots fits in no such chunk, so CPython opens one of 256 KiB for it:
    one mapping a call, the slots never written. The figures: docs/results/torch-versions/stack-depths.md."""
    if sys.version_info >= (3, 11):
        fn.__code__ = fn.__code__.replace(co_stacksize=fn.__code__.co_stacksize + chunk_slots)
    return fn
