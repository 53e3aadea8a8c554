"""The kinds of fresh process a first call is timed in (`timing.cold_starts` runs them). Torch-free: the
command line and the manifest check names against them."""

from __future__ import annotations

STARTS = ("cold", "warm", "hot", "artifact")  # in the order they run
QUICK_STARTS = ("warm",)


def checked(kinds: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`kinds` as given, where each names a start and there is one at least; else a ValueError naming
    those there are."""
    if not kinds or not set(kinds) <= set(STARTS):
        raise ValueError(f"some of {', '.join(STARTS)}")
    return tuple(kinds)


def start_kinds(requested: tuple[str, ...]) -> tuple[str, ...]:
    """The processes that time the `requested` starts, in the order they run: a hot or artifact process
    finds what the cold one before it left."""
    wanted = {*requested, *(("cold",) if {"hot", "artifact"} & set(requested) else ())}
    return tuple(kind for kind in STARTS if kind in wanted)
