"""The guard-bypass code as the codemod writes it into a model file, run with torch: never a wrong result."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_support import needs_reuse  # noqa: E402

from regionalize.codemod import transform_source  # noqa: E402
from regionalize.runtime.nested import has_region_reuse  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402

MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, offset):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.5)
        self.offset = offset

    def forward(self, x, scale=1.0):
        return self.drop(torch.relu(self.linear(x))) * scale + self.offset


class Model(nn.Module):
    def __init__(self, dim=8, depth=4):
        super().__init__()
        self.layers = nn.ModuleList([Block(dim, i) for i in range(depth)])

    def forward(self, x, scale=1.0):
        for layer in self.layers:
            x = layer(x, scale=scale)
        return x
"""


def build(
    mode: str, backend: str = "aot_eager", form: str = "per-block", source: str = MODEL
) -> torch.nn.Module:
    """The model rewritten with `mode` ("none": no bypass) in `form`, loaded with fixed weights."""
    code = transform_source(source, Options(guard_bypass=mode, backend=backend, form=form)).code
    if form == "per-block":
        # `filter` hands the API's guard filter to each block's compile, `depyf` compiles it through the API.
        written = {"filter": "regionalize.guard_filter}", "depyf": "regionalize.compile_direct("}
        assert any(call in code for call in written.values()) == (mode != "none")
    else:
        assert (f'guard_bypass="{mode}"' in code) == (mode != "none")
    module = ModuleType(f"bypass_{mode}_{form}_{abs(hash(source))}")
    sys.modules[module.__name__] = module  # as an import would: Dynamo looks decorators' modules up
    exec(compile(code, module.__name__, "exec"), module.__dict__)
    torch.manual_seed(0)
    return module.Model()


def run(model: torch.nn.Module, x: torch.Tensor, **kwargs: float) -> torch.Tensor:
    torch.manual_seed(1234)  # dropout draws the same mask in both models
    return model(x, **kwargs)


@pytest.mark.parametrize("form", ["per-block", "hierarchical"])
@pytest.mark.parametrize("mode", ["filter", "depyf"])
def test_bypass_matches_guarded_across_shape_mode_and_grad_changes(mode: str, form: str) -> None:
    torch._dynamo.reset()
    guarded, bypass = build("none", form=form), build(mode, form=form)
    bypass.load_state_dict(guarded.state_dict())
    assert list(bypass.state_dict()) == list(guarded.state_dict())
    x, wide = torch.randn(2, 8), torch.randn(5, 8)
    steps = [
        ("eval", False, x, 1.0),
        ("eval", False, x, 1.0),
        ("eval", False, wide, 1.0),
        ("eval", False, x, 2.0),
        ("train", False, x, 1.0),
        ("train", True, x, 1.0),
        ("eval", True, wide, 1.0),
        ("eval", False, x, 1.0),
    ]
    for training, grad, inputs, scale in steps:
        for model in (guarded, bypass):
            model.train(training == "train")
            model.zero_grad()
        with torch.set_grad_enabled(grad):
            expected, actual = run(guarded, inputs, scale=scale), run(bypass, inputs, scale=scale)
        torch.testing.assert_close(
            actual, expected, msg=f"{mode}: {training}, grad={grad}, {tuple(inputs.shape)}"
        )
        if grad:
            expected.sum().backward()
            actual.sum().backward()
            for (name, a), b in zip(bypass.named_parameters(), guarded.parameters(), strict=True):
                torch.testing.assert_close(a.grad, b.grad, msg=f"{mode}: gradient of {name}")


def direct_table(block: torch.nn.Module) -> dict:
    """The dispatcher's table of directly callable compiled code."""
    return block._compiled_call_impl.direct


def test_dispatcher_calls_compiled_code_directly_and_respects_hooks() -> None:
    torch._dynamo.reset()
    model = build("depyf").eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        model(x)
        model(x)
    assert all(len(direct_table(layer)) == 1 for layer in model.layers)

    seen = []
    model.layers[0].register_forward_hook(lambda module, args, output: seen.append(output.shape))
    with torch.no_grad():
        model(x)
    assert seen == [torch.Size([2, 8])]  # a hooked block takes the guarded path, which runs hooks


def test_a_key_whose_compiled_code_is_not_found_keeps_the_guarded_path_and_is_searched_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch._dynamo.reset()
    searched = []

    def no_entries(code: Any) -> list:  # as torch 2.11 has them for a function without a source file
        searched.append(code)
        return []

    monkeypatch.setattr(torch._C._dynamo.eval_frame, "_debug_get_cache_entry_list", no_entries)
    # The installed runtime, which the import form calls, keeps the reader it found first.
    from regionalize.runtime.internals import tracer

    tracer.cache_entries.cache_clear()
    try:
        guarded, bypass = build("none").eval(), build("depyf").eval()
        bypass.load_state_dict(guarded.state_dict())
        x = torch.randn(2, 8)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(bypass(x), guarded(x))
            torch.testing.assert_close(bypass(x[:1]), guarded(x[:1]))
    finally:
        tracer.cache_entries.cache_clear()
    assert len(searched) == 2 * len(bypass.layers)  # once per block and key, not once per call


