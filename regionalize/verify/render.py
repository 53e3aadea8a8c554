"""The verify report as a terminal table. Torch-free: it only reads the result dict."""

from __future__ import annotations

from typing import Any

from regionalize.bench.served import cuda_graphs_text, regions_text

_LABEL = 24
_COLUMN = 12
_REASONS_SHOWN = 5


def table(result: dict[str, Any]) -> str:
    lines = [_heading(result), ""]
    error = result.get("error")
    if error:
        lines += [f"ERROR ({error['stage']}): {error['message']}"]
        if error.get("traceback"):
            lines += ["", error["traceback"].rstrip()]
        return "\n".join(lines) + "\n"
    lines += ["Correctness", *_correctness(result), ""]
    if not result.get("rewrite_error"):
        lines += [*_compile(result), "", _steady(result)]
        if result.get("decode_ms_per_token"):
            lines.append(_decode(result))
        if result.get("train_ms_per_step"):
            lines += _training(result)
        lines += [f"  {name}: not measured ({why})" for name, why in result["skipped"].items()]
    else:
        lines += ["The rewritten model raised:", result["rewrite_error"].rstrip()]
    lines += ["", verdict(result)]
    return "\n".join(lines) + "\n"


def verdict(result: dict[str, Any]) -> str:
    problems = []
    if not result["equivalent"]:
        problems.append("outputs or gradients differ")
    if not result["state_dict_compatible"]:
        problems.append("the original checkpoint does not load strictly")
    warning = " (warning: blocks fell back to eager, see above)" if result["fell_back_to_eager"] else ""
    owners = result["accounting"].get("regional", {}).get("owners", [])
    if any(owner["form"] == "per block" and owner["fallback"] for owner in owners):
        warning += " (warning: an owner could not be compiled whole and runs per block, see above)"
    if problems:
        return "FAIL: " + "; ".join(problems) + warning
    return "PASS: equivalent and checkpoint-compatible" + warning


def _heading(result: dict[str, Any]) -> str:
    source = result.get("rewritten") or "codemod output"
    options = result["options"]
    where = f"; device {result['device']}, torch {result['torch_version']}" if "device" in result else ""
    return (
        f"regionalize verify {result['model']} --factory {result['factory']}\n"
        f"rewrite: {source} (style {options['style']}, backend {options['backend']}){where}"
    )


def _correctness(result: dict[str, Any]) -> list[str]:
    lines = []
    outputs = "workload results" if result.get("workload") else "outputs (eval)"
    for label, key in ((outputs, "forward"), ("gradients", "gradients")):
        check = result[key]
        if not check["compared"]:
            lines.append(_row(label, "-", check.get("note", "")))
            continue
        text = (
            f"{check['compared']} compared, max |diff| {_number(check['max_abs_diff'])} "
            f"at {check['max_abs_diff_at']}"
        )
        lines.append(_row(label, "PASS" if check["ok"] else "FAIL", text))
        lines += [
            f"{'':{_LABEL + 8}}{f['path']}: {_number(f['max_abs_diff'])} ({f['detail']})"
            for f in check["failures"][:_REASONS_SHOWN]
        ]
    tokens = result.get("tokens_identical")
    if tokens is not None:
        new = result["workload"]["tokens"]
        same = "identical" if tokens else "differ"
        lines.append(_row("generated tokens", "PASS" if tokens else "FAIL", f"{new} new (greedy), {same}"))
    losses = result.get("losses_equal")
    if losses is not None:
        steps = result["workload"]["steps"]
        same = "equal" if losses else "differ"
        lines.append(_row("training losses", "PASS" if losses else "FAIL", f"{steps} steps, {same}"))
    state = result["state_dict"]
    if state["compatible"]:
        lines.append(_row("state_dict", "PASS", f"{state['keys']} keys identical, strict load ok"))
    else:
        detail = ", ".join(
            filter(
                None,
                [
                    f"missing {_keys(state['missing'])}" if state["missing"] else "",
                    f"unexpected {_keys(state['unexpected'])}" if state["unexpected"] else "",
                    "" if state["missing"] or state["unexpected"] else state["error"],
                ],
            )
        )
        lines.append(_row("state_dict", "FAIL", detail))
    bypass = result.get("bypass_equivalent")
    if bypass is not None:
        lines.append(_row("guard bypass", "PASS" if bypass else "FAIL", "outputs and gradients as above"))
    return lines


def _compile(result: dict[str, Any]) -> list[str]:
    names = list(result["compile_s"])
    width = max([_COLUMN, *(len(n) + 2 for n in names)])
    runs = max((len(v) for r in result["compile_runs"].values() for v in r.values()), default=0)
    heading = "Compile (first call)"
    if result.get("ttft_s") is not None:
        heading = "Time to first token"
    elif result.get("train_ms_per_step") is not None:
        heading = "First training step"
    lines = [f"{heading:<{_LABEL}}" + "".join(f"{n:>{width}}" for n in names) + f"{'full/regional':>16}"]
    lines += _start_rows(result, names, width)
    lines.append(f"  (median of {runs} fresh processes each)" if runs else "  (fresh-process timing skipped)")
    lines += _accounting_rows(result["accounting"], names, width)
    lines += _account_notes(result["accounting"], names)
    return lines


