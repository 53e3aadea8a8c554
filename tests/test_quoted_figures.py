"""The figures that the README and `--form`'s help quote are the benchmark tables' own.

The tables are written by the scripts that measure them (docs/results/**/*.json). The README's "What to
expect", docs/benchmarks.md and the restart picture (docs/results/restart.svg) are rendered from those
files (scripts/docs_figures.py, written by scripts/render_docs.py) and must be what they render now;
the help quotes its ranges by hand and must hold the files' figures. A table measured again fails here
until the quotes follow it; and each quoted file must be the latest run of the page the README links, so
that a figure never comes from another run than its page shows.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from regionalize.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_figures
import render_docs

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
def test_form_help_quotes_the_table(
    what: str, runs: list[dict[str, Any]], ratio: Ratio, decimals: int
) -> None:
    low, high = span(runs, ratio, decimals)
    forms = [p for command in main.commands.values() for p in command.params if p.name == "form"]
    assert forms, "no command takes --form"
    for form in forms:
        assert f"{low}-{high}x" in flat(form.help or ""), f"--form help: {what} is {low}-{high}x in the table"


# -- the README's "What to expect" ----------------------------------------------------------------------


def readme_block(text: str) -> str:
    return render_docs.block(text, "figures")[1]


def test_readme_what_to_expect_is_rendered_from_the_results() -> None:
    """Every figure of the section, as the results files give it now (`python scripts/render_docs.py`
    writes it again)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_block(text) == docs_figures.what_to_expect(), "README: run python scripts/render_docs.py"


def test_benchmarks_page_is_rendered_from_the_results() -> None:
    """docs/benchmarks.md holds every row, the README one row a family: both rendered, none typed."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    shown = render_docs.block(text, "figures")[1]
    assert shown == docs_figures.benchmarks(), "docs/benchmarks.md: run python scripts/render_docs.py"
    rows = docs_figures.table()
    assert all(row.render("results/") in shown for row in rows)
    readme = readme_block((ROOT / "README.md").read_text(encoding="utf-8"))
    families = [row for row in rows if row.family]
    assert 1 <= len(families) <= 5 and len({row.family for row in families}) == len(families)
    assert readme.count("\n| ") == len(families) + 1  # the header and a row a family
    assert "(docs/results/restart.svg)" in readme and "(results/restart.svg)" in shown


def test_restart_picture_is_drawn_from_restart_json() -> None:
    """docs/results/restart.svg is what the renderer draws from restart.json now, a line a mode in each of
    its two panels (empty caches, restarted), and its title says the figures it draws."""
    picture = docs_figures.PICTURE.read_text(encoding="utf-8")
    assert picture == docs_figures.restart_svg(), "docs/results/restart.svg: python scripts/render_docs.py"
    lines = [points for points in docs_figures._restart_seconds().values() if points]
    assert lines, "restart.json: no first call of a drawn mode"
    assert picture.count("<polyline points=") == len(docs_figures.PANELS) + len(lines)  # axes, lines
    for points in lines:
        deepest = f"{points[-1][1]:.1f} s"
        assert deepest in docs_figures.restart_alt() and f">{deepest}</text>" in picture


def test_the_picture_follows_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """restart.json measured again draws another picture, which `render_docs.py --check` then reports."""
    data = json.loads((DOCS / "restart.json").read_text(encoding="utf-8"))
    data["summary"][next(key for key in data["summary"] if key.endswith(" full cold"))]["first_call_s"] *= 2
    monkeypatch.setattr(
        docs_figures.Source,
        "data",
        lambda self: (
            data
            if self is docs_figures.RESTART
            else json.loads((DOCS / self.json).read_text(encoding="utf-8"))
        ),
    )
    assert docs_figures.restart_svg() != docs_figures.PICTURE.read_text(encoding="utf-8")
    assert render_docs.rendered(docs_figures.PICTURE) != render_docs.current(docs_figures.PICTURE)


def test_form_caches_generation_figures_are_rendered_from_decode_json() -> None:
    """The guide's account of the generation benchmark is decode.json's latest run, rendered."""
    text = (ROOT / "docs" / "form-caches.md").read_text(encoding="utf-8")
    shown = render_docs.block(text, "decode-figures")[1]
    assert shown == docs_figures.decode_section(), "form-caches.md: run python scripts/render_docs.py"


def test_form_cuda_graphs_serving_figures_are_rendered_from_serving_json() -> None:
    text = (ROOT / "docs" / "form-cuda-graphs.md").read_text(encoding="utf-8")
    shown = render_docs.block(text, "serving-figures")[1]
    assert shown == docs_figures.serving_section(), "form-cuda-graphs.md: run python scripts/render_docs.py"


def test_a_drifted_figure_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: the README with its first figure changed, or a results file changed
    under it, no longer matches."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rendered = docs_figures.what_to_expect()
    first = re.search(r"\d+\.\d+x", rendered.split("|---|", 1)[1])
    assert first is not None
    drifted = rendered.replace(first[0], "9.99x", 1)
    assert readme_block(render_docs.with_block(text, "figures", drifted)) != docs_figures.what_to_expect()
    gpt = json.loads((DOCS / "forward" / "forward.json").read_text(encoding="utf-8"))
    gpt["models"][0]["result"]["compile_s"]["regional"] *= 2
    monkeypatch.setattr(
        docs_figures.Source,
        "data",
        lambda self: (
            gpt
            if self is docs_figures.FORWARD
            else json.loads((DOCS / self.json).read_text(encoding="utf-8"))
        ),
    )
    assert docs_figures.what_to_expect() != readme_block(text)


@pytest.mark.parametrize("source", docs_figures.SOURCES, ids=[s.label for s in docs_figures.SOURCES])
def test_each_quoted_run_is_the_one_its_page_shows(source: docs_figures.Source) -> None:
    """The page the README links names the same run as the file quoted: its date (each date where a
    page joins sittings) and runtime."""
    page = (DOCS / source.page).read_text(encoding="utf-8")
    data = source.data()
    dates = {r["date"] for r in data} if isinstance(data, list) else {source.stamp()[0]}
    for date in dates - {""}:
        if not date.startswith("torch "):  # cuda.json records no date
            assert date in page, f"{source.page} shows no run of {date} ({source.json})"
    runtime = source.stamp()[1]
    if runtime and not isinstance(data, list):
        assert re.search(rf"runtime {runtime}\b", page), (
            f"{source.page} was not measured with runtime {runtime}"
        )


@pytest.mark.parametrize(
    ("source", "render"),
    [
        (docs_figures.DECODE, lambda data: bench_decode().markdown(data["meta"], data["results"])),
        (docs_figures.STATIC, lambda data: bench_decode().markdown(data["meta"], data["results"])),
        (
            docs_figures.SERVING,
            lambda data: serving_report().markdown(data["meta"], data["results"], data["token_check"]),
        ),
    ],
    ids=["decode", "static", "serving"],
)
def test_the_page_is_its_file_rendered(source: docs_figures.Source, render: Any) -> None:
    """Where the script that measured a page renders it again from its file, the page is exactly that:
    the README and the page quote one run (serving.md's rows are each variant's latest run, which
    serving.json keeps; serving-run9.json is an earlier run's file, quoted by neither)."""
    assert render(source.data()) == (DOCS / source.page).read_text(encoding="utf-8")


def bench_decode() -> Any:
    import bench_decode

    return bench_decode


def serving_report() -> Any:
    from serving import report

    return report
