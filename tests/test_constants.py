"""Blocks that differ by a per-layer float (stochastic depth: a drop-path rate spaced over depth, the first
block's an `Identity`): the owner is traced whole and compiled in pieces, a piece per distinct block, rather
than a region traced for every block; with another backend the blocks are compiled one by one, the float
made symbolic by Dynamo. Outputs and, in training, gradients are eager's, each block drawing at its rate."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import regionalize
from regionalize.bench.accounting import recording, served_forms
from regionalize.runtime.constants import differing_constants
from regionalize.runtime.internals.compiler import inductor_pieces


class DropPath(nn.Module):
    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        return x * x.new_empty((x.shape[0], 1, 1)).bernoulli_(keep) / keep


class Block(nn.Module):
    def __init__(self, dim: int, drop_path: float, scale: float = 1.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)
        self.scale = scale  # read as a constant of the graph: blocks that differ in it compute differently
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop_path(self.fc(self.norm(x)).tanh() * self.scale)


class Encoder(nn.Module):
    def __init__(self, depth: int = 8, rate: float = 0.2, scales: list[float] | None = None) -> None:
        super().__init__()
        rates = [rate * i / (depth - 1) for i in range(depth)]
        scales = scales or [1.0] * depth
        self.blocks = nn.ModuleList([Block(16, rates[i], scales[i]) for i in range(depth)])
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_which_blocks_differ_in_their_floats() -> None:
    model = Encoder()
    why = differing_constants(list(model.blocks))
    assert why is not None and "drop_path.drop_prob" in why and "8 sets of values" in why
    assert differing_constants(list(Encoder(rate=0.0).blocks)) is None  # one set: one region
    alternating = Encoder(rate=0.0, scales=[1.0, 0.5] * 4)
    assert differing_constants(list(alternating.blocks)) is None  # two sets: a region each
    for i, block in enumerate(alternating.blocks):
        block.layer_idx = i  # integers are the layer indexes the stand-ins serve
    assert differing_constants(list(alternating.blocks)) is None


@pytest.mark.skipif(inductor_pieces() is None, reason="this torch cannot compile in pieces")
def test_an_owner_whose_blocks_differ_in_a_rate_is_compiled_in_pieces_each_distinct_block_once() -> None:
    torch.manual_seed(0)
    model = Encoder(scales=[1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]).eval()
    original, x = copy.deepcopy(model), torch.randn(2, 4, 16)
    regionalize.compile_regions(model)
    with torch.no_grad(), recording() as account:
        out = model(x)
        torch.testing.assert_close(out, original(x))
    form = served_forms(model)["Encoder"]
    assert form.startswith("whole, in pieces (9 a call, ") and "differ in float attributes" in form, form
    # A block per scale, and the head run as traced: in eval the rates only pick the branch that returns x.
    assert "2 compiled in all, 1 run as traced" in form
    assert not account.regions_traced and not account.fell_back_to_eager
    assert model.state_dict().keys() == original.state_dict().keys()


def test_with_another_backend_the_blocks_are_compiled_one_by_one_their_rates_symbolic() -> None:
    torch.manual_seed(0)
    model = Encoder(depth=12).eval()
    original, x = copy.deepcopy(model), torch.randn(2, 4, 16)
    regionalize.compile_regions(model, backend="aot_eager")
    with torch.no_grad(), recording() as account:
        torch.testing.assert_close(model(x), original(x))
    assert served_forms(model)["Encoder"].startswith("per block, its blocks differ in float attributes")
    # The Identity block, the first rate, then every rate symbolic: not a compile a block.
    assert account.frames <= 3 and not account.fell_back_to_eager


def test_in_training_each_block_drops_at_its_own_rate_as_eager_does() -> None:
    torch.manual_seed(0)
    model = Encoder(depth=12, rate=0.5).train()
    original, x = copy.deepcopy(model), torch.randn(64, 4, 16)
    regionalize.compile_regions(model, backend="aot_eager")
    results = []
    for module in (original, model):
        torch.manual_seed(1)
        out = module(x)
        out.square().mean().backward()
        results.append((out, [p.grad for p in module.parameters()]))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    assert served_forms(model)["Encoder"].startswith("per block")
