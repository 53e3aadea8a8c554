"""The default rewrite against a full `torch.compile` and the per-block form, on each torch given.

Each torch lives in a virtual environment of its own with regionalize installed (`.ci/torch VERSION` makes
one). For each interpreter, each model and each form, `--repeats` fresh processes (one of each form in
turn) with an empty inductor cache: an unrelated warm-up compile, then the first call (with `generate`,
the first token), and a whole run that Dynamo's accounting watches (eager fallbacks, forms served).
Outputs are compared with eager's in each process: tokens must be identical. The first call reported is
the median of the processes: one process a cell moved with the machine too (the default's first token of
Llama on torch 2.14.1 read 12.1 s in the table's sitting and 8.3 s in a probe's, the same day).
Then, for each model, one more process holds every form and times a call (or a decoded token) in
interleaved rounds, one round of each form in turn, the median of the rounds: timed each in a process of
its own, minutes apart, the forms' figures moved with the machine (a GPT-style stack's default rewrite
read 1.48x a full compile's time per call that way, and 0.98x interleaved, on one torch on one day). The
calls are made at several depths of Python's stack (verify's timing does so): made from the benchmark's
own `main()`, one depth, the GPT-style stack's default read 1.23x to 1.49x a full compile's time per call
in fourteen runs with runtime 18, every block's call taking a page fault (scripts/stack_depths.py scans
the depths).

    python scripts/bench_torch_versions.py --python .venvs/torch-2.11.0/bin/python \\
        --python .venvs/torch-2.13.0/bin/python --python .venvs/torch-2.14.1/bin/python

writes docs/results/torch-versions/versions.md and versions.json, after each torch (a run stopped keeps the
torches it finished). With `--update` it measures the torches given and keeps the other torches' rows of
versions.json, each row naming the date and runtime it was measured with (after a change of the runtime
that only one torch takes). The models are 32 layers: the forward benchmark's GPT-style stack and
transformers' Llama (one forward, no cache), and transformers' Llama and Qwen2 decoders from
scripts/bench_decode.py (greedy generation with a `DynamicCache`). Never run it
beside anything else: on 2 cores another job's threads move every figure.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from regionalize.bench.machine import machine

ROOT = Path(__file__).resolve().parents[1]
MARKER = "BENCH_RESULT "
# The runtime's version, from its first line ("# regionalize runtime 17: ...").
RUNTIME = re.search(r"runtime (\d+)", (ROOT / "regionalize/runtime/__init__.py").read_text().splitlines()[0])
# name -> (model, factory, generate?)
MODELS = {
    "gpt-32": (str(ROOT / "docs/results/forward/gpt.py"), "build", False),
    "llama-32": (
        "transformers.models.llama.modeling_llama",
        f"{ROOT}/docs/results/forward/models.py:llama",
        False,
    ),
    "llama-32 generate": (
        "transformers.models.llama.modeling_llama",
        f"{ROOT}/scripts/bench_decode.py:make_llama_32",
        True,
    ),
    "qwen2-32 generate": (
        "transformers.models.qwen2.modeling_qwen2",
        f"{ROOT}/scripts/bench_decode.py:make_qwen2_32",
        True,
    ),
}
FORMS = ("full", "regional", "per_block")  # verify's variants: full compile, the default rewrite, per block
# Measured before it is adopted: the default with Dynamo's regions inlined before the backend (torch 2.13+),
# on one model of each workload.
INLINED = "regional_inlined"
INLINED_ON = ("gpt-32", "llama-32 generate")


def _subject(name: str, tokens: int) -> tuple[Any, Any]:
    """The model's target, and a function of a work folder that makes its verify subject."""
    from regionalize.bench.loading import resolve_target
    from regionalize.bench.session import Subject
    from regionalize.bench.workloads import GenerateSpec
    from regionalize.shared.options import Options

    model, factory, generate = MODELS[name]
    target = resolve_target(model, factory)
    spec = GenerateSpec(tokens, 16) if generate else None
    return target, functools.partial(Subject, target, Options(), "cpu", spec=spec)


def _variant(form: str) -> Any:
    from regionalize.bench.session import BY_NAME, Variant

    if form == INLINED:
        return Variant(INLINED, {}, dynamo=(("inline_invoke_subgraph", True),))
    return BY_NAME[form]


