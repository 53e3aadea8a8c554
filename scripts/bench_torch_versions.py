"""The default rewrite against a full `torch.compile` and the per-block form, on each torch given.

Each torch lives in a virtual environment of its own with regionalize installed (`.ci/torch VERSION` makes
one). For each interpreter, each model and each form, one fresh process with an empty inductor cache:
an unrelated warm-up compile, then the first call (with `generate`, the first token), a whole run that
Dynamo's accounting watches (eager fallbacks, forms served), then the time per call or decode time per
token, the median of several rounds. Outputs are compared with eager's in that process: tokens must be
identical.

    python scripts/bench_torch_versions.py --python .venvs/torch-2.11.0/bin/python \\
        --python .venvs/torch-2.13.0/bin/python --python .venvs/torch-2.14.1/bin/python

writes docs/torch-versions/versions.md and versions.json. The models are 32 layers: the forward
benchmark's GPT-style stack and transformers' Llama (one forward, no cache), and transformers' Llama and
Qwen2 decoders from scripts/bench_decode.py (greedy generation with a `DynamicCache`). Never run it
beside anything else: on 2 cores another job's threads move every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = "BENCH_RESULT "
# name -> (model, factory, generate?)
MODELS = {
    "gpt-32": (str(ROOT / "docs/bench_forward/gpt.py"), "build", False),
    "llama-32": (
        "transformers.models.llama.modeling_llama",
        f"{ROOT}/docs/bench_forward/models.py:llama",
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


def worker(name: str, variant: str, tokens: int, rounds: int) -> dict[str, Any]:
    """One model in one form, in this (fresh) process."""
    import torch

    from regionalize.shared.options import Options
    from regionalize.verify.accounting import recording, served_forms
    from regionalize.verify.loading import import_paths, resolve_target
    from regionalize.verify.session import BY_NAME, Subject, Variant
    from regionalize.verify.timing import call, decode_timing, first_call_s, steady_us, warm_up
    from regionalize.verify.workloads import GenerateSpec

    model, factory, generate = MODELS[name]
    target = resolve_target(model, factory)
    options = Options()
    with import_paths(target), tempfile.TemporaryDirectory() as work:
        spec = GenerateSpec(tokens, 16) if generate else None
        subject = Subject(target, options, "cpu", Path(work), generate=spec)
        inlined = Variant(INLINED, {}, dynamo=(("inline_invoke_subgraph", True),))
        built = subject.build(inlined if variant == INLINED else BY_NAME[variant])
        warm_up(options, "cpu")
        torch.compiler.reset()
        first = first_call_s(built, "cpu")
        with recording() as account:
            out = call(built)
        eager = subject.build(BY_NAME["eager"])
        want = call(eager)
        if generate:
            steady = [decode_timing(built, "cpu", budget_s=1.0)[1] for _ in range(rounds)]
        else:
            steady = [steady_us(built, "cpu", budget_s=0.5) / 1000 for _ in range(rounds)]
    if generate:  # the tokens; their logits as a compiled model's can be, within the verifier's tolerance
        identical = torch.equal(out["tokens"], want["tokens"])
        out, want = out["logits"], want["logits"]
    else:
        identical = True
    same = torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(want)
    identical &= all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(*same, strict=True))
    return {
        "first_s": first,
        "ms": statistics.median(steady),
        "identical": identical,
        "fell_back_to_eager": account.fell_back_to_eager,
        "forms": served_forms(built.model),
    }


def run(python: str, name: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="bench-torch-versions-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [python, __file__, "--worker", name, variant, "--tokens", str(args.tokens)]
    try:
        done = subprocess.run(
            [*command, "--rounds", str(args.rounds)],
            capture_output=True,
            text=True,
            env=env,
            timeout=args.timeout,
            check=False,
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
        for name, by_form in run["models"].items():
            full = by_form["full"] if "error" not in by_form["full"] else {}
            unit = "ms/token" if "generate" in name else "ms"
            cells = [cell(by_form.get(form), full, unit) for form in (*FORMS, INLINED)]
            row = [run["versions"]["torch"], name, *cells, notes(by_form["regional"])]
            lines.append(f"| {' | '.join(row)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter with its torch (repeatable)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per generation")
    parser.add_argument("--rounds", type=int, default=5, help="steady-state rounds; the median is reported")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per process")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "torch-versions")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "FORM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(MARKER + json.dumps(worker(*args.worker, args.tokens, args.rounds)), flush=True)
        return
    runs = []
    for python in args.python or [sys.executable]:
        found = {"python": python, "versions": versions(python), "models": {}}
        for name in args.models:
            found["models"][name] = {}
            for form in forms(python) if name in INLINED_ON else FORMS:
                start = time.perf_counter()
                found["models"][name][form] = result = run(python, name, form, args)
                print(
                    f"== torch {found['versions']['torch']} {name} {form}: {result} "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
        runs.append(found)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    header = (
        f"# The default rewrite by torch version\n\nMeasured on {datetime.date.today()} on {machine}, CPU, "
        f"transformers {runs[0]['versions']['transformers']}, by `python scripts/bench_torch_versions.py "
        f"{' '.join('--python ' + str(r['python']) for r in runs)}` (tokens {args.tokens}, "
        f"{args.rounds} rounds). One fresh process per cell, an empty inductor cache, an unrelated "
        "warm-up compile first. *First* is the first call (with `generate`, the first token); the time per "
        "call (per token with `generate`) is the median of the rounds; ratios are against the full compile."
    )
    (args.out / "versions.md").write_text(f"{header}\n\n{table(runs)}\n", encoding="utf-8")
    (args.out / "versions.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
