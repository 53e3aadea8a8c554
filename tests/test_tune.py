"""`regionalize tune`: graphs counted per compiled block class on a real compile (the eager backend, for
speed), the settings derived from them, and written into pyproject.toml by `--write`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from regionalize.bench.loading import resolve_target
from regionalize.bench.tune import tune
from regionalize.cli import main
from regionalize.shared.options import Options

# Same: four blocks of one width, one graph. Stage: a block at a new width per stage, a graph each.
# Mixer: left out by the model's declaration (RGZ111), four blocks of one width.
MODEL = """
import torch
import torch.nn as nn


class Same(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stage(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim * 2)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Mixer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x) + x


class PreTrained(nn.Module):
    _no_split_modules = ["Same", "Stage"]


class Net(PreTrained):
    def __init__(self, dim=4, depth=4):
        super().__init__()
        self.same = nn.ModuleList([Same(dim) for _ in range(depth)])
        self.stages = nn.ModuleList([Stage(dim * 2**i) for i in range(3)])
        self.mixers = nn.ModuleList([Mixer(dim * 8) for _ in range(depth)])

    def forward(self, x):
        for block in self.same:
            x = block(x)
        for stage in self.stages:
            x = stage(x)
        for mixer in self.mixers:
            x = mixer(x)
        return x


def make():
    return Net().eval(), (torch.randn(2, 4),)
"""


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(MODEL))
    return path


def test_tune_sets_never_for_unshared_and_always_for_left_out_but_shared(model_file: Path) -> None:
    target = resolve_target(str(model_file), "make")
    tuning = tune(target, "make", Options(backend="eager"), "cpu", time_it=False)
    assert tuning.never == ["Stage"]
    assert tuning.always == ["Mixer"]
    assert (tuning.classes["Same"].blocks, tuning.classes["Same"].graphs) == (4, 1)
    assert (tuning.classes["Stage"].blocks, tuning.classes["Stage"].graphs) == (3, 3)
    assert tuning.classes["Mixer"].shared
    assert tuning.settings() == '[tool.regionalize]\nnever = ["Stage"]\nalways = ["Mixer"]\n'


def test_tune_write_then_nothing_left_to_change(model_file: Path) -> None:
    pyproject = model_file.parent / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.regionalize]\nbackend = "eager"  # fast\n')
    runner = CliRunner()
    args = ["tune", str(model_file), "--factory", "make", "--no-timing", "-q", "--device", "cpu"]
    first = runner.invoke(main, [*args, "--write"])
    assert first.exit_code == 1, first.output
    assert 'never = ["Stage"]' in first.output
    assert pyproject.read_text() == (
        '[project]\nname = "x"\n\n[tool.regionalize]\nbackend = "eager"  # fast\n'
        'never = ["Stage"]\nalways = ["Mixer"]\n'
    )
    second = runner.invoke(main, args)
    assert second.exit_code == 0, second.output
    assert "nothing to change" in second.output


def test_tune_bad_factory_is_one_error_line(model_file: Path) -> None:
    result = CliRunner().invoke(main, ["tune", str(model_file), "--factory", "nowhere", "-q", "--no-timing"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ")


# Every block reads a float of its own (a stochastic-depth rate, as Swin's layers do): a graph per block,
# more blocks than torch's recompile limit of 8.
RATES = """
import torch
import torch.nn as nn


class Layer(nn.Module):
    def __init__(self, dim, rate):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.rate = rate

    def forward(self, x):
        return self.fc(x) * (1.0 - self.rate)


class Net(nn.Module):
    def __init__(self, dim=4, depth=10):
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim, i / 100) for i in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def make():
    return Net().eval(), (torch.randn(2, 4),)
"""


def test_a_float_per_block_is_shared_through_automatic_dynamic_shapes(tmp_path: Path) -> None:
    """Blocks of one width keep torch's automatic dynamic shapes in the probe, as in the rewrite: the
    second rate compiles the float symbolic, and the other blocks share that graph."""
    path = tmp_path / "rates.py"
    path.write_text(textwrap.dedent(RATES))
    tuning = tune(resolve_target(str(path), "make"), "make", Options(backend="eager"), "cpu", time_it=False)
    assert (tuning.classes["Layer"].blocks, tuning.classes["Layer"].graphs) == (10, 2)
    assert tuning.never == []


WIDTHS = RATES.replace("Layer(dim, i / 100)", "Layer(dim + i, 0.0)").replace(
    "nn.Linear(dim, dim)", "nn.Linear(dim, dim + 1)"
)


def test_a_class_at_many_widths_is_counted_past_the_recompile_limit(tmp_path: Path) -> None:
    """Ten blocks of one class, each at its own width (4 -> 5 -> ... -> 14): static shapes, as the runtime
    compiles such blocks (no symbolic compile of a width, the compile that kept Inductor in sympy on Swin),
    and a graph each, past torch's limit of 8."""
    path = tmp_path / "widths.py"
    path.write_text(textwrap.dedent(WIDTHS))
    tuning = tune(resolve_target(str(path), "make"), "make", Options(backend="eager"), "cpu", time_it=False)
    assert (tuning.classes["Layer"].blocks, tuning.classes["Layer"].graphs) == (10, 10)
    assert tuning.never == ["Layer"]


# Both block classes' forwards wrapped by one function their base class installs, as transformers'
# GradientCheckpointingLayer does on every decoder layer: Dynamo compiles the wrapper's code for each.
WRAPPED = (
    MODEL.replace(
        "class Same(nn.Module):",
        """class Checkpointing(nn.Module):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        inner = cls.__dict__.get("forward")
        if inner is not None:

            @functools.wraps(inner)
            def forward(self, *args, **kwargs):
                return inner(self, *args, **kwargs)

            cls.forward = forward


class Same(Checkpointing):""",
    )
    .replace("class Stage(nn.Module):", "class Stage(Checkpointing):")
    .replace("import torch\n", "import functools\n\nimport torch\n", 1)
)


def test_classes_whose_forward_one_wrapper_compiles_are_told_apart(tmp_path: Path) -> None:
    """Each graph goes to the block running when Dynamo made it, not to the code it compiled."""
    path = tmp_path / "wrapped.py"
    path.write_text(textwrap.dedent(WRAPPED))
    tuning = tune(resolve_target(str(path), "make"), "make", Options(backend="eager"), "cpu", time_it=False)
    assert (tuning.classes["Same"].blocks, tuning.classes["Same"].graphs) == (4, 1)
    assert (tuning.classes["Stage"].blocks, tuning.classes["Stage"].graphs) == (3, 3)
    assert tuning.never == ["Stage"]


def test_no_class_judged_is_not_called_shared() -> None:
    """A probe in which no compiled block made a graph says so instead of calling the classes shared."""
    from regionalize.bench.tune import ClassGraphs, Tuning, render

    assert "no compiled class could be judged" in render(Tuning(Options()))
    judged = Tuning(Options(), classes={"Layer": ClassGraphs(blocks=4, graphs=1)})
    assert "every compiled class shares its graphs" in render(judged)
