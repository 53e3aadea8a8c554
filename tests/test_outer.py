"""An owner of owners (runtime/outer.py): a module that holds stages, each the owner of its blocks, takes
their blocks and runs one compiled frame a call; where it cannot, the stages own their blocks again."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import regionalize


class Block(nn.Module):
    def __init__(self, d: int, rate: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.rate = rate  # a per-block float, as stochastic depth's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x)).tanh() * (1 - self.rate)


class Stage(nn.Module):
    def __init__(self, d: int, n: int, first: float, regional: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d, first + 0.01 * i) for i in range(n)])
        self.down = nn.Linear(d, 2 * d)
        if regional:
            regionalize.compile_region(*self.blocks, owner=self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.down(x)


class Stages(nn.Module):
    """Swin's shape: stages of growing width, the code between them the outer owner's."""

    def __init__(self, regional: bool = True, outer: bool = True) -> None:
        super().__init__()
        self.stages = nn.ModuleList([Stage(8 * 2**i, n, 0.1 * i, regional) for i, n in enumerate((2, 3, 2))])
        if regional and outer:
            regionalize.compile_region(*self.stages, owner=self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x).relu()
        return x


class Broken(Stages):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
            torch._dynamo.graph_break()  # the outer owner cannot be compiled whole, its stages can
        return x


class WithHead(Stages):
    """Stages and a block of its own, as a model with a repeated head."""

    def __init__(self, regional: bool = True, outer: bool = True) -> None:
        super().__init__(regional, outer)
        self.heads = nn.ModuleList([Block(64, 0.0) for _ in range(2)])
        if regional:
            regionalize.compile_region(*self.heads, owner=self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        for head in self.heads:
            x = head(x)
        return x


def owners(model: nn.Module) -> dict[str, int]:
    """Each module holding an owner's state, by name, with its number of blocks."""
    names = {id(m): name or "<model>" for name, m in model.named_modules()}
    return {
        names[id(m)]: len(m.__dict__["_regionalize_owner"].blocks)
        for m in model.modules()
        if "_regionalize_owner" in m.__dict__
    }


def twins(cls: type[Stages] = Stages, **kwargs: bool) -> tuple[nn.Module, nn.Module]:
    """The model as rewritten and as written, with the same weights."""
    torch.manual_seed(0)
    model = cls(**kwargs)
    torch.manual_seed(0)
    return model, cls(regional=False)


def test_an_owner_of_stages_takes_their_blocks_and_runs_one_frame() -> None:
    model, original = twins()
    assert owners(model) == {"<model>": 7}
    assert all(stage._compiled_call_impl is None for stage in model.stages)
    x = torch.randn(4, 8)
    counters.clear()
    with torch.no_grad():
        first, again = model(x), model(x)
    assert counters["stats"]["unique_graphs"] == 1  # one frame, not one a stage
    torch.testing.assert_close(first, original(x))
    torch.testing.assert_close(again, original(x))
    assert model.state_dict().keys() == original.state_dict().keys()


def test_gradients_are_the_originals() -> None:
    model, original = twins()
    x = torch.randn(4, 8)
    model(x).square().sum().backward()
    original(x).square().sum().backward()
    # Inductor's fused backward sums in another order than eager's, which follows the CPU's vector width.
    for (name, p), q in zip(model.named_parameters(), original.parameters(), strict=True):
        torch.testing.assert_close(
            p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda why, name=name: f"{name}: {why}"
        )


def test_an_owner_that_cannot_be_compiled_whole_gives_the_stages_back_with_one_warning() -> None:
    model, original = twins(Broken)
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        outputs = [model(x), model(x)]
    messages = [str(w.message) for w in caught if "regionalize" in str(w.message)]
    assert len(messages) == 1 and "Broken cannot be compiled whole" in messages[0], messages
    assert "its stages own their blocks instead" in messages[0]
    assert owners(model) == {"stages.0": 2, "stages.1": 3, "stages.2": 2}
    assert all(stage.__dict__["_regionalize_owner"].settled for stage in model.stages)  # each compiled whole
    for out in outputs:
        torch.testing.assert_close(out, Broken.forward(original, x))


