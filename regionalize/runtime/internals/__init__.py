"""Reaches every private name of torch that the runtime uses, one module per subject of torch.

- `tracer.py` reads Dynamo: whether a frame is traced, its entries, errors, settings and counters.
- `hooks.py` reads and sets nn.Module's hooks, compiled call and submodules.
- `compiler.py` reaches Inductor's compiler for the owner compiled in pieces.
- `cpu.py` starts Inductor's CPU check early and answers its builds from kept answers.
- `aot.py` compiles, saves and loads an owner's frame for saved owners.

A torch that moves a name then breaks one module. Each capability is probed once rather than read from
torch's version, and a failed probe takes a fallback that keeps the model's results, with one warning."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")
F = TypeVar("F")
Find = Callable[[], T]


@overload
def probe(needs: str, instead: str) -> Callable[[Find[T]], Callable[[], T | None]]: ...
@overload
def probe(
    needs: str, instead: str, fallback: Callable[[], F]
) -> Callable[[Find[T]], Callable[[], T | F]]: ...
@overload
def probe(needs: str, instead: str, fallback: F) -> Callable[[Find[T]], Callable[[], T | F]]: ...
def probe(needs: str, instead: str, fallback: Any = None) -> Callable[[Find[T]], Callable[[], Any]]:
    """Decorates a probe of torch, whose answer is found once and cached.

    Where torch lacks what the probe reads (an ImportError, AttributeError, TypeError or ValueError), one
    warning names what `needs` it and what happens `instead`, and the probe answers `fallback`, which is
    called where it is a function."""

    def decorate(find: Find[T]) -> Callable[[], Any]:
        @functools.cache
        @functools.wraps(find)
        def probed() -> Any:
            try:
                return find()
            except (ImportError, AttributeError, TypeError, ValueError) as error:
                kind = type(error).__name__
                message = f"this torch lacks what {needs} needs ({kind}: {error}); {instead}"
                warnings.warn(f"regionalize: {message}", stacklevel=2)
                return fallback() if callable(fallback) else fallback

        return probed

    return decorate
