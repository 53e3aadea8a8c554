"""Keeps the state of each thread's call under way, and the lock that sets an owner up once.

What one thread's call sets must not be seen by another's, and what is process-wide is set up under one
lock (docs/form-torch-versions.md#torch-versions)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from .internals.tracer import compiles_seen_in_every_thread, is_tracing

T = TypeVar("T")


class Call(threading.local):
    """Holds the state of this thread's call, with its defaults in every other thread.

    Dynamo reads it as attributes, which it can trace on a `threading.local`, and then guards on them."""

    def __init__(self) -> None:
        # True while an owner runs whole, so that block forwards are nested regions; "flat" where its graph
        # is compiled in pieces (`pieces_backend`) and its blocks are traced as they are.
        self.tracing: bool | str = False
        self.standing_in = False  # True while a block's own frame runs with its cache stood in for
        # True while the owner serves a call in CUDA graphs, which in the default form happens only for a
        # call that a compile around the model handed over.
        self.graphing = False
        self.handed: object = None  # the owner a compile around the model handed its call to, while it runs


this_call = Call()


# Held while an owner or its blocks are set up or compiled again, and while a block class becomes regions,
# so that two threads' first calls do not both set an owner up.
setup_lock = threading.RLock()


def run_locked(run: Callable[..., T], *args: Any) -> T:
    """Runs `run(*args)` under the set-up lock, or without it while Dynamo traces the call.

    Dynamo holds its own compile lock then, and would break its graph at another lock."""
    if is_tracing():
        return run(*args)
    with setup_lock:
        return run(*args)


def run_one_at_a_time(run: Callable[..., T], *args: Any) -> T:
    """Runs `run(*args)`, an owner's call, under the set-up lock where torch needs it.

    Where torch cannot run one thread's call while another compiles (`compiles_seen_in_every_thread`), the
    owner's calls run one at a time, since any call may compile. While Dynamo traces, it takes no lock."""
    if is_tracing() or compiles_seen_in_every_thread():
        return run(*args)
    with setup_lock:
        return run(*args)


class TorchWarnings:
    """Keeps torch's warnings at Python's default while any thread's owner call is under way.

    One `catch_warnings` per call would not do, because two threads' overlapping calls would restore each
    other's filter lists. So the first call in saves the filters, and the last call out restores them."""

    def __init__(self) -> None:
        self.lock, self.calls = threading.Lock(), 0
        self.saved: warnings.catch_warnings[None] | None = None

    def __enter__(self) -> None:
        with self.lock:
            if not self.calls:
                self.saved = warnings.catch_warnings()
                self.saved.__enter__()
                warnings.filterwarnings("default", module=r"torch(\.|$)")
            self.calls += 1

    def __exit__(self, *exc_info: object) -> None:
        with self.lock:
            self.calls -= 1
            if not self.calls:
                self.saved.__exit__(None, None, None)  # type: ignore[union-attr]  # the first call in set it
                self.saved = None


torch_warnings = TorchWarnings()