class BrokenWithHead(WithHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = Broken.forward(self, x)
        for head in self.heads:
            x = head(x)
        return x


def test_its_own_blocks_are_compiled_one_by_one_when_it_gives_the_stages_back() -> None:
    model, original = twins(BrokenWithHead)
    x = torch.randn(4, 8)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        outputs = [model(x), model(x)]
    assert owners(model) == {"<model>": 2, "stages.0": 2, "stages.1": 3, "stages.2": 2}
    assert all(head._compiled_call_impl is not None for head in model.heads)  # compiled on its own
    for out in outputs:
        torch.testing.assert_close(out, BrokenWithHead.forward(original, x))


def test_an_owner_of_stages_keeps_blocks_of_its_own() -> None:
    model, original = twins(WithHead)
    assert owners(model) == {"<model>": 9}
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), original(x))


def test_a_stage_that_has_run_is_refused_and_every_stage_stays_an_owner() -> None:
    model, original = twins(outer=False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        model.stages[1](model.stages[0](x))  # stages 0 and 1 set up by their calls
        regionalize.compile_region(*model.stages, owner=model)
        assert owners(model) == {"stages.0": 2, "stages.1": 3, "stages.2": 2}
        torch.testing.assert_close(model(x), original(x))


def test_stages_with_other_options_are_not_taken() -> None:
    model, _ = twins(outer=False)
    regionalize.compile_region(*model.stages, owner=model, dynamic=False)
    assert owners(model) == {"stages.0": 2, "stages.1": 3, "stages.2": 2}


class Twin(nn.Module):
    """Two models of stages side by side: an owner of owners of owners."""

    def __init__(self, regional: bool = True) -> None:
        super().__init__()
        self.parts = nn.ModuleList([Stages(regional), Stages(regional)])
        if regional:
            regionalize.compile_region(*self.parts, owner=self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.parts[0](x) + self.parts[1](x)


def test_a_stage_of_stages_gives_all_its_blocks_to_the_outermost() -> None:
    torch.manual_seed(0)
    model = Twin()
    torch.manual_seed(0)
    original = Twin(regional=False)
    assert owners(model) == {"<model>": 14}
    x = torch.randn(4, 8)
    counters.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), original(x))
    assert counters["stats"]["unique_graphs"] == 1


class Heavy(Stages):
    """Stages beside work of its own, most of its parameters (a UNet block's resnets)."""

    def __init__(self, regional: bool = True, outer: bool = True) -> None:
        super().__init__(regional, outer)
        self.mix = nn.Linear(64, 64 * 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(super().forward(x))


def test_stages_beside_work_of_its_own_keep_their_blocks() -> None:
    model, original = twins(Heavy)
    assert owners(model) == {"<model>": 7}  # taken as the line runs, given back at the first call
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), original(x))
    assert owners(model) == {"stages.0": 2, "stages.1": 3, "stages.2": 2}
    assert model._compiled_call_impl is None  # the model runs eagerly, each stage compiled whole


class Holder(nn.Module):
    """Holds a stage and owns nothing: offered as a block, it is left as it is."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(x)


def test_a_module_holding_owners_is_not_made_a_region() -> None:
    top = nn.Sequential(Holder(Stage(8, 2, 0.0, True)), Holder(Stage(16, 2, 0.1, True)))
    regionalize.compile_region(*top, owner=top)
    assert owners(top) == {"0.stage": 2, "1.stage": 2}
    assert "_regionalize_region" not in Holder.__dict__  # its forward is no region


@pytest.mark.parametrize("how", ["copy", "pickle"])
def test_copies_and_pickles_run_eagerly_and_right(how: str) -> None:
    model, original = twins()
    x = torch.randn(4, 8)
    with torch.no_grad():
        model(x)
        twin = copy.deepcopy(model) if how == "copy" else pickle.loads(pickle.dumps(model))
        torch.testing.assert_close(twin(x), original(x))


def test_compile_regions_makes_the_holder_of_stages_their_owner() -> None:
    torch.manual_seed(0)
    model = Stages(regional=False)
    twin = copy.deepcopy(model)
    regionalize.compile_regions(model)
    assert owners(model) == {"<model>": 7}
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
