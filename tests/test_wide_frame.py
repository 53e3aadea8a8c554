"""The module that holds an owner (a language model's head around its decoder stack) compiled in one frame
with it, where it adds little: one compiled call, not an eager forward around the owner's."""

from __future__ import annotations

import itertools
import sys
import warnings
from types import ModuleType
from typing import Any

import torch

from regionalize.codemod import transform_source
from regionalize.options import Options
from regionalize.verify.accounting import served_forms

SOURCE = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + self.fc(self.norm(x)).tanh()


class Stack(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Model(nn.Module):
    def __init__(self, d=16, n=6):
        super().__init__()
        self.stack = Stack(d, n)
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        return HEAD
"""
HEAD = "self.head(self.stack(x))"
_names = itertools.count()
GRAPHS: list[torch.fx.GraphModule] = []


@torch._dynamo.register_backend
def regionalize_test_wide(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """The eager backend, keeping each graph Dynamo hands it."""
    GRAPHS.append(gm)
    return gm.forward


def load(source: str) -> ModuleType:
    module = ModuleType(f"wide_frame_{next(_names)}")
    sys.modules[module.__name__] = module
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    return module


def build(head: str = HEAD, extra: str = "", **settings: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The rewritten model and the original with the same weights; `extra` adds lines to `Model.__init__`."""
    source = SOURCE.replace("HEAD", head).replace(
        "        self.head = nn.Linear(d, 4)\n", f"        self.head = nn.Linear(d, 4)\n{extra}"
    )
    options = Options(**{"backend": "regionalize_test_wide", **settings})
    rewritten = transform_source(source, options)
    assert "_regionalize_blocks(block, self" in rewritten.code
    torch.manual_seed(0)
    model = load(rewritten.code).Model().eval()
    twin = load(source).Model().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def placeholders(graph: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in graph.graph.nodes if n.op == "placeholder"]


def test_a_thin_holder_is_compiled_in_one_frame_with_its_owner() -> None:
    GRAPHS.clear()
    model, twin = build()
    x = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), twin(x))
    assert len(GRAPHS) == 1  # one frame, compiled once
    (graph,) = GRAPHS
    assert any("head" in name for name in placeholders(graph))  # the head inside it
    regions = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(regions) == len(model.stack.blocks) and len({n.args[0].target for n in regions}) == 1
    assert served_forms(model) == {"Stack": "whole with Model"}


def test_a_holder_with_more_outside_its_owner_than_a_block_holds_stays_eager() -> None:
    GRAPHS.clear()
    extra = "        self.extra = nn.Sequential(*[nn.Linear(d, d) for _ in range(3)])\n"
    model, twin = build(head="self.head(self.extra(self.stack(x)))", extra=extra)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert model._compiled_call_impl is None  # decided on its first call, eager since
    (graph,) = GRAPHS
    assert not any("head" in name or "extra" in name for name in placeholders(graph))  # the owner's frame
    assert served_forms(model) == {"Stack": "whole"}


def test_a_holder_of_two_owners_stays_eager() -> None:
    extra = "        self.other = Stack(d, 2)\n"
    model, twin = build(head="self.head(self.other(self.stack(x)))", extra=extra)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert model._compiled_call_impl is None
    assert served_forms(model) == {"Stack": "whole"}


def test_a_holder_that_cannot_be_compiled_leaves_the_owner_its_frame_without_a_warning() -> None:
    GRAPHS.clear()
    model, twin = build(head="self.head(torch.compiler.disable(torch.relu)(self.stack(x)))")
    x = torch.randn(2, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            torch.testing.assert_close(model(x), twin(x))
    assert model._compiled_call_impl is None
    (graph,) = GRAPHS  # the owner's, compiled after the holder's failed
    assert not any("head" in name for name in placeholders(graph))
    (form,) = served_forms(model).values()
    assert form.startswith("whole (not with Model (") and "marked as skipped" in form


def test_with_autograd_the_holder_runs_eagerly_and_the_blocks_per_block() -> None:
    model, twin = build(backend="aot_eager")
    x = torch.randn(2, 16)
    model(x).sum().backward()
    twin(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert all(block._compiled_call_impl is not None for block in model.stack.blocks)


class ShiftedNorm(torch.nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1


def test_a_submodule_replaced_after_the_first_call_compiles_the_holders_frame_again() -> None:
    """An adapter put on one layer, its parameters named as before: torch 2.13's guards of the frame
    would not notice it in a stamped-out block, which would run the traced one's function."""
    GRAPHS.clear()
    model, twin = build()
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
        for net in (model, twin):
            net.stack.blocks[2].norm = ShiftedNorm(16)
        torch.testing.assert_close(model(x), twin(x))
    assert len(GRAPHS) == 2 and served_forms(model) == {"Stack": "whole with Model"}


def test_each_copy_of_the_runtime_adopts_only_its_own_owners() -> None:
    """A process may hold several copies (packages, lone files), each with its hook on every assignment:
    a holder takes the call of the copy that set up its owner, whose regions read that copy's flags."""
    first, _ = build()
    second, twin = build()
    for model in (first, second):
        call = model._compiled_call_impl
        assert call.func.__globals__ is sys.modules[type(model).__module__].__dict__
    with torch.no_grad():
        x = torch.randn(2, 16)
        torch.testing.assert_close(second(x), twin(x))
    assert served_forms(second) == {"Stack": "whole with Model"}


def test_cuda_graph_modes_keep_the_owners_frame() -> None:
    model, twin = build(mode="reduce-overhead")
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert model._compiled_call_impl is None
