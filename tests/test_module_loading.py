"""Models loaded every way Python loads code, compiled by the rewrite and by `compile_regions`: none raises
what the original does not, and each computes what the original does.

Dynamo reads a global of code it inlines through the module that code names, where the frame it compiles
has other globals: a module it cannot import by that name (loaded by `spec_from_file_location` or
`SourceFileLoader` and not registered, run by `runpy.run_path`, built by `exec`) failed the compile with a
`ModuleNotFoundError` where `model.compile()` ran it. The runtime's frames take the model's globals, and a
block Dynamo cannot inline from them is compiled on its own, or run eagerly (runtime/frames.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import runpy
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import regionalize
from regionalize.codemod import transform_source
from regionalize.runtime.internals import tracer
from regionalize.shared.options import Options

# Globals read in both forwards (a module, a constant, a function): what Dynamo must find by the module.
SOURCE = """
import torch
import torch.nn.functional as F
from torch import nn

SCALE = 0.5


def mix(x):
    return F.gelu(x) * SCALE


class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + mix(self.fc(self.norm(x)))


class Model(nn.Module):
    def __init__(self, d=8, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return F.normalize(x, dim=-1) * SCALE
"""

# The classes defined inside a function, which builds the model.
IN_FUNCTION = """
import torch.nn.functional as F
from torch import nn

SCALE = 0.5


def Model(d=8, n=3):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(d, d)

        def forward(self, x):
            return x + F.gelu(self.fc(x)) * SCALE

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block() for _ in range(n)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return F.normalize(x, dim=-1)

    return Model()
"""

_names = itertools.count()
Namespace = dict[str, Any]


def _spec(path: Path, name: str, given: Namespace | None = None) -> Namespace:
    """The module at `path`, loaded unregistered, with the names `given` (as a plugin system hands one
    module's classes to another) in its globals before it runs."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    vars(module).update(given or {})
    spec.loader.exec_module(module)  # not put in sys.modules, as plugin loaders leave it
    return vars(module)


def _source_file_loader(path: Path, name: str) -> Namespace:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = types.ModuleType(name)
    module.__file__ = str(path)
    loader.exec_module(module)
    return vars(module)


def _registered(path: Path, name: str) -> Namespace:
    sys.path.insert(0, str(path.parent))
    try:
        return vars(importlib.import_module(name))
    finally:
        sys.path.remove(str(path.parent))


def _run_path(path: Path, name: str) -> Namespace:
    return runpy.run_path(str(path))  # its module, `<run_path>`, gone once it returns


def _exec(path: Path, name: str) -> Namespace:
    namespace: Namespace = {"__name__": name}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def _exec_as_main(path: Path, name: str) -> Namespace:
    """Executed under the name of a module that `sys.modules` holds for other globals."""
    namespace: Namespace = {"__name__": "__main__"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def _exec_unnamed(path: Path, name: str) -> Namespace:
    namespace: Namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


LOADERS: dict[str, Callable[[Path, str], Namespace]] = {
    "registered": _registered,
    "spec": _spec,
    "source-file-loader": _source_file_loader,
    "run-path": _run_path,
    "exec": _exec,
    "exec-as-main": _exec_as_main,
    "exec-unnamed": _exec_unnamed,
}


def _write(tmp_path: Path, source: str) -> tuple[Path, str]:
    name = f"loaded_model_{next(_names)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path, name


def _rewritten(source: str) -> str:
    result = transform_source(source, Options())
    assert result.status == "success", result.reason
    return result.code


def _calls(model: torch.nn.Module, twin: torch.nn.Module) -> list[str]:
    """Run `model` against `twin` under no_grad (the owner whole) and with autograd (its blocks one by one),
    twice each; return the runtime's warnings."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for grad in (False, True, False, True):
            with torch.set_grad_enabled(grad):
                torch.testing.assert_close(model(x), twin(x))
    return [str(w.message) for w in caught if str(w.message).startswith("regionalize:")]


def _pair(namespace: Namespace, twin_namespace: Namespace) -> tuple[torch.nn.Module, torch.nn.Module]:
    model, twin = namespace["Model"]().eval(), twin_namespace["Model"]().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("route", ["rewrite", "compile_regions"])
def test_a_model_loaded_any_way_runs_compiled_and_computes_what_the_original_does(
    tmp_path: Path, loader: str, route: str
) -> None:
    path, name = _write(tmp_path, _rewritten(SOURCE) if route == "rewrite" else SOURCE)
    twin_path, twin_name = _write(tmp_path, SOURCE)
    model, twin = _pair(LOADERS[loader](path, name), _spec(twin_path, twin_name))
    if route == "compile_regions":
        regionalize.compile_regions(model)
    assert _calls(model, twin) == []  # compiled whole with no fallback: nothing to warn of
    state = model.__dict__["_regionalize_owner"]
    assert not state.report.plan.fallback, state.report.plan


@pytest.mark.parametrize("route", ["rewrite", "compile_regions"])
def test_classes_defined_inside_a_function_of_an_unregistered_module(tmp_path: Path, route: str) -> None:
    path, name = _write(tmp_path, _rewritten(IN_FUNCTION) if route == "rewrite" else IN_FUNCTION)
    twin_path, twin_name = _write(tmp_path, IN_FUNCTION)
    model, twin = _pair(_spec(path, name), _spec(twin_path, twin_name))
    if route == "compile_regions":
        regionalize.compile_regions(model)
    assert _calls(model, twin) == []


BLOCKS = SOURCE.split("class Model")[0]
HEAD = "import torch.nn.functional as F\nfrom torch import nn\n\nSCALE = 0.5\n\n\n"
OWNER = HEAD + "class Model" + SOURCE.split("class Model")[1]  # Block not defined: handed in


def _split(tmp_path: Path, blocks: str, owner: str, loader: Callable[[Path, str], Namespace]) -> Namespace:
    """The owner's module, loaded unregistered, its `Block` from another module loaded by `loader` (as a
    plugin system hands one module's classes to another)."""
    blocks_ns = loader(*_write(tmp_path, blocks))
    return _spec(*_write(tmp_path, owner), {"Block": blocks_ns["Block"]})


@pytest.mark.parametrize("loader", ["spec", "exec-as-main"])
@pytest.mark.parametrize("route", ["rewrite", "compile_regions"])
def test_blocks_of_a_module_dynamo_cannot_import_are_compiled_one_by_one(
    tmp_path: Path, loader: str, route: str
) -> None:
    """Where Dynamo imports an inlined function's module by name (torch 2.11 to 2.13), an owner whose blocks
    are defined in such a module takes the per-block form, each block's frame in its own globals; a torch
    that reads such globals itself compiles the owner whole."""
    owner = _rewritten(OWNER) if route == "rewrite" else OWNER
    namespace = _split(tmp_path, BLOCKS, owner, LOADERS[loader])
    model, twin = _pair(namespace, _split(tmp_path, BLOCKS, OWNER, _spec))
    if route == "compile_regions":
        regionalize.compile_regions(model)
    warned = _calls(model, twin)
    if not tracer.has_inlined_module_imports():
        assert warned == [] and not model.__dict__["_regionalize_owner"].report.plan.fallback
        return
    assert len(warned) == 1, warned
    assert "Model cannot be compiled whole (Block is defined in module" in warned[0]
    assert "which is not importable by that name); its blocks are compiled one by one instead" in warned[0]
    assert all(block._compiled_call_impl is not None for block in model.layers)


def _failing(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
    raise RuntimeError("this backend compiles nothing")


def test_a_compile_that_fails_for_the_owner_and_its_blocks_runs_the_original_eagerly(tmp_path: Path) -> None:
    """A compile error at the first call (here the backend's, on every graph): the owner falls back to its
    blocks one by one, whose frames fail before running anything too, so each runs eagerly, with a
    warning, never the compile's error."""
    model, twin = _pair(_spec(*_write(tmp_path, SOURCE)), _spec(*_write(tmp_path, SOURCE)))
    regionalize.compile_regions(model, backend=_failing)
    warned = _calls(model, twin)
    assert warned[-1].startswith("regionalize: Block cannot be compiled (BackendCompilerFailed"), warned
    assert warned[-1].endswith("it runs eagerly") and len(warned) <= 2, warned
    assert all(block._compiled_call_impl.compiled is None for block in model.layers)  # eager from now on


@pytest.mark.skipif(not tracer.has_inlined_module_imports(), reason="this torch reads such globals itself")
def test_a_dynamo_error_in_the_owner_and_its_blocks_runs_the_original_eagerly(tmp_path: Path) -> None:
    """Code the blocks call from a third module Dynamo cannot import: the owner fails to compile at its
    first call, and so does each block's frame; the model runs eagerly, warning of each, never raising."""
    helper = "import torch.nn.functional as F\n\n\ndef mix(x):\n    return F.gelu(x) * 0.5\n"
    mix = _spec(*_write(tmp_path, helper))["mix"]
    blocks = BLOCKS.replace("def mix(x):\n    return F.gelu(x) * SCALE\n", "")
    source = blocks + OWNER.split("SCALE = 0.5")[1]

    model, twin = _pair(
        _spec(*_write(tmp_path, _rewritten(source)), {"mix": mix}),
        _spec(*_write(tmp_path, source), {"mix": mix}),
    )
    warned = _calls(model, twin)
    assert len(warned) == 2, warned
    assert "Model cannot be compiled whole (InternalTorchDynamoError: ModuleNotFoundError" in warned[0]
    assert warned[1].startswith("regionalize: Block cannot be compiled (InternalTorchDynamoError")
    assert warned[1].endswith("it runs eagerly")


MAIN = """
import sys
import warnings

import torch

import regionalize

if __name__ == "__main__":
    warnings.simplefilter("error", UserWarning)  # a fallback's warning fails the run
    torch.manual_seed(0)
    model = Model().eval()
    twin = Model().eval()
    twin.load_state_dict(model.state_dict())
    if sys.argv[1] == "compile_regions":
        regionalize.compile_regions(model)
    x = torch.randn(2, 5, 8)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(model(x), twin(x))
    print("computed as the original")
"""


@pytest.mark.parametrize("route", ["rewrite", "compile_regions"])
def test_a_model_defined_in_the_script_run_as_main(tmp_path: Path, route: str) -> None:
    source = _rewritten(SOURCE) if route == "rewrite" else SOURCE
    script = tmp_path / "train.py"
    script.write_text(source + textwrap.dedent(MAIN))
    done = subprocess.run(
        [sys.executable, str(script), route], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "computed as the original" in done.stdout
