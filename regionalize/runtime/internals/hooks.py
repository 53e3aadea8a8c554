"""nn.Module's own attributes that the runtime reads and sets: its hooks, its compiled call, its
submodules; and a tensor's base and version counter."""

import torch

from . import probe


@probe("the checks for global hooks", "every call is taken as hooked")
def hook_dicts():
    """Probe: nn.Module's global forward and backward hooks (each a dict). Fallback None: every call is
    taken as hooked, so none is served in a CUDA graph or called past its guards."""
    module = torch.nn.modules.module
    names = ("forward_hooks", "forward_pre_hooks", "backward_hooks", "backward_pre_hooks")
    found = tuple(getattr(module, f"_global_{name}") for name in names)
    if not all(isinstance(hooks, dict) for hooks in found):
        raise TypeError("nn.Module's global hooks are not dicts")
    return found


def global_hooks(backward=True):
    """Does any global module hook apply to a call: forward ones, and backward ones unless `backward` is
    False?"""
    hooks = hook_dicts()
    return hooks is None or any(hooks[: 4 if backward else 2])


def module_hooks(module, backward=True):
    """The hook dicts of `module` itself: forward ones, and backward ones unless `backward` is False."""
    hooks = (module._forward_hooks, module._forward_pre_hooks)
    return (*hooks, module._backward_hooks, module._backward_pre_hooks) if backward else hooks


def compiled_call(module):
    """What `module.compile()` set the module's calls to run (torch's `_compiled_call_impl`), or None."""
    return module._compiled_call_impl


def set_compiled_call(module, call):
    """Make `module`'s calls run `call`, as `module.compile()` does; None undoes it."""
    module._compiled_call_impl = call


def base(tensor):
    """The tensor whose memory `tensor` views (`_base`), else `tensor`: Dynamo knows it as it traces."""
    return tensor if tensor._base is None else tensor._base


def writes(tensor):
    """How many times `tensor`'s memory was written in place (its version counter)."""
    return tensor._version


def module_frame(self, *args, **kwargs):
    """The body of a module's compiled frame: its call, hooks and all, as `module.compile()` compiles. It
    reads no global: its copies take the globals of the model's code (`frames.py`)."""
    return self._call_impl(*args, **kwargs)


def submodules(module):
    """`module`'s submodules by name (`_modules`); reads no global (`registered`)."""
    return module._modules


def module_call(module):
    """`module`'s call as torch runs it uncompiled, hooks and all (`_call_impl`)."""
    return module._call_impl
