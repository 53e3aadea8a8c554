"""Reads and sets nn.Module's own attributes (hooks, compiled call, submodules) and a tensor's internals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import probe

Hooks = dict[int, Callable[..., Any]]  # a dict of hooks by their handles' ids


@probe("the checks for global hooks", "every call is taken as hooked")
def hook_dicts() -> tuple[Hooks, ...]:
    """Probe: returns nn.Module's global forward and backward hook dicts.

    Fallback None: every call counts as hooked, so none is served in a CUDA graph or past its guards."""
    module = torch.nn.modules.module
    names = ("forward_hooks", "forward_pre_hooks", "backward_hooks", "backward_pre_hooks")
    found = tuple(getattr(module, f"_global_{name}") for name in names)
    if not all(isinstance(hooks, dict) for hooks in found):
        raise TypeError("nn.Module's global hooks are not dicts")
    return found


def has_global_hooks(backward: bool = True) -> bool:
    """Returns whether a global module hook applies to a call, counting backward hooks unless told not to."""
    hooks = hook_dicts()
    return hooks is None or any(hooks[: 4 if backward else 2])


def module_hooks(module: nn.Module, backward: bool = True) -> tuple[Hooks, ...]:
    """Returns the hook dicts of `module` itself, with the backward ones unless `backward` is False."""
    hooks = (module._forward_hooks, module._forward_pre_hooks)
    return (*hooks, module._backward_hooks, module._backward_pre_hooks) if backward else hooks


def compiled_call(module: nn.Module) -> Callable[..., Any] | None:
    """Returns what `module.compile()` set the module's calls to run, or None."""
    return module._compiled_call_impl


def set_compiled_call(module: nn.Module, call: Callable[..., Any] | None) -> None:
    """Makes `module`'s calls run `call`, as `module.compile()` does; None undoes it."""
    module._compiled_call_impl = call


def base(tensor: torch.Tensor) -> torch.Tensor:
    """Returns the tensor whose memory `tensor` views, else `tensor` itself; Dynamo knows it as it traces."""
    return tensor if tensor._base is None else tensor._base


def write_count(tensor: torch.Tensor) -> int:
    """Returns how many times `tensor`'s memory was written in place (its version counter)."""
    return tensor._version


def module_frame(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Calls the module with its hooks, as the body of a frame that reads no global (`frames.py`)."""
    return self._call_impl(*args, **kwargs)  # type: ignore[no-untyped-call]  # untyped in torch


def submodules(module: nn.Module) -> dict[str, nn.Module | None]:
    """Returns `module`'s submodules by name, reading no global (`registered`)."""
    return module._modules


def module_call(module: nn.Module) -> Callable[..., Any]:
    """Returns `module`'s call as torch runs it uncompiled, with its hooks."""
    return module._call_impl