def _start_rows(result: dict[str, Any], names: list[str], width: int) -> list[str]:
    """A row of seconds for each kind of start measured, then the sizes of what a start left on disk."""
    lines = []
    for label, key in (
        ("warm process", "compile_s"),
        ("cold process", "compile_cold_s"),
        ("hot (caches on disk)", "compile_hot_s"),
        ("portable artifacts", "compile_artifact_s"),
        ("first generate (warm)", "first_generate_s"),
        ("first generate (hot)", "first_generate_hot_s"),
    ):
        if key.startswith("first_generate") and not any((result.get(key) or {}).values()):
            continue
        values = result.get(key) or {}
        cells = "".join(f"{_seconds(values.get(n)):>{width}}" for n in names)
        top, bottom = values.get("full"), values.get("regional")
        speedup = f"{top / bottom:.2f}x" if top and bottom else "-"
        lines.append(f"  {label:<{_LABEL - 2}}{cells}{speedup:>16}")
    for label, key in (("artifact size", "artifact_bytes"), ("saved owners size", "saved_owner_bytes")):
        sizes = result.get(key) or {}
        if any(sizes.values()):
            cells = "".join(f"{_kib(sizes.get(n)):>{width}}" for n in names)
            lines.append(f"  {label:<{_LABEL - 2}}{cells}")
    for name, owners in (result.get("saved_owners_hot") or {}).items():
        found = ", ".join(f"{owner} {how}" for owner, how in owners.items())
        lines.append(f"  {name} hot start, saved owners: {found}")
    return lines


def _accounting_rows(accounting: dict[str, Any], names: list[str], width: int) -> list[str]:
    """What each variant compiled: a row a count, a cell a variant."""
    lines = []
    for label, render in (
        ("frames / graphs", lambda a: f"{a['frames']} / {a['graphs']}"),
        ("recompiles", lambda a: str(a["recompiles"])),
        ("graph breaks", lambda a: str(a["graph_breaks"])),
        ("fell back to eager", lambda a: "YES" if a["fell_back_to_eager"] else "no"),
        ("regions traced / reused", regions_text),
        *(
            [("CUDA graphs captured / replayed", cuda_graphs_text)]
            if any(a.get("cuda_graphs_captured") is not None for a in accounting.values())
            else []
        ),
    ):
        cells = "".join(f"{render(accounting[n]) if n in accounting else '-':>{width}}" for n in names)
        lines.append(f"  {label:<{_LABEL - 2}}{cells}")
    return lines


def _account_notes(accounting: dict[str, Any], names: list[str]) -> list[str]:
    """A line for each reason a variant recompiled, broke its graph or fell back, and each owner's form."""
    lines = []
    for name in names:
        account = accounting.get(name)
        if not account:
            continue
        for reason, count in list(account["recompile_reasons"].items())[:_REASONS_SHOWN]:
            lines.append(f"  {name} recompile: {reason} x{count}")
        for reason, count in list(account["graph_break_reasons"].items())[:_REASONS_SHOWN]:
            lines.append(f"  {name} graph break: {reason} x{count}")
        if account["fallback"]:
            lines.append(f"  {name} fell back to eager: {account['fallback']}")
        for owner, form in account.get("forms", {}).items():
            served = "compiled whole, blocks nested regions" if form == "whole" else form
            served = served.replace("whole, caches", "compiled whole, blocks nested regions, caches", 1)
            lines.append(f"  {name} form: {owner} {served}")
    return lines


def _steady(result: dict[str, Any]) -> str:
    spread = result.get("steady_spread_us", {})
    cells = "   ".join(
        f"{name} {_micros(us)}"
        + (f" ({_micros(spread[name]['min'])}-{_micros(spread[name]['max'])})" if name in spread else "")
        for name, us in result["steady_us"].items()
    )
    label = "Steady state per run" if result.get("workload") else "Steady state per call"
    return f"{label:<{_LABEL}}{cells}"


def _decode(result: dict[str, Any]) -> str:
    cells = "   ".join(f"{name} {_millis(ms)}" for name, ms in result["decode_ms_per_token"].items())
    return f"{'Decode per token':<{_LABEL}}{cells}"


def _training(result: dict[str, Any]) -> list[str]:
    """The time of one training step, and the most memory a step's tensors held at once."""
    cells = "   ".join(f"{name} {_millis(ms)}" for name, ms in result["train_ms_per_step"].items())
    lines = [f"{'Training step':<{_LABEL}}{cells}"]
    peaks = result.get("peak_step_bytes") or {}
    if any(peaks.values()):
        cells = "   ".join(f"{name} {_mib(size)}" for name, size in peaks.items())
        lines.append(f"{'Peak memory a step':<{_LABEL}}{cells}")
    else:
        lines.append(f"{'Peak memory a step':<{_LABEL}}not measured")
    return lines


def _row(label: str, status: str, text: str) -> str:
    return f"  {label:<{_LABEL - 2}}{status:<6}{text}"


def _keys(keys: list[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f" (+{len(keys) - 3})" if len(keys) > 3 else "")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def _kib(value: float | None) -> str:
    return "-" if value is None else f"{value / 1024:.0f} KiB"


def _micros(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 10_000 else f"{value:.1f} us"
