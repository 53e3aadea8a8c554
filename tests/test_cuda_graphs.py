"""`--mode reduce-overhead`: the helper written into the model file, run as users run it.

On CPU every call takes the guarded path (blocks compiled regionally, no CUDA graphs). The routing of the
graphed path is tested on CPU by treating CPU tensors as CUDA ones, which runs the owner's hierarchical
compile without CUDA graphs (Inductor skips them for CPU tensors, and the helper warns once); the
CUDA tests run where there is a GPU.
"""

from __future__ import annotations

import itertools
import types
import warnings
from types import ModuleType
from typing import Any

import pytest
import torch

from regionalize.codemod import transform_source
from regionalize.options import Options

SOURCE = """
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x).tanh()


class Model(nn.Module):
    def __init__(self, d=16, n=10):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x, settings=None):
        for block in self.blocks:
            x = block(x)
        return x * settings.scale if settings is not None else x
"""
_names = itertools.count()


def load(source: str) -> ModuleType:
    """A fresh module each time: the helper marks the block class, which must not leak between tests."""
    module = ModuleType(f"reduce_overhead_{next(_names)}")
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    return module


def build(device: str = "cpu", source: str = SOURCE) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The rewritten model and the original with the same weights."""
    rewritten = transform_source(source, Options(mode="reduce-overhead"))
    assert rewritten.status == "success" and "_regionalize_cuda_graphs(block, self" in rewritten.code
    torch.manual_seed(0)
    model = load(rewritten.code).Model().to(device).eval()
    twin = load(source).Model().to(device).eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def graphed_spy(model: torch.nn.Module) -> list[int]:
    """Count the calls that reach the owner's compiled (graphed) function, through the helper's closure."""
    call = model._compiled_call_impl
    cell = call.__closure__[call.__code__.co_freevars.index("graphed")]
    inner, calls = cell.cell_contents, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return inner(*args, **kwargs)

    cell.cell_contents = counted
    return calls


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors report `is_cuda`, so the helper routes calls to the graphed path."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def test_cpu_calls_take_the_guarded_path_and_match_eager() -> None:
    model, twin = build()
    calls = graphed_spy(model)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    torch.testing.assert_close(model(x), twin(x))  # grad enabled
    assert calls == []
    assert all(block._compiled_call_impl is not None for block in model.blocks)


def test_graphed_path_copies_outputs_so_kept_ones_stay_valid(fake_cuda: None) -> None:
    model, twin = build()
    calls = graphed_spy(model)
    inputs = [torch.randn(2, 16) for _ in range(3)]
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = [model(x) for x in inputs]
        expected = [twin(x) for x in inputs]
    assert len(calls) == 3
    for got, want in zip(kept, expected, strict=True):
        torch.testing.assert_close(got, want)
    # CPU tensors cannot be captured: one warning, and the calls still run compiled and right.
    skipped = [w for w in caught if "CUDA graphs skipped" in str(w.message)]
    assert len(skipped) == 1


@pytest.mark.parametrize("case", ["grad", "hook", "object argument", "no tensor"])
def test_calls_the_graph_cannot_serve_take_the_guarded_path(fake_cuda: None, case: str) -> None:
    model, twin = build()
    calls = graphed_spy(model)
    x = torch.randn(2, 16)
    if case == "hook":
        model.register_forward_hook(lambda mod, args, out: out * 2)
        twin.register_forward_hook(lambda mod, args, out: out * 2)
    args: tuple[Any, ...] = (x,)
    if case == "object argument":
        args = (x, types.SimpleNamespace(scale=0.5))
    elif case == "no tensor":
        args = (x.tolist(),)  # the blocks get a list: both models raise the same error
    grad = case == "grad"
    with torch.set_grad_enabled(grad):
        if case == "no tensor":
            for m in (model, twin):
                with pytest.raises(TypeError):
                    m(*args)
        else:
            torch.testing.assert_close(model(*args), twin(*args))
    assert calls == []


def test_a_block_with_a_graph_break_falls_back_to_regional_with_one_warning(fake_cuda: None) -> None:
    # A graph break inside a nested compile region is an error in Dynamo: the owner cannot be compiled
    # whole. The block compiled on its own still can (graph break and all).
    source = SOURCE.replace(
        "return x + self.fc(x).tanh()", "return x + torch.compiler.disable(torch.tanh)(self.fc(x))"
    )
    model, twin = build(source=source.replace("import torch.nn", "import torch\nimport torch.nn"))
    calls = graphed_spy(model)
    x = torch.randn(2, 16)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(model(x), twin(x))
    assert len(calls) == 1  # tried once, then never again
    messages = [str(w.message) for w in caught if "regionalize" in str(w.message)]
    assert len(messages) == 1 and "not compiled whole" in messages[0]
    assert caught[0].filename == __file__  # the warning points at the caller's line


def test_without_nested_compile_regions_blocks_are_compiled_regionally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch.compiler, "nested_compile_region")
    model, twin = build()
    assert model._compiled_call_impl is None  # the owner is left as written
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))


def test_state_dict_keys_are_unchanged() -> None:
    model, twin = build()
    assert list(model.state_dict()) == list(twin.state_dict())


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"style": "wrap"}, "needs --style inplace"), ({"guard_bypass": "depyf"}, "drop --guard-bypass")],
)
def test_cuda_graph_modes_refuse_what_they_cannot_do(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Options(mode="reduce-overhead", **settings)


def test_second_pass_changes_nothing() -> None:
    once = transform_source(SOURCE, Options(mode="reduce-overhead")).code
    again = transform_source(once, Options(mode="reduce-overhead"))
    assert again.status == "skip" and again.code == once


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_kept_outputs_are_right_and_no_fallback() -> None:
    model, twin = build("cuda")
    calls = graphed_spy(model)
    inputs = [torch.randn(4, 8, 16, device="cuda") for _ in range(6)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped CUDA graph warns: here it must not
        kept = [model(x) for x in inputs]
        for got, x in zip(kept, inputs, strict=True):
            torch.testing.assert_close(got, twin(x))
    assert len(calls) == len(inputs)


@cuda
@pytest.mark.parametrize("change", ["to dtype", "assign state_dict"])
def test_cuda_replaced_parameters_are_used(change: str) -> None:
    model, twin = build("cuda")
    x = torch.randn(4, 8, 16, device="cuda")
    with torch.no_grad():
        model(x)
        model(x)  # recorded and replayed
        if change == "to dtype":
            model.to(torch.float64)
            twin.to(torch.float64)
            x = x.double()
        else:
            state = {k: torch.randn_like(v) for k, v in twin.state_dict().items()}
            model.load_state_dict(state, assign=True)
            twin.load_state_dict(state)
        for _ in range(3):
            torch.testing.assert_close(model(x), twin(x))
