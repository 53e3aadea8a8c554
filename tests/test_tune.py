"""`regionalize tune`: graphs counted per compiled block class on a real compile (the eager backend, for
speed), the settings derived from them, and written into pyproject.toml by `--write`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from regionalize.cli import main
from regionalize.options import Options
from regionalize.verify.loading import resolve_target
from regionalize.verify.tune import tune

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