def owner_table(model: torch.nn.Module) -> dict:
    """The dispatcher's table of the owner's frame (hierarchical form), behind the runtime's owner call."""
    return model._compiled_call_impl.args[1].direct


@needs_reuse
def test_dispatcher_on_the_owner_frame_follows_hooks_as_the_guarded_frame_does() -> None:
    """A hook removed after the first calls no longer runs. One registered then runs as it would on the
    guarded frame: there not at all, since torch's default `skip_nnmodule_hook_guards` compiles no guard
    on hooks added to submodules, as for a full `model.compile()`."""
    counts = {}
    for mode in ("none", "depyf"):
        torch._dynamo.reset()
        model = build(mode, form="hierarchical").eval()
        x = torch.randn(2, 8)
        # Counted in tensors: a hook appending to a list would make Dynamo guard on its length.
        early, late = torch.zeros(()), torch.zeros(())

        def count_early(*_: object, counter: torch.Tensor = early) -> None:
            counter.add_(1)

        def count_late(*_: object, counter: torch.Tensor = late) -> None:
            counter.add_(1)

        handle = model.layers[1].register_forward_hook(count_early)
        with torch.no_grad():
            for _ in range(3):
                model(x)
            if mode == "depyf":
                assert len(owner_table(model)) == 1  # served directly from the second call
            handle.remove()
            model(x)
            assert early.item() == 3, mode  # a compiled frame that still called it would be wrong
            model.layers[2].register_forward_pre_hook(count_late)
            model(x)
            model(x)
        counts[mode] = (early.item(), late.item())
    assert counts["depyf"] == counts["none"]


EMBEDDED = MODEL.replace(
    "self.layers = nn.ModuleList", "self.embed = nn.Embedding(10, dim)\n        self.layers = nn.ModuleList"
).replace("        for layer in self.layers:", "        x = self.embed(x)\n        for layer in self.layers:")


def test_dispatcher_on_the_owner_frame_follows_a_change_of_dtype() -> None:
    torch._dynamo.reset()
    guarded, bypass = (build(m, "inductor", "hierarchical", EMBEDDED).eval() for m in ("none", "depyf"))
    bypass.load_state_dict(guarded.state_dict())
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(bypass(ids), guarded(ids))
        guarded.double(), bypass.double()  # the token ids, and so the dispatch key, stay as they were
        expected = guarded(ids)
        assert expected.dtype == torch.float64
        torch.testing.assert_close(bypass(ids), expected)
        torch.testing.assert_close(bypass(ids), expected)


def test_bypass_with_inductor() -> None:
    torch._dynamo.reset()
    guarded, bypass = build("none", "inductor").eval(), build("depyf", "inductor").eval()
    bypass.load_state_dict(guarded.state_dict())
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(bypass(x), guarded(x))


def test_codemod_and_bypass_templates_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import regionalize.cli, regionalize.codemod, regionalize.codemod.patterns.emit\n"
        "from regionalize.codemod import transform_source\n"
        "from regionalize.shared.options import Options\n"
        "src = 'import torch.nn as nn\\nlayers = nn.ModuleList([B() for _ in range(4)])\\n'\n"
        "print(transform_source(src, Options(guard_bypass='depyf')).status)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "success"


class Scaled(nn.Module):
    def __init__(self, dim: int, rate: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.rate * torch.relu(self.linear(x))


class ScaledStack(nn.Module):
    def __init__(self, rates: tuple[float, ...]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Scaled(8, rate) for rate in rates)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(
    "form, rates, backend",
    [
        ("whole", (0.5,) * 4, "inductor"),
        ("whole, in pieces", (0.0, 0.1, 0.2, 0.3), "inductor"),  # blocks differing in a constant
        ("per block", (0.5,) * 4, "eager"),
    ],
)
def test_the_guard_filter_handed_in_serves_the_owner_in_each_form(
    form: str, rates: tuple[float, ...], backend: str
) -> None:
    """A guard filter handed in the options (as `--guard-bypass filter` writes it) filters the guards of
    the frames the owner compiles, whatever its form, and the caller's options keep it: torch.compile pops
    it from the dict it is handed, which left later compiles without it."""
    import regionalize

    seen: list[int] = []

    def counting(entries: list[Any]) -> list[bool]:
        seen.append(len(entries))
        return regionalize.guard_filter(entries)

    options = {"guard_filter_fn": counting}
    torch.manual_seed(0)
    model, x = ScaledStack(rates).eval(), torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x)
        regionalize.compile_regions(model, saved=False, backend=backend, options=options)
        out = [model(x) for _ in range(2)]
    # Where torch reuses no traced region (2.11), an owner of alike blocks is compiled in pieces too.
    expected_form = "whole, in pieces" if form == "whole" and not has_region_reuse() else form
    assert model.__dict__["_regionalize_owner"].report.plan.form.name == expected_form
    assert seen, "the filter was not called"
    assert all(torch.allclose(o, expected, atol=1e-5) for o in out)
    assert options == {"guard_filter_fn": counting}