def worker(name: str, variant: str, tokens: int) -> dict[str, Any]:
    """One model in one form, in this (fresh) process: its first call, outputs, forms and fallbacks."""
    import torch

    from regionalize.bench.accounting import recording, served_forms
    from regionalize.bench.loading import import_paths
    from regionalize.bench.timing import call, first_call_s, warm_up
    from regionalize.shared.options import Options

    with tempfile.TemporaryDirectory() as work:
        target, make = _subject(name, tokens)
        with import_paths(target):
            subject = make(Path(work))
            built = subject.build(_variant(variant))
            warm_up(Options(), "cpu")
            torch.compiler.reset()
            first = first_call_s(built, "cpu")
            with recording() as account:
                out = call(built)
            want = call(subject.build(_variant("eager")))
    # With generate: the tokens; their logits as a compiled model's can be, within the verifier's tolerance.
    if MODELS[name][2]:
        identical = torch.equal(out["tokens"], want["tokens"])
        out, want = out["logits"], want["logits"]
    else:
        identical = True
    same = torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(want)
    identical &= all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(*same, strict=True))
    return {
        "first_s": first,
        "identical": identical,
        "fell_back_to_eager": account.fell_back_to_eager,
        "forms": served_forms(built.model),
    }


def steady_worker(name: str, forms: list[str], tokens: int, rounds: int) -> dict[str, float]:
    """Milliseconds per call (per token with `generate`) of each of `forms`, all in this process, timed in
    interleaved rounds: the median of the rounds. The inlined form is built from a module of its own, so
    that it shares no compiled code with the default's."""
    from regionalize.bench.loading import import_paths
    from regionalize.bench.timing import call, decode_timing, steady_us

    with tempfile.TemporaryDirectory() as work:
        target, make = _subject(name, tokens)
        with import_paths(target):
            (Path(work) / INLINED).mkdir()
            inlined, shared = make(Path(work) / INLINED), make(Path(work))
            built = {form: (inlined if form == INLINED else shared).build(_variant(form)) for form in forms}
            for one in built.values():
                call(one)  # compiled, and for generate its decode step too
                call(one)
            times: dict[str, list[float]] = {form: [] for form in forms}
            for _ in range(rounds):
                for form, one in built.items():
                    if MODELS[name][2]:
                        times[form].append(decode_timing(one, "cpu", budget_s=1.0)[1])
                    else:
                        times[form].append(steady_us(one, "cpu", budget_s=0.5) / 1000)
    return {form: statistics.median(values) for form, values in times.items()}


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One form's fresh processes as one result: the median first call (each one's kept), outputs as eager's
    in every process, an eager fallback in any; the first error where one failed."""
    failed = next((r for r in results if "error" in r), None)
    if failed is not None:
        return failed
    firsts = [r["first_s"] for r in results]
    return {
        **results[0],
        "first_s": statistics.median(firsts),
        "first_s_runs": firsts,
        "identical": all(r["identical"] for r in results),
        "fell_back_to_eager": any(r["fell_back_to_eager"] for r in results),
    }


def run(python: str, args: argparse.Namespace, *worker: str) -> Any:
    """A worker in a fresh process of `python` with an empty inductor cache: what it returns, or an error."""
    cache = tempfile.mkdtemp(prefix="bench-torch-versions-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [python, __file__, *worker, "--tokens", str(args.tokens), "--rounds", str(args.rounds)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1][len(MARKER) :])


def forms(python: str) -> tuple[str, ...]:
    code = "import torch; print(hasattr(torch._dynamo.config, 'inline_invoke_subgraph'))"
    inlines = subprocess.check_output([python, "-c", code], text=True).strip() == "True"
    return (*FORMS, INLINED) if inlines else FORMS


def versions(python: str) -> dict[str, str]:
    code = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    torch_version, transformers_version = subprocess.check_output([python, "-c", code], text=True).split()
    return {"torch": torch_version, "transformers": transformers_version}


def cell(result: dict[str, Any] | None, full: dict[str, Any], unit: str) -> str:
    """First call and time per call (or token), each against the full compile's."""
    if result is None:
        return "-"
    if "error" in result:
        return f"error: {result['error']}"
    first, per = result["first_s"], result["ms"]
    if result is full or not full:
        return f"{first:.1f} s / {per:.2f} {unit}"
    sooner, slower = full["first_s"] / first, per / full["ms"]
    return f"{first:.1f} s ({sooner:.2f}x sooner) / {per:.2f} {unit} ({slower:.2f}x)"


def notes(result: dict[str, Any] | None) -> str:
    if result is None or "error" in result:
        return "-"
    return "; ".join(
        [
            ", ".join(f"{k}: {v}" for k, v in result["forms"].items()) or "-",
            "outputs as eager's" if result["identical"] else "**outputs differ from eager's**",
            "**fell back to eager**" if result["fell_back_to_eager"] else "no eager fallback",
        ]
    )


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| torch | model | full: first / per call | default | per-block | default, regions inlined "
        "| default: form served, outputs, fallback |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        when = ", ".join(
            str(run[k]) if k == "date" else f"runtime {run[k]}" for k in ("date", "runtime") if k in run
        )
        for name, by_form in run["models"].items():
            full = by_form["full"] if "error" not in by_form["full"] else {}
            unit = "ms/token" if "generate" in name else "ms"
            cells = [cell(by_form.get(form), full, unit) for form in (*FORMS, INLINED)]
            torch_cell = run["versions"]["torch"] + (f" ({when})" if when else "")
            row = [torch_cell, name, *cells, notes(by_form["regional"])]
            lines.append(f"| {' | '.join(row)} |")
    return "\n".join(lines)


