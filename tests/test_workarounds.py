"""Which of the runtime's workarounds of torch (`regionalize/workarounds.py`) the running torch needs,
probed on each CI torch (.ci/torch): a torch that fixes one fails here, which says the workaround can go, and
a torch that needs one more fails too. docs/torch-workarounds.md holds the table rendered
(`python scripts/render_docs.py` writes it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from regionalize import workarounds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_workarounds
import render_docs

PAGE = Path(__file__).resolve().parent.parent / "docs" / "torch-workarounds.md"
GRADIENTS = "a saved owner's gradients"
THREADS = "calls while another thread compiles"
# The workarounds with a probe that each CI torch needs, by its minor version.
NEEDED = {
    (2, 11): {
        "Inductor's CPU check",
        "module globals",
        "regions traced for every block",
        THREADS,
        "a tracing thread that ends",
        GRADIENTS,
    },
    (2, 12): {"Inductor's CPU check", "module globals", "reuse limit", THREADS, GRADIENTS},
    (2, 13): {
        "Inductor's CPU check",
        "module globals",
        "reuse limit",
        "compiling in another thread",
        GRADIENTS,
    },
    (2, 14): {"Inductor's CPU check", "reuse limit", "compiling in another thread", GRADIENTS},
    (2, 15): {"Inductor's CPU check", "reuse limit", "compiling in another thread"},
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


def test_the_page_is_the_table_rendered() -> None:
    shown = render_docs.block(PAGE.read_text(encoding="utf-8"), "workarounds")[1]
    assert shown == docs_workarounds.table(), "docs/torch-workarounds.md: run python scripts/render_docs.py"
