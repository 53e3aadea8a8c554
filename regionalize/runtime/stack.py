"""Gives an owner's call a fresh chunk of Python's frame stack."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

Fn = TypeVar("Fn", bound=Callable[..., Any])

# The stack slots that an owner's call adds to its frame: 128 KiB, more than a 16 KiB chunk of CPython's
# frame stack holds.
chunk_slots = 16384


def fresh_stack(fn: Fn) -> Fn:
    """Returns `fn` with a frame too large for any chunk, so that its call opens a chunk of its own.

    A deep call across a chunk's end would otherwise map memory on each call (docs/form-torch-versions.md)."""
    if sys.version_info >= (3, 11):
        fn.__code__ = fn.__code__.replace(co_stacksize=fn.__code__.co_stacksize + chunk_slots)
    return fn
