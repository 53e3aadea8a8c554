"""The zoo's results: a Markdown table, one JSON object and a PNG chart of compile speedup per model."""

from __future__ import annotations

import collections
import datetime
import json
from pathlib import Path
from typing import Any

from regionalize.bench import zoo_cluster
from regionalize.bench.machine import machine
from regionalize.bench.served import ALONE, regions_text
from regionalize.bench.zoo import Row
from regionalize.codemod.runtime_copy import VERSION

_COLORS = {"pass": "#2e7d32", "fail": "#c62828"}


def write(rows: list[Row], manifest: Path, out: Path, stem: str) -> list[Path]:
    """Write STEM.md, STEM.json and (with matplotlib installed) STEM.png into `out`; return their paths."""
    meta = _meta(rows, manifest)
    written = [out / f"{stem}.json"]
    written[0].write_text(
        json.dumps(meta | {"models": [row.to_json() for row in rows]}, indent=2, default=str) + "\n",
        encoding="utf-8",
    )
    chart = out / f"{stem}.png"
    has_chart = _chart(rows, meta, chart)
    markdown = out / f"{stem}.md"
    markdown.write_text(_markdown(rows, meta, chart.name if has_chart else None), encoding="utf-8")
    return [markdown, *written, *([chart] if has_chart else [])]


def _meta(rows: list[Row], manifest: Path) -> dict[str, Any]:
    first = next((row.result for row in rows if row.result and row.result.get("device")), {})
    counts = collections.Counter(row.status for row in rows)
    cluster = {"cluster": zoo_cluster.summary(rows)} if zoo_cluster.placed(rows) else {}
    return {
        "manifest": manifest.name,
        "device": first.get("device"),
        "torch_version": first.get("torch_version"),
        "date": datetime.date.today().isoformat(),
        "runtime": VERSION,
        "machine": machine(),
        "counts": dict(counts),
    } | cluster


def _markdown(rows: list[Row], meta: dict[str, Any], chart: str | None) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in meta["counts"].items())
    starts = measured(_STARTS, [row.result or {} for row in rows])
    node = zoo_cluster.placed(rows)  # ran on Ray: where each row ran is a column of its own
    lines = [
        f"# regionalize verify --manifest {meta['manifest']}",
        "",
        f"{len(rows)} models: {counts}. Device {meta['device'] or '-'}, torch "
        f"{meta['torch_version'] or '-'}, regionalize runtime {meta['runtime']}; {meta['machine']}; "
        f"{meta['date']}.",
        *zoo_cluster.lines(meta.get("cluster", {})),
        "",
        "*First call*: compile and run once (with a generation workload: the first token; with a training "
        "workload: the first training step), in a fresh process after an unrelated warm-up compile, median "
        "over the fresh processes. *Per call*: steady state, median (with a generation workload: one whole "
        "generation; with a training workload: all its steps). *Hierarchical* is the rewrite "
        "verified (its form says whether each owner ran compiled whole), *per-block* its `--form per-block`, "
        "*full* `torch.compile` of the whole model, *dedup* the same with Dynamo's graph deduplication. "
        "*Cold*: a first call with nothing compiled before in the process; *hot*: one that finds the "
        "compile caches a cold process left on disk, as a restarted service does (where measured). "
        "*Regions* are the rewrite's nested regions: traced, and reused from one traced before. Each "
        "model's whole report is linked from its name.",
        "",
        f"| model | verdict | form | regions traced / reused | first call {_NAMES} | full / hierarchical "
        + "".join(f"| {label} full / hierarchical " for label, _ in starts)
        + f"| per call eager / {_NAMES} | hierarchical / full | eager fallback | took |"
        + (" node, device, versions |" if node else ""),
        "|---|---|---|--:|--:|--:|" + "--:|" * len(starts) + "--:|--:|---|--:|" + ("---|" if node else ""),
    ]
    for row in rows:
        lines.append(_table_row(row, starts) + (f" {zoo_cluster.cell(row)} |" if node else ""))
    notes = [f"- **{row.name}**: {row.status}: {row.reason}" for row in rows if row.reason]
    if notes:
        lines += ["", *notes]
    if chart:
        lines += ["", f"![compile speedup per model]({chart})"]
    return "\n".join(lines) + "\n"


_VARIANTS = ("full", "full_dedup", "per_block", "regional")
_NAMES = "full / dedup / per-block / hierarchical"
# Other fresh processes than the warm one, each a column where some row measured it.
_STARTS = (("cold first call", "compile_cold_s"), ("hot first call", "compile_hot_s"))


