"""The figures that the README and `--form`'s help quote are the benchmark tables' own.

The tables are written by the scripts that measure them (docs/results/forward/forward.json,
docs/results/decode.json, docs/results/encoder-decoders/decode.json); the README and the help quote their
ranges by hand. A table measured again with other figures fails here until the quotes follow it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from regionalize.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "results"

Ratio = Callable[[dict[str, Any]], float]


def _results(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if "models" in data:  # the forward benchmark's manifest run
        return [m["result"] for m in data["models"]]
    return data["results"]


def _sooner(key: str, form: str) -> Ratio:
    return lambda r: r[key]["full"] / r[key][form]


def _slower(key: str, form: str) -> Ratio:
    return lambda r: r[key][form] / r[key]["full"]


FORWARD = _results(DOCS / "forward" / "forward.json")
DECODERS = [r for r in _results(DOCS / "decode.json") if r["depth"] == 32]
ENCODER_DECODERS = {r["family"]: r for r in _results(DOCS / "encoder-decoders" / "decode.json")}

# (what the figure is, the runs it spans, the ratio, decimals)
FIGURES: list[tuple[str, list[dict[str, Any]], Ratio, int]] = [
    ("forward start, hierarchical", FORWARD, _sooner("compile_s", "regional"), 1),
    ("forward per call, hierarchical", FORWARD, _slower("steady_us", "regional"), 2),
    ("forward start, per-block", FORWARD, _sooner("compile_s", "per_block"), 1),
    ("forward per call, per-block", FORWARD, _slower("steady_us", "per_block"), 2),
    ("first token at 32 layers, hierarchical", DECODERS, _sooner("ttft_s", "regional"), 1),
    ("decode at 32 layers, hierarchical", DECODERS, _slower("decode_ms_per_token", "regional"), 2),
    ("first token at 32 layers, per-block", DECODERS, _sooner("ttft_s", "per_block"), 1),
    ("decode at 32 layers, per-block", DECODERS, _slower("decode_ms_per_token", "per_block"), 1),
]


def span(runs: Iterable[dict[str, Any]], ratio: Ratio, decimals: int) -> tuple[str, str]:
    values = [ratio(r) for r in runs]
    return f"{min(values):.{decimals}f}", f"{max(values):.{decimals}f}"


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize(("what", "runs", "ratio", "decimals"), FIGURES, ids=[f[0] for f in FIGURES])
def test_readme_quotes_the_table(what: str, runs: list[dict[str, Any]], ratio: Ratio, decimals: int) -> None:
    low, high = span(runs, ratio, decimals)
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert f"{low}x to {high}x" in readme, f"README: {what} is {low}x to {high}x in the table"


@pytest.mark.parametrize(("what", "runs", "ratio", "decimals"), FIGURES, ids=[f[0] for f in FIGURES])
def test_form_help_quotes_the_table(
    what: str, runs: list[dict[str, Any]], ratio: Ratio, decimals: int
) -> None:
    low, high = span(runs, ratio, decimals)
    forms = [p for command in main.commands.values() for p in command.params if p.name == "form"]
    assert forms, "no command takes --form"
    for form in forms:
        assert f"{low}-{high}x" in flat(form.help or ""), f"--form help: {what} is {low}-{high}x in the table"


@pytest.mark.parametrize("family", sorted(ENCODER_DECODERS))
def test_readme_quotes_the_encoder_decoders(family: str) -> None:
    run = ENCODER_DECODERS[family]
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    first = _sooner("ttft_s", "regional")(run)
    decode = _slower("decode_ms_per_token", "regional")(run)
    assert f"{first:.2f}x" in readme and f"{decode:.2f}x" in readme, (
        f"README: {family}'s first token {first:.2f}x as soon, decode {decode:.2f}x in the table"
    )


TORCH_VERSIONS = json.loads((DOCS / "torch-versions" / "versions.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("run", TORCH_VERSIONS, ids=[r["versions"]["torch"] for r in TORCH_VERSIONS])
def test_readme_quotes_the_table_of_each_torch(run: dict[str, Any]) -> None:
    results = list(run["models"].values())
    first = span(results, lambda r: r["full"]["first_s"] / r["regional"]["first_s"], 1)
    per = span(results, lambda r: r["regional"]["ms"] / r["full"]["ms"], 2)
    version = run["versions"]["torch"].split("+")[0]
    quote = f"{version}: first {first[0]}x to {first[1]}x sooner, per call {per[0]}x to {per[1]}x"
    assert quote in flat((ROOT / "README.md").read_text(encoding="utf-8")), f"README: {quote}"


def test_readme_quotes_the_stochastic_depth_table() -> None:
    """The README's row for blocks that differ in a float constant: each kind of start, and per call."""
    results = _results(DOCS / "forward" / "stochastic-depth.json")
    warm, cold, hot, per_call = (
        span(results, ratio, 2)
        for ratio in (
            _sooner("compile_s", "regional"),
            _sooner("compile_cold_s", "regional"),
            _sooner("compile_hot_s", "regional"),
            _slower("steady_us", "regional"),
        )
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if "stochastic" in line)
    quote = (
        f"{warm[0]}x to {warm[1]}x sooner; cold {cold[0]}x to {cold[1]}x; restarted {hot[0]}x to {hot[1]}x"
    )
    assert quote in row
    assert f"| {per_call[0]}x to {per_call[1]}x |" in row