def kept(out: Path, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`runs` with the runs of other torches from `out`'s versions.json, in torch order. A run recorded
    before runs named their date takes the date of the table it came from."""
    old = json.loads((out / "versions.json").read_text(encoding="utf-8"))
    found = re.search(r"Measured on (\d{4}-\d\d-\d\d)", (out / "versions.md").read_text(encoding="utf-8"))
    measured = {run["versions"]["torch"] for run in runs}
    others = [
        {"date": found.group(1) if found else "?", **r} for r in old if r["versions"]["torch"] not in measured
    ]
    return sorted([*others, *runs], key=lambda r: r["versions"]["torch"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter with its torch (repeatable)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per generation")
    parser.add_argument("--rounds", type=int, default=5, help="steady-state rounds; the median is reported")
    parser.add_argument(
        "--repeats", type=int, default=3, help="fresh processes per first call; the median is reported"
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds per process")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "torch-versions")
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the rows of the torches not measured now from the last versions.json",
    )
    parser.add_argument(
        "--render", action="store_true", help="write versions.md again from versions.json, measuring nothing"
    )
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "FORM"), help=argparse.SUPPRESS)
    parser.add_argument("--steady", nargs=2, metavar=("MODEL", "FORMS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {args.repeats}")
    if args.worker:
        print(MARKER + json.dumps(worker(*args.worker, args.tokens)), flush=True)
        return
    if args.steady:
        name, names = args.steady
        steady = steady_worker(name, names.split(","), args.tokens, args.rounds)
        print(MARKER + json.dumps(steady), flush=True)
        return
    runs = []
    for python in [] if args.render else args.python or [sys.executable]:
        found = {"python": python, "versions": versions(python), "models": {}}
        found |= {"date": str(datetime.date.today()), "runtime": int(RUNTIME.group(1))}
        for name in args.models:
            names = forms(python) if name in INLINED_ON else FORMS
            tried: dict[str, list[dict[str, Any]]] = {form: [] for form in names}
            for number in range(args.repeats):  # the forms in turn, so that drift falls on each alike
                for form in names:
                    start = time.perf_counter()
                    tried[form].append(result := run(python, args, "--worker", name, form))
                    print(
                        f"== torch {found['versions']['torch']} {name} {form} ({number + 1} of "
                        f"{args.repeats}): {result} ({time.perf_counter() - start:.0f} s)",
                        flush=True,
                    )
            by_form = found["models"][name] = {form: merged(results) for form, results in tried.items()}
            timed = [form for form, result in by_form.items() if "error" not in result]
            start = time.perf_counter()
            steady = run(python, args, "--steady", name, ",".join(timed)) if timed else {}
            print(
                f"== torch {found['versions']['torch']} {name} steady: {steady} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            for form in timed:
                if "error" in steady:
                    by_form[form] = {"error": f"timing: {steady['error']}"}
                else:
                    by_form[form]["ms"] = steady[form]
        runs.append(found)
        write(runs, args)  # each torch's rows as soon as they are measured: a run stopped keeps them
    if args.render:
        write(runs, args)


def write(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """versions.md and versions.json from the runs measured (with `--update` or `--render`, and the other
    torches' runs of the last versions.json)."""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.update or args.render:
        runs = kept(args.out, runs)
    from regionalize.bench.timing import STACK_DEPTHS

    dates = " and ".join(sorted({str(r["date"]) for r in runs}))
    header = (
        f"# The default rewrite by torch version\n\nMeasured on {dates} on {machine()}, CPU, "
        f"transformers {runs[0]['versions']['transformers']}, by `python scripts/bench_torch_versions.py "
        f"{' '.join('--python ' + str(r['python']) for r in runs)} --repeats {args.repeats}` "
        + (
            "(each torch's rows with `--update`, on the date and with the runtime beside them) "
            if args.update
            else ""
        )
        + f"(tokens {args.tokens}, {args.rounds} rounds). *First* is the first call (with `generate`, the "
        "first token), in fresh processes with an empty inductor cache, after an unrelated warm-up compile: "
        f"the median of {args.repeats} per cell, one of each form in turn. The time per "
        "call (per token with `generate`) is timed in one process per model that holds every form, in "
        "interleaved rounds (one of each form in turn), the median of the rounds, each round's calls made at "
        f"{len(STACK_DEPTHS)} depths of Python's stack in turn (at some depths CPython's data-stack chunks "
        "cost a call page faults, in any form: python/cpython issue 142183). Ratios are against the full "
        "compile."
    )
    (args.out / "versions.md").write_text(f"{header}\n\n{table(runs)}\n", encoding="utf-8")
    (args.out / "versions.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
