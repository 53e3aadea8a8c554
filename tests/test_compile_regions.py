"""`regionalize.compile_regions(model)`: the rewrite's forms applied at run time to a built model whose
source is not changed. Which modules it takes for blocks and owners, and that the model computes what it
did, keys unchanged, on a small stack and on transformers' Llama generating."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import regionalize


class Block(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x)).tanh()


class Other(Block):
    pass


class Stack(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.layers = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Stage(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Stages(nn.Module):
    """Swin-style: stages of blocks, the stages repeated too. The innermost level is made regions."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList([Stage(), Stage(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class Resnet(Block):
    """A class a model leaves out of its declared blocks: in a UNet, built at a width a level."""


class Attention(Block):
    pass


class Holder(nn.Module):
    """diffusers' `Transformer2DModel` in a UNet: one declared block in its container."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Attention()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Denoiser(nn.Module):
    """A UNet level: resnets beside holders of the declared blocks."""

    _repeated_blocks = ("Attention",)

    def __init__(self) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([Resnet() for _ in range(2)])
        self.attentions = nn.ModuleList([Holder() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet, attention in zip(self.resnets, self.attentions, strict=True):
            x = attention(resnet(x))
        return x


class Tower(nn.Module):
    """Declares its stages: the blocks inside them are compiled, the resnets beside them are not."""

    _repeated_blocks = ("Stage",)

    def __init__(self) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([Resnet() for _ in range(2)])
        self.stages = nn.ModuleList([Stage(2), Stage(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet, stage in zip(self.resnets, self.stages, strict=True):
            x = stage(resnet(x))
        return x


def owners(model: nn.Module) -> dict[str, list[str]]:
    """Each owner the call set up, by name, with its blocks' names."""
    names = {id(m): name or "<model>" for name, m in model.named_modules()}
    return {
        names[id(m)]: [names[id(b)] for b in m.__dict__["_regionalize_owner"].blocks]
        for m in model.modules()
        if "_regionalize_owner" in m.__dict__
    }


def test_the_blocks_of_a_container_get_its_holder_as_owner() -> None:
    model = Stack()
    assert regionalize.compile_regions(model) is model
    assert owners(model) == {"<model>": [f"layers.{i}" for i in range(4)]}


def test_the_innermost_level_is_made_regions_and_the_stages_holder_owns_them() -> None:
    blocks = ["stages.0.blocks.0", "stages.0.blocks.1", "stages.0.blocks.2", "stages.1.blocks.0"]
    assert owners(regionalize.compile_regions(Stages())) == {"<model>": [*blocks, "stages.1.blocks.1"]}


def test_leaves_one_of_a_kind_and_a_bare_sequential() -> None:
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))  # leaves: nothing to stamp out
    assert owners(regionalize.compile_regions(mlp)) == {}
    mixed = nn.Sequential(Block(), Other(), Block())  # one Other: not repeated
    assert owners(regionalize.compile_regions(mixed)) == {"<model>": ["0", "2"]}


@pytest.mark.parametrize(
    ("model", "declared"),
    [
        (Denoiser(), {"attentions.0": ["attentions.0.blocks.0"], "attentions.1": ["attentions.1.blocks.0"]}),
        (
            Tower(),
            {
                "stages.0": ["stages.0.blocks.0", "stages.0.blocks.1"],
                "stages.1": ["stages.1.blocks.0", "stages.1.blocks.1"],
            },
        ),
    ],
)
def test_where_the_model_declares_its_blocks_only_those_are_compiled(
    model: nn.Module, declared: dict[str, list[str]]
) -> None:
    """diffusers' `_repeated_blocks`, as its own helper and the codemod (RGZ111) read it: a declared class
    is a block even alone in its container, repeated blocks inside one are too, and a class left out (the
    resnets, two of one class) is not compiled. At the first call the model gives its holders back their
    blocks: the resnets are work of its own (runtime/outer.py)."""
    twin = copy.deepcopy(model)
    regionalize.compile_regions(model)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert owners(model) == declared
    touched = [
        name
        for name, m in model.named_modules()
        if any(k.startswith("_") and "regionalize" in k for k in vars(m))
    ]
    assert not [name for name in touched if name.startswith("resnets")]


@pytest.mark.parametrize(
    "model", [Stack(), Stages(), nn.Sequential(Block(), Block(), Block()), Denoiser(), Tower()]
)
def test_outputs_gradients_and_keys_are_the_originals(model: nn.Module) -> None:
    twin = copy.deepcopy(model)
    keys = list(model.state_dict())
    regionalize.compile_regions(model)
    assert list(model.state_dict()) == keys
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x), twin(x))
    model(x).sum().backward()
    twin(x).sum().backward()
    # Inductor's fused backward sums in another order than eager's, and the order follows the CPU's
    # vector width: through four blocks, some CPUs differ by more than float32's default tolerance.
    for (name, got), want in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(
            got.grad, want.grad, atol=1e-4, rtol=1e-4, msg=lambda why, name=name: f"{name}: {why}"
        )


def test_a_transformers_decoder_generates_the_originals_tokens() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    twin = copy.deepcopy(model)
    regionalize.compile_regions(model)
    state = model.model.__dict__["_regionalize_owner"]
    # Each layer's attention holds its `layer_idx`: the layers' cache is stood in for.
    assert [attribute for _, attribute in state.indexed] == ["layer_idx"] * 3
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
        want = twin.generate(ids, max_new_tokens=6, do_sample=False)
    assert got.tolist() == want.tolist()
    assert state.report.plan.form.name != "per block"


def test_describe_gives_each_owners_form_as_a_record() -> None:
    """`regionalize.describe`: the form each owner runs in, why, and whether it was saved, as records."""
    from regionalize.runtime.describe import OwnerReport

    model = regionalize.compile_regions(Stack(), saved=False)
    with torch.no_grad():
        model(torch.randn(3, 8))
    [report] = regionalize.describe(model)
    whole = "whole" if report.reason is None else "whole, in pieces"  # torch 2.11 reuses no traced region
    assert (report.owner, report.form, report.fallback, report.saved) == ("Stack", whole, False, None)
    eager = regionalize.compile_regions(Stack(), backend="eager")  # regions cannot be differentiated
    with torch.no_grad():
        eager(torch.randn(3, 8))
    assert regionalize.describe(eager) == [
        OwnerReport(
            owner="Stack",
            form="per block",
            reason="the eager backend cannot differentiate nested regions",
            fallback=True,
            pieces=None,
            static_calls=False,
            prompt_calls=False,
            layer_by_layer=None,
            saved="not saved: not called whole",
        )
    ]


def test_describe_says_where_calls_with_autograd_ran_per_block() -> None:
    """A training call runs the owner per block (owner.py says why); its record and verify's text say so."""
    from regionalize.bench.accounting import served_forms
    from regionalize.bench.served import GRAD

    model = regionalize.compile_regions(Stack(), saved=False)
    with torch.no_grad():
        model(torch.randn(3, 8))
    [report] = regionalize.describe(model)
    assert not report.grad_calls and GRAD not in served_forms(model)["Stack"]
    model(torch.randn(3, 8)).sum().backward()
    [report] = regionalize.describe(model)
    assert report.grad_calls and served_forms(model)["Stack"].endswith(f"; {GRAD}")