def _table_row(row: Row, starts: list[tuple[str, str]]) -> str:
    name = f"[{row.name}]({row.report})"
    r = row.result or {}
    if row.status not in ("pass", "fail"):
        return f"| {name} | {row.status} |" + " |" * (7 + len(starts)) + f" {row.seconds:.0f} s |"
    compile_s, steady = r.get("compile_s", {}), r.get("steady_us", {})
    account = r.get("accounting", {}).get("regional", {})
    full, regional = steady.get("full"), steady.get("regional")
    speedup = r.get("compile_speedup")
    cells = [
        name,
        "equivalent" if row.status == "pass" else "**FAIL**",
        form(r),
        regions_text(account),
        " / ".join(_seconds(compile_s.get(v)) for v in _VARIANTS),
        f"{speedup:.2f}x" if speedup else "-",
        *(against_full(r.get(key) or {}) for _, key in starts),
        " / ".join(_micros(steady.get(v)) for v in ("eager", *_VARIANTS)),
        f"{regional / full:.2f}x" if full and regional else "-",
        "**yes**" if r.get("fell_back_to_eager") else "no",
        f"{row.seconds:.0f} s",
    ]
    return "| " + " | ".join(cells) + " |"


def form(result: dict[str, Any]) -> str:
    """The form the rewrite ran in: hierarchical (every owner compiled whole), or per block, and why."""
    owners = owner_records(result)
    if not owners:
        return "per-block"
    per_block = [owner for owner in owners if owner["form"] == "per block"]
    fallen = sorted(owner["owner"] for owner in per_block if owner["fallback"])
    if fallen:
        return f"per-block (fell back: {', '.join(fallen)})"
    if per_block:
        return "per-block (this torch does not reuse a traced region)"
    alone = sorted(owner["owner"] for owner in owners if owner["form"] == "alone")
    if alone:
        if len(alone) == len(owners):
            return "per-block (one block per owner)"
        return f"hierarchical ({', '.join(alone)}: {ALONE})"
    return "hierarchical"


def owner_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The regional variant's owners as records (`regionalize.describe`); for a result kept by a release
    before there were records, read from the text of each owner's form."""
    regional = result.get("accounting", {}).get("regional", {})
    if "owners" in regional:
        return regional["owners"]
    return [
        {
            "owner": owner,
            "form": "alone"
            if text == ALONE
            else "per block"
            if text.startswith(("per-block:", "per block, "))
            else "whole",
            "fallback": text.startswith("per-block:"),
        }
        for owner, text in regional.get("forms", {}).items()
    ]


def measured(columns: tuple[tuple[str, str], ...], results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (label, key) `columns` whose key some result holds a time in."""
    return [(label, key) for label, key in columns if any(any((r.get(key) or {}).values()) for r in results)]


def against_full(times: dict[str, float | None]) -> str:
    """Full's and the rewrite's first calls, with how many times sooner the rewrite's came."""
    full, regional = times.get("full"), times.get("regional")
    ratio = f" ({full / regional:.2f}x)" if full and regional else ""
    return f"{_seconds(full)} / {_seconds(regional)}{ratio}"


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "-"


def _micros(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f} ms" if value >= 1000 else f"{value:.0f} µs"


def _chart(rows: list[Row], meta: dict[str, Any], path: Path) -> bool:
    """Horizontal bars of compile speedup (full / regional first call); False without matplotlib, or
    where no first call was timed (a manifest with `cold-start = false`): there is nothing to draw."""
    ordered = rows[::-1]
    speedups = [(row.result or {}).get("compile_speedup") or 0.0 for row in ordered]
    try:
        import matplotlib
    except ImportError:
        return False
    if not any(speedups):
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row.name for row in rows][::-1]
    figure, axes = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.6))
    bars = axes.barh(names, speedups, color=[_COLORS.get(row.status, "#9e9e9e") for row in ordered])
    for bar, row, speedup in zip(bars, ordered, speedups, strict=True):
        label = f"{speedup:.2f}x" if speedup else row.status
        if row.status == "fail":
            label += " (not equivalent)"
        axes.text(bar.get_width() + 0.05, bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    axes.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    axes.set_xlabel("first-call speedup of the regional rewrite (full compile time / regional)")
    axes.set_xlim(0, max([*speedups, 1.0]) * 1.25)
    axes.set_title(f"regionalize verify: {meta['device']}, torch {meta['torch_version']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
