"""The public API keeps serving what earlier releases wrote. tests/frozen/vX.Y.Z/ holds the import form's
outputs of fixtures as that release wrote them, never regenerated: each is run against the current
runtime and must compute what the same source computes with the calls standing for nothing (eager).

A release that changes what the codemod writes adds a folder of its own; the old folders stay.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from regionalize.shared import helpers

FROZEN = Path(__file__).resolve().parent / "frozen"
Build = Callable[[dict], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]]


class _Layer(nn.Module):
    """What fixtures that compile blocks on their own name `Layer`, imported from elsewhere."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x).tanh()


def _through(blocks: str) -> Callable[[nn.Module], torch.Tensor]:
    def call(model: nn.Module) -> torch.Tensor:
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
        for block in getattr(model, blocks):
            x = block(x)
        return x

    return call


def _called(*shape: int, **kwargs: object) -> Callable[[nn.Module], torch.Tensor]:
    return lambda model: model(torch.randn(*shape, generator=torch.Generator().manual_seed(1)), **kwargs)


_CONFIG = types.SimpleNamespace(hidden_size=8, num_hidden_layers=3, _attn_implementation="sdpa")
# Each frozen file: how to build its model from the file's namespace, and how to call it.
CASES: dict[str, Build] = {
    "comprehension": lambda ns: (ns["Encoder"](8, 3), _called(2, 8)),
    "recipe": lambda ns: (ns["Model"](3, 16), _called(4, 16)),
    "guard_bypass_owner": lambda ns: (ns["Model"](8, 3), _called(2, 8)),
    "reduce_overhead": lambda ns: (ns["Model"](8, 3), _called(2, 8)),
    "attention_class_table": lambda ns: (ns["Model"](_CONFIG), _called(2, 8)),
    "guard_bypass_depyf": lambda ns: (ns["Model"](8, 3), _through("layers")),
    "guard_bypass_wrap": lambda ns: (ns["Model"](8, 3), _through("layers")),
}
FILES = sorted(FROZEN.glob("v*/*.py"))


def _eager() -> types.SimpleNamespace:
    """The public names standing for nothing: the model as its source reads without regionalize."""
    return types.SimpleNamespace(
        compile_region=lambda *blocks, owner, **kwargs: None,
        compile_direct=lambda block, **kwargs: None,
        eager=lambda call: call(),
        symbolic_ints=lambda forward: forward,
        guard_filter=lambda entries: [True for _ in entries],
    )


def _load(path: Path, regionalize: object | None) -> types.ModuleType:
    """The file as a module of its own (Dynamo reads a frame's module), importing regionalize or, given
    `regionalize`, with that in its place."""
    source = path.read_text(encoding="utf-8")
    kind = "eager" if regionalize is not None else "compiled"
    name = f"frozen_{path.parent.name}_{path.stem}_{kind}".replace(".", "_")
    module = types.ModuleType(name)
    module.__file__, module.Layer = str(path), _Layer
    if regionalize is not None:
        source = source.replace("import regionalize\n", "", 1)
        module.regionalize = regionalize
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def test_every_frozen_file_has_a_case() -> None:
    assert FILES and {path.stem for path in FILES} <= set(CASES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_frozen_rewrite_runs_on_the_current_runtime(path: Path) -> None:
    torch.manual_seed(0)
    model, call = CASES[path.stem](vars(_load(path, None)))
    torch.manual_seed(0)
    reference, _ = CASES[path.stem](vars(_load(path, _eager())))
    assert model.state_dict().keys() == reference.state_dict().keys()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = call(reference)
        for _ in range(2):  # the compiling call, then one served by what it compiled
            torch.testing.assert_close(call(model), expected)
    fallbacks = [str(w.message) for w in caught if "cannot be compiled whole" in str(w.message)]
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("public", sorted(helpers.PUBLIC.values()))
def test_every_name_the_codemod_writes_is_served_by_the_api_and_the_vendored_copy(public: str) -> None:
    """The import form calls `regionalize.<name>`; a vendored copy binds the runtime package under that
    name, so its `__init__.py` must export each too."""
    import regionalize
    import regionalize.runtime

    assert callable(getattr(regionalize, public, None))
    assert public in regionalize.runtime.__all__ and callable(getattr(regionalize.runtime, public))


def test_the_package_lists_the_runtimes_public_names() -> None:
    """`regionalize/__init__.py` lists the public names without importing torch; the runtime's list is
    api.py's, and the two agree."""
    import regionalize
    import regionalize.runtime
    from regionalize.runtime import api

    assert regionalize.__all__ == regionalize.runtime.__all__ == api.__all__


def test_the_codemod_and_the_runtime_name_the_same_cuda_graph_modes() -> None:
    """The codemod compiles a block with no owner without CUDA graphs (their graphs would overwrite each
    other's outputs), and the runtime drops them from blocks it compiles one by one: one rule, written on
    each side of the line the runtime cannot import across (it needs torch alone, the codemod no torch)."""
    from regionalize.runtime.per_block import graph_modes
    from regionalize.shared.options import CUDA_GRAPH_MODES

    assert set(graph_modes) == set(CUDA_GRAPH_MODES)
