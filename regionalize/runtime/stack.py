"""Where an owner's call stands on Python's own stack of frames."""

import sys


def _regionalize_fresh_stack(fn):
    """`fn`, its frame at the base of a chunk of Python's frame stack of its own, in which every frame of its
    call fits.

    CPython 3.11 and 3.12 keep a thread's frames in chunks of 16 KiB and free a chunk as soon as the frame
    at its base returns (python/cpython issue 142183): a call whose frame does not fit in its caller's chunk
    maps, faults on and unmaps memory each time. Under an owner's call of a 32-layer decoder sit some 17 KB
    of frames (Dynamo's and Inductor's `call`, 6 and 9 KB), then one call a block. At half the positions its
    caller's stack could stand at, `call` ended within a block's frame of a chunk's end, and every block
    paid: Qwen2 on CPU decoded at up to 1.75x a full compile's time (docs/torch-versions/stack-depths.md).

    A frame of 128 KiB of stack slots fits in no chunk of 16 KiB: CPython opens it one of 256 KiB, with as
    much again free above it. That costs a mapping a call (some 5 us), as a full compile's call often takes
    one; the slots go unused, never written, and take no memory."""
    if sys.version_info >= (3, 11):
        code = fn.__code__
        fn.__code__ = code.replace(co_stacksize=code.co_stacksize + 16384)
    return fn
