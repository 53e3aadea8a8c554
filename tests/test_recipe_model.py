"""The recipe's layer stack, imported before and after the rewrite and run with torch on CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

from regionalize.codemod import transform_source  # noqa: E402

RECIPE = Path(__file__).resolve().parent.parent / "fixtures" / "recipe.in.py"


def load(path: Path, name: str) -> ModuleType:
    """The file imported as module `name`, registered as an import does: Dynamo reads the globals of a
    function it traces through its module's name, here the model's, called from the runtime's."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_rewritten_recipe_is_equivalent_and_compiles_one_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Graphs are counted: a frame an earlier run saved would load with none compiled.
    monkeypatch.setenv("REGIONALIZE_SAVED_OWNERS", "0")
    rewritten = tmp_path / "recipe_rewritten.py"
    rewritten.write_text(transform_source(RECIPE.read_text(encoding="utf-8")).code, encoding="utf-8")
    original_module, rewritten_module = load(RECIPE, "recipe_original"), load(rewritten, "recipe_rewritten")

    torch.manual_seed(0)
    original, (x,) = original_module.build(depth=12, dim=16)
    regional, _ = rewritten_module.build(depth=12, dim=16)
    assert list(regional.state_dict()) == list(original.state_dict())
    regional.load_state_dict(original.state_dict(), strict=True)

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        expected, actual = original(x), regional(x)
        again = regional(x * 2)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(again, original(x * 2))
    # Twelve layers, one graph: every layer reuses the first layer's compiled code.
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
    # Compiled in place: the layers are still plain `Layer`s, not OptimizedModule wrappers.
    assert all(type(layer) is rewritten_module.Layer for layer in regional.layers)
