"""docs/torch-workarounds.md's table, from the runtime's own list of what it works around in torch
(`regionalize/workarounds.py`); written by scripts/render_docs.py, checked by
tests/test_workarounds.py."""

from __future__ import annotations

import re

from regionalize import workarounds


def table() -> str:
    rows = [
        f"| {w.name} | {w.does} | {w.covers} | {_issue(w.issue)} | "
        f"{'applied on every torch' if w.probe is None else f'`{w.probe.__name__}`'} | {w.until} |\n"
        for w in workarounds.WORKAROUNDS
    ]
    head = "| workaround | what the runtime does | torch | issue | probe | it can go |\n" + "|---" * 6 + "|\n"
    return head + "".join(rows)


def _issue(issue: str) -> str:
    """`issue` with each `pytorch/pytorch#N` it names linked."""
    return re.sub(
        r"pytorch/pytorch#(\d+)", r"[pytorch/pytorch#\1](https://github.com/pytorch/pytorch/issues/\1)", issue
    )
