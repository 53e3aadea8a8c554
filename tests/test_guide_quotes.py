"""Figures the guides quote by hand from a results file, checked against that file: a table measured again
with other figures fails here until the guide follows it (as tests/test_quoted_figures.py does for the
README's rendered section and `--form`'s help)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def cuda_gpt() -> dict[str, dict[str, Any]]:
    rows = results("cuda.json")["results"]
    return {r["variant"]: r for r in rows if r["model"] == "gpt" and r["batch"] == 1}


def library(model: str) -> dict[str, Any]:
    return next(r for r in results("libraries.json")["results"] if r["model"] == model)


def cuda_quotes() -> list[tuple[str, str]]:
    rows = cuda_gpt()
    ours, full = rows["hierarchical_cuda_graphs"], rows["full_reduce_overhead"]
    ms, full_ms = ours["ms_per_call"]["median"], full["ms_per_call"]["median"]
    first, full_first = ours["first_call_s"], full["first_call_s"]
    per_call = f"{ms:.2f} ms per call against {full_ms:.2f} ms"
    return [
        ("cuda-graphs.md", f"{per_call} ({ms / full_ms:.2f}x)"),
        ("cuda-graphs.md", f"{first:.1f} s against {full_first:.1f} s, {full_first / first:.1f}x sooner"),
        ("form-cuda-graphs.md", per_call),
        ("compile-forms.md", f"{ms / full_ms:.2f}x full `reduce-overhead` per call"),
    ]


def library_quotes() -> list[tuple[str, str]]:
    unet, swin = library("unet"), library("swin")
    regions = unet["full"]["first_s"] / unet["compile_regions"]["first_s"]
    first = swin["full"]["first_s"] / swin["regionalize"]["first_s"]
    per_call = swin["regionalize"]["per_call_ms"] / swin["full"]["per_call_ms"]
    return [
        ("api.md", f"with the declaration read, {regions:.1f}x sooner"),
        (
            "patterns.md",
            f"starts {first:.2f}x sooner than a full compile and takes {per_call:.2f}x its time per call",
        ),
    ]


QUOTES = cuda_quotes() + library_quotes()


def prose(page: str) -> str:
    """The page's text with its glossary links read as their words, and its lines joined."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.sub(r"\s+", " ", re.sub(r"\[([^\]]*)\]\(glossary\.md#[\w-]+\)", r"\1", text))


@pytest.mark.parametrize(("page", "quote"), QUOTES, ids=[f"{page}: {quote[:30]}" for page, quote in QUOTES])
def test_the_guide_quotes_its_results_file(page: str, quote: str) -> None:
    assert quote in prose(page), f"docs/{page} should say {quote!r}, as its results file gives it now"


def test_a_quote_that_drifted_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A results file measured again (here: the CUDA-graph form a tenth slower a call) no longer matches."""
    data = results("cuda.json")
    for row in data["results"]:
        if row["variant"] == "hierarchical_cuda_graphs":
            row["ms_per_call"]["median"] *= 1.1
    monkeypatch.setitem(
        globals(),
        "results",
        lambda name: (
            data if name == "cuda.json" else json.loads((RESULTS / name).read_text(encoding="utf-8"))
        ),
    )
    page, quote = cuda_quotes()[0]
    assert quote not in prose(page)
