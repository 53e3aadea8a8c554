"""The serving benchmark's tables (serving.md, serving.json), issue 37's targets computed from its rows, and a
run in parts (`kept`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from .settings import DEFAULT_VARIANTS, TARGET_LIMIT, TARGET_SOONER, TARGETS, VARIANTS


def cell(text: object) -> str:
    """Text that keeps a Markdown table's row whole."""
    return " ".join(str(text).split()).replace("|", "/")


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def ratios(row: dict[str, Any], rows: dict[str, dict[str, Any]], limit: float | None) -> dict[str, Any]:
    full = rows.get("full", {}).get("first_generate_s")
    static = rows.get("transformers_static", {}).get("decode_ms_per_token")
    first, decode = row.get("first_generate_s"), row.get("decode_ms_per_token")
    full_restart, restart = (
        rows.get("full", {}).get("restart_first_generate_s"),
        row.get("restart_first_generate_s"),
    )
    return {
        "sooner_than_full": full / first if full and first else None,
        "restart_sooner_than_full": full_restart / restart if full_restart and restart else None,
        "vs_limit": decode / limit if decode and limit else None,
        "vs_transformers_static": decode / static if decode and static else None,
    }


def runs(commands: list[str]) -> dict[str, int]:
    """Which of `commands` (numbered from 1) each variant's row is from: the last that names it (a command
    without `--variants` names the default ones). Rows of two runs are two sittings, whose machines' speeds
    differ (docs/results/serving/README.md), so a ratio between them is read within one run."""
    found = {}
    for number, command in enumerate(commands, 1):
        words = shlex.split(command)
        named = DEFAULT_VARIANTS
        if "--variants" in words:
            rest = words[words.index("--variants") + 1 :]
            named = rest[: next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]
        found |= dict.fromkeys(named, number)
    return found


def _restart(row: dict[str, Any]) -> str:
    if row.get("restart_error"):
        return f"error: {cell(row['restart_error'])}"
    seconds = row.get("restart_first_generate_s")
    return "-" if seconds is None else f"{seconds:.1f}"


def _stages(meta: dict[str, Any]) -> str:
    """Where the last command's time went, where it says."""
    stages = meta.get("stages") or {}
    names = {
        "bandwidth_s": "the bandwidth",
        "token_check_s": "the token check",
        "first_processes_s": "the variants' first processes",
        "restarts_s": "their restarts",
    }
    parts = [f"{names[k]} {stages[k]:.0f} s" for k in names if stages.get(k)]
    if not parts:
        return ""
    last = f"the last command's {meta['wall_s'] / 60:.1f}: " if meta.get("earlier_wall_s") else ""
    return f" ({last}{', '.join(parts)})"


def dynamo_text(row: dict[str, Any]) -> str:
    d = row.get("dynamo") or {}
    if not d:
        return "-"
    fallback = {True: "yes", False: "no", None: "?"}[d.get("fell_back_to_eager")]
    parts = [f"breaks {d.get('graph_breaks', '?')}"]
    if "recompiles" in d:
        parts.append(f"recompiles {d['recompiles']}")
    parts.append(f"eager fallback {fallback}")
    if d.get("cudagraph_skips_all"):
        parts.append(f"CUDA-graph skips {d['cudagraph_skips_all']}")
    if d.get("cuda_graphs_per_token") is not None:
        parts.append(f"CUDA graphs replayed a token {d['cuda_graphs_per_token']:.1f}")
    return ", ".join(parts)


def targets(rows: dict[str, dict[str, Any]], check: dict[str, Any], limit: float | None) -> list[dict]:
    """Issue 37's targets for each rewrite variant measured, computed from the rows."""
    found = []
    for variant, row in rows.items():
        if VARIANTS[variant][0] is None:
            continue
        if "error" in row:
            found.append({"variant": variant, "met": dict.fromkeys(TARGETS), "all_met": False})
            continue
        r = ratios(row, rows, limit)
        tokens = (check.get(variant) or {}).get("verdict")
        fallback = (row.get("dynamo") or {}).get("fell_back_to_eager")
        values = (
            r["sooner_than_full"] and r["sooner_than_full"] >= TARGET_SOONER,
            r["vs_limit"] and r["vs_limit"] <= TARGET_LIMIT,
            r["vs_transformers_static"] and r["vs_transformers_static"] <= 1.0,
            None if tokens is None else tokens == "identical",
            None if fallback is None else not fallback,
            None if r["restart_sooner_than_full"] is None else r["restart_sooner_than_full"] >= 1.0,
        )
        met = {
            name: None if value is None else bool(value) for name, value in zip(TARGETS, values, strict=True)
        }
        known = [v for v in met.values() if v is not None]
        everything = False if False in known else (True if len(known) == len(met) else None)
        found.append({"variant": variant, **r, "met": met, "all_met": everything})
    return found


