"""Which of the runtime's workarounds of torch (`regionalize/runtime/workarounds.py`) the running torch needs,
probed on each CI torch (.ci/torch): a torch that fixes one fails here, which says the workaround can go, and
a torch that needs one more fails too. docs/torch-workarounds.md is the table rendered
(`REGIONALIZE_UPDATE_FIXTURES=1` rewrites it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from regionalize.runtime import workarounds

PAGE = Path(__file__).resolve().parent.parent / "docs" / "torch-workarounds.md"
ALWAYS = {"module globals", "Inductor's CPU check"}
# The workarounds with a probe that each CI torch needs, by its minor version.
NEEDED = {
    (2, 11): ALWAYS | {"regions traced for every block"},
    (2, 13): ALWAYS | {"reuse limit", "compiling in another thread"},
    (2, 14): ALWAYS | {"reuse limit", "compiling in another thread"},
    (2, 15): ALWAYS | {"reuse limit", "compiling in another thread"},
}


def test_the_workarounds_this_torch_needs_are_those_listed_for_it() -> None:
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    if version not in NEEDED:
        pytest.skip(f"torch {torch.__version__} is not one CI tests")
    assert set(workarounds.needed()) == NEEDED[version]  # type: ignore[index]


def test_every_workaround_says_what_it_covers_and_when_it_can_go() -> None:
    names = [w.name for w in workarounds.WORKAROUNDS]
    assert len(set(names)) == len(names)
    for w in workarounds.WORKAROUNDS:
        assert w.does.endswith(".") and "`" in w.does  # names the part of the runtime that does it
        assert w.covers and w.issue and w.until.startswith("when")


def page() -> str:
    rows = [
        f"| {w.name} | {w.does} | {w.covers} | {_issue(w.issue)} | "
        f"{'applied on every torch' if w.probe is None else f'`{w.probe.__name__}`'} | {w.until} |"
        for w in workarounds.WORKAROUNDS
    ]
    return "\n".join(
        [
            "# What the runtime works around in torch",
            "",
            "Rendered from `regionalize/runtime/workarounds.py`. `tests/test_workarounds.py` probes, on each "
            "torch CI tests (2.11, 2.13, 2.14 and 2.15), which of these that torch needs; a torch that fixes "
            "one fails that test, and the workaround can go. Private torch names are reached through "
            "`regionalize/runtime/internals.py` alone.",
            "",
            "| workaround | what the runtime does | torch | issue | probe | it can go |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _issue(issue: str) -> str:
    if issue.startswith("pytorch/pytorch#"):
        number = issue.rpartition("#")[2]
        return f"[{issue}](https://github.com/pytorch/pytorch/issues/{number})"
    return issue


def test_the_page_is_the_table_rendered() -> None:
    if os.environ.get("REGIONALIZE_UPDATE_FIXTURES"):
        PAGE.write_text(page(), encoding="utf-8")
    assert PAGE.read_text(encoding="utf-8") == page(), "REGIONALIZE_UPDATE_FIXTURES=1 rewrites it"
