"""Figures the guides quote inside their prose, checked against the results files that hold them
(scripts/docs_quotes.py): a table measured again with other figures fails here until the guide follows
it, and a figure that a guide types with no source fails here too (as tests/test_quoted_figures.py does
for the README's rendered section and `--form`'s help)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_quotes

ROOT = docs_quotes.ROOT
QUOTES = docs_quotes.quotes()


def page_text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def quotes_of(page: Path) -> list[str]:
    return [q.text for q in QUOTES if q.path == page]


def where(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("quote", QUOTES, ids=[f"{where(q.path)}: {q.name}" for q in QUOTES])
def test_the_guide_quotes_its_results_file(quote: docs_quotes.Quote) -> None:
    assert (docs_quotes.RESULTS / quote.source).exists(), quote.source
    said = docs_quotes.prose(page_text(quote.path))
    assert quote.text in said, f"{where(quote.path)} should say {quote.text!r}, as {quote.source} has it now"


SOURCES = sorted({q.source for q in QUOTES if q.source.endswith(".json")})


@pytest.mark.parametrize("source", SOURCES)
def test_each_quoted_file_is_the_run_its_page_shows(source: str) -> None:
    """A quoted results file is the run the page beside it shows (the page its script wrote from it):
    every date and runtime the file records is on that page, so a quote never comes from another run
    than the one a reader following the link sees."""
    page = (docs_quotes.RESULTS / source).with_suffix(".md")
    text = page_text(page)
    dates, runtimes = docs_quotes.stamps(docs_quotes.results(source))
    assert [d for d in dates if d not in text] == [], f"{page.name} shows no run of those dates"
    assert [n for n in runtimes if not re.search(rf"runtime {n}\b", text)] == [], f"{page.name}: runtimes"


def test_a_file_of_another_run_fails() -> None:
    """The check above can fail: a file whose run is dated other than its page's."""
    data = docs_quotes.results("decode-static.json")
    data["meta"]["date"], data["meta"]["runtime"] = "2026-01-01", 99
    dates, runtimes = docs_quotes.stamps(data)
    text = page_text(docs_quotes.RESULTS / "decode-static.md")
    assert "2026-01-01" in dates and "2026-01-01" not in text
    assert 99 in runtimes and "runtime 99" not in text


@pytest.mark.parametrize("page", docs_quotes.pages(), ids=where)
def test_every_figure_of_the_prose_has_a_source(page: Path) -> None:
    """A ratio, a time or a share in a page's prose is rendered or quoted from a results file; anything
    else is a figure typed by hand, which no run can correct."""
    loose = docs_quotes.unchecked(page_text(page), quotes_of(page))
    assert not loose, (
        f"{page.relative_to(ROOT)} gives figures no results file holds (quote them through "
        f"scripts/docs_quotes.py, or say what they mean without them): {loose}"
    )


def test_a_quote_that_drifted_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A results file measured again (here: the CUDA-graph form a tenth slower a call) no longer matches
    the page, and the page's old figure is then one with no source."""
    data = docs_quotes.results("cuda.json")
    for row in data["results"]:
        if row["variant"] == "hierarchical_cuda_graphs":
            row["ms_per_call"]["median"] *= 1.1
    real = docs_quotes.results

    def measured_again(name: str) -> Any:
        return data if name == "cuda.json" else real(name)

    monkeypatch.setattr(docs_quotes, "results", measured_again)
    quote = docs_quotes.cuda_quotes()[0]
    assert quote.text not in docs_quotes.prose(page_text(quote.path))
    assert docs_quotes.unchecked(page_text(quote.path), [q.text for q in docs_quotes.cuda_quotes()])


def test_a_figure_typed_by_hand_fails() -> None:
    """A guide's quoted figure edited by hand, or a figure added without a source, is found."""
    quote = next(q for q in QUOTES if q.page == "form-hierarchical.md")
    page = quote.path
    text = page_text(page)
    first = docs_quotes.FIGURE.search(quote.text)
    assert first is not None
    edited = quote.text.replace(first[0], "9.99x", 1)
    drifted = docs_quotes.prose(text).replace(quote.text, edited)
    assert any("9.99x" in loose for loose in docs_quotes.unchecked(drifted, quotes_of(page)))
    added = text + "\nThe first call came 2.5x sooner on a laptop.\n"
    assert any("2.5x" in loose for loose in docs_quotes.unchecked(added, quotes_of(page)))


def test_the_codes_and_results_pages_are_checked_too() -> None:
    """Every site code's page is checked, and so is a results sub-folder's page no run wrote (the serving
    folder's README); a page a run wrote is that run's figures, which the quotes read."""
    checked = set(docs_quotes.pages())
    assert set(docs_quotes.CODES.glob("*.md")) <= checked
    assert docs_quotes.RESULTS / "serving" / "README.md" in checked
    assert docs_quotes.RESULTS / docs_quotes.CALL_PROFILE not in checked
    assert docs_quotes.RESULTS / "serving" / "serving.md" not in checked


def test_a_run_is_told_by_its_header(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A run\n\nMeasured by `python scripts/x.py` on 2026-12-02: 2 CPU cores.\n\n1.5x\n")
    assert docs_quotes.measured(page)
    page.write_text("# Notes\n\nThis folder holds a run's page.\n\nOn 2026-12-02 it took 1.5x.\n")
    assert not docs_quotes.measured(page)


def test_a_codes_page_with_a_stale_figure_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """RGZ006 quoting the call profile's earlier run (1.32x and 1.20x) is found: its quote is no longer
    said, and the old figures have no source; the profile measured again, the page no longer matches."""
    page = docs_quotes.CODES / "RGZ006.md"
    quote = next(q for q in QUOTES if q.path == page and q.source == docs_quotes.CALL_PROFILE)
    old = iter(["1.32x", "1.20x"])
    stale = docs_quotes.FIGURE.sub(lambda _: next(old), quote.text)
    said = docs_quotes.prose(page_text(page)).replace(quote.text, stale)
    assert quote.text not in said
    loose = docs_quotes.unchecked(said, quotes_of(page))
    assert any("1.32x" in f for f in loose) and any("1.20x" in f for f in loose)
    real = docs_quotes.table

    def measured_again(name: str) -> dict[str, dict[str, str]]:
        rows = real(name)
        if name == docs_quotes.CALL_PROFILE:
            rows["default"] = {**rows["default"], "against full": "1.40x"}
        return rows

    monkeypatch.setattr(docs_quotes, "table", measured_again)
    assert docs_quotes.codes_quotes()[0].text not in docs_quotes.prose(page_text(page))


def test_code_and_rendered_blocks_are_not_prose() -> None:
    text = (
        "Run `verify [ 31.5s]`.\n\n```console\n$ regionalize verify\nfull 13.76 s\n```\n\n"
        "<!-- figures: begin -->\n2.0x\n<!-- figures: end -->\n"
    )
    assert docs_quotes.unchecked(text, []) == []
    assert docs_quotes.unchecked("It took [1.5 s](results/x.md).", []) != []


def test_the_results_pages_are_tables_their_scripts_wrote() -> None:
    """The profiles' quotes read the table their script wrote: the first table, by its first column."""
    rows = docs_quotes.table("forward/call-profile.md")
    assert {"full", "default"} <= set(rows)
    assert rows["full"]["against full"] == "-"
    assert json.dumps(rows)  # plain strings, as written