def markdown(meta: dict[str, Any], rows: dict[str, dict[str, Any]], check: dict[str, Any]) -> str:
    bw = meta.get("bandwidth") or {}
    limit = bw.get("limit_ms_per_token")
    versions = bw.get("versions") or {}
    sizes = meta["model"]
    title = "# Serving a transformers decoder" + (" (SMOKE RUN: not figures)" if meta["smoke"] else "")
    limit_text = (
        f"**memory-bound limit {limit:.2f} ms/token** ({bw['weight_bytes'] / 1e9:.2f} GB of weights at a "
        f"measured device copy bandwidth of {bw['bandwidth_gb_s']:.0f} GB/s)"
        if limit
        else "memory-bound limit not measured"
    )
    prepared = meta.get("prepared") or {}
    several = len(meta["commands"]) > 1
    run = runs(meta["commands"])
    commands = [f"({n}) `{c}`" if several else f"`{c}`" for n, c in enumerate(meta["commands"], 1)]
    dates = " and ".join(sorted({meta["date"], *(row.get("date", meta["date"]) for row in rows.values())}))
    earlier: dict[str, list[str]] = {}  # rows measured on other rewrites than the last command's
    for variant, row in rows.items():
        if row.get("rewrites") not in (None, rewrites_of(meta, variant)):
            earlier.setdefault(row["rewrites"], []).append(variant)
    lines = [
        title,
        "",
        f"Measured by {' and '.join(commands)} on {dates}: {meta['device']} "
        f"({bw.get('device_name', '?')}), "
        f"torch {versions.get('torch', '?')}, transformers {versions.get('transformers', '?')}, accelerate "
        f"{versions.get('accelerate', '-')}, Python {versions.get('python', '?')}; regionalize runtime "
        f"{prepared.get('runtime', '-')} (rewrites of transformers {prepared.get('transformers', '-')}'s "
        f"modeling_llama.py, regionalize {prepared.get('regionalize_commit', '-')}); "
        f"{(meta['wall_s'] + meta.get('earlier_wall_s', 0)) / 60:.1f} minutes in all{_stages(meta)}. "
        f"{limit_text}."
        + (
            " Each row is from the last of these commands that names its variant (*run*): compare rows"
            " of one run, since the machine's speed moved between runs."
            if several
            else ""
        )
        + "".join(f" Rows {', '.join(vs)}: rewrites of {r}." for r, vs in earlier.items()),
        "",
        f"The model: transformers' `LlamaForCausalLM`, hidden {sizes['hidden_size']}, "
        f"{sizes['num_hidden_layers']} layers, {sizes['num_attention_heads']} heads, "
        f"{sizes['num_key_value_heads']} KV heads, intermediate {sizes['intermediate_size']}, vocab "
        f"{sizes['vocab_size']}, random weights, {meta['dtype']}, built on the device; a "
        f"{meta['prompt_len']}-token prompt, greedy `generate` of {meta['tokens']} new tokens. Each variant "
        "in a fresh process with an empty Inductor cache, after an unrelated warm-up compile. *First "
        f"generate*: the process's first {meta['tokens']}-token `generate`, every compile included. "
        "*Restart* (where measured, `--hot`): the same in one more process, without the warm-up, that "
        "finds the compile caches the first left on disk, as a restarted service does. "
        f"*Decode*: (generate({meta['tokens']}) - generate(1)) / {meta['tokens'] - 1}, median of "
        f"{meta['rounds']} rounds. *Tokens*: a {meta['check_model']['num_hidden_layers']}-layer fp32 config "
        f"(hidden {meta['check_model']['hidden_size']}) generated each variant's way, against eager's. "
        "*Form*: how each owner of the rewrite was served. What each variant is: the docstring of "
        "scripts/bench_serving.py.",
        "",
        "| variant" + (" | run" if several else "") + " | first generate (s) | vs full (x sooner) "
        "| restart: first generate (s) | vs full's restart (x sooner) | decode ms/token "
        "| vs memory-bound limit (x) | peak memory | tokens (fp32 check) | form | Dynamo (first generate) |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if several else ""),
    ]
    for variant, row in rows.items():
        verdict = (check.get(variant) or {}).get("verdict", "-")
        name = f"{variant} | ({run.get(variant, '?')})" if several else variant
        if "error" in row:
            lines.append(f"| {name} | error: {cell(row['error'])} | | | | | | | {verdict} | | |")
            continue
        r = ratios(row, rows, limit)
        memory = "-" if row["peak_memory_gib"] is None else f"{row['peak_memory_gib']:.1f} GiB"
        forms = cell("; ".join(f"{k}: {v}" for k, v in (row.get("forms") or {}).items()) or "-")
        if row.get("forms") == {}:  # a rewrite without an owner: --form per-block
            forms = "no owner: each block compiled on its own"
        lines.append(
            f"| {name} | {row['first_generate_s']:.1f} | {_x(r['sooner_than_full'])} | "
            f"{_restart(row)} | {_x(r['restart_sooner_than_full'])} | {row['decode_ms_per_token']:.2f} | "
            f"{_x(r['vs_limit'])} | {memory} | {verdict} | {forms} | {dynamo_text(row)} |"
        )
    found = targets(rows, check, limit)
    if found:
        names = TARGETS
        mark = {True: "met", False: "**not met**", None: "not measured"}
        lines += [
            "",
            f"Issue 37's targets (first generate at least {TARGET_SOONER:g}x sooner than full; decode at "
            f"most {TARGET_LIMIT:g}x the memory-bound limit and no slower than transformers_static; tokens "
            "identical; no eager fallback; a restart no later than full's), computed from the rows above:",
            "",
            "| variant | " + " | ".join(names) + " | all met |",
            "|---|" + "---|" * (len(names) + 1),
        ]
        for t in found:
            lines.append(
                f"| {t['variant']} | "
                + " | ".join(mark[t["met"][n]] for n in names)
                + f" | {mark[t['all_met']]} |"
            )
    for variant, row in rows.items():
        d = row.get("dynamo") or {}
        notes = []
        if d.get("fallback"):
            notes.append(f"eager fallback: {d['fallback']}")
        if d.get("graph_break_reasons"):
            notes.append(
                "graph breaks: "
                + "; ".join(f"'{k}' x{n}" for k, n in list(d["graph_break_reasons"].items())[:3])
            )
        if (check.get(variant) or {}).get("error"):
            notes.append(f"token check: {check[variant]['error']}")
        elif (check.get(variant) or {}).get("verdict") == "differ":
            notes.append(f"token check: differs from eager's from token {check[variant]['first_differ']} on")
        if notes:
            lines += ["", f"**{variant}**: " + ". ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def render(out: Path) -> None:
    """serving.md written again from the serving.json beside it, as its run wrote it, measuring nothing:
    after a change to how the table is laid out."""
    found = json.loads((out / "serving.json").read_text())
    (out / "serving.md").write_text(markdown(found["meta"], found["results"], found["token_check"]))


def write(out: Path, meta: dict[str, Any], rows: dict[str, Any], check: dict[str, Any]) -> None:
    limit = (meta.get("bandwidth") or {}).get("limit_ms_per_token")
    everything = {"meta": meta, "results": rows, "token_check": check, "targets": targets(rows, check, limit)}
    (out / "serving.json").write_text(json.dumps(everything, indent=2, default=str) + "\n")
    (out / "serving.md").write_text(markdown(meta, rows, check))


def rewrites_of(meta: dict[str, Any], variant: str) -> str | None:
    """Which rewrites a run of `meta` measured `variant` on: None for the original."""
    prepared = meta.get("prepared") or {}
    if VARIANTS[variant][0] is None:
        return None
    return f"runtime {prepared.get('runtime', '-')}, regionalize {prepared.get('regionalize_commit', '-')}"


def kept(out: Path, meta: dict[str, Any], variants: list[str], checking: bool) -> tuple[dict, dict]:
    """--add: the rows and token checks of an earlier run into `out` on the same machine and versions, less
    the variants measured again (their token checks kept where this run checks none and its rewrites are
    the earlier run's); its commands and time go into `meta`."""
    path = out / "serving.json"
    if not path.is_file():
        return {}, {}
    earlier = json.loads(path.read_text())
    then, now = earlier["meta"], meta
    same = ("device", "smoke", "dtype", "model", "prompt_len", "tokens", "rounds")
    where = (then.get("bandwidth") or {}).get("device_name"), (then.get("bandwidth") or {}).get("versions")
    here = (now["bandwidth"] or {}).get("device_name"), (now["bandwidth"] or {}).get("versions")
    if any(then.get(k) != now.get(k) for k in same) or where != here:
        sys.exit(f"error: {path} was measured on another machine, versions or settings: not adding to it")
    meta["commands"] = [*then["commands"], *meta["commands"]]
    meta["earlier_wall_s"] = then.get("earlier_wall_s", 0) + then.get("wall_s", 0)
    rows = {v: r for v, r in earlier["results"].items() if v not in variants}
    for variant, row in rows.items():  # rows of runs before rows said where they came from
        row.setdefault("date", then["date"])
        row.setdefault("rewrites", rewrites_of(then, variant))
    same_rewrites = not checking and then.get("prepared") == now.get("prepared")
    check = {v: c for v, c in earlier["token_check"].items() if v not in variants or same_rewrites}
    return rows, check
