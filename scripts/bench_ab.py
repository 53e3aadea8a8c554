"""One runtime against another, interleaved in one sitting: first call and per call of the forward, the
stochastic-depth, the decode and the libraries benchmarks' models under `regionalize.compile_regions`, each
in a fresh process with an empty Inductor cache, the two runtimes' processes taking turns.

    python scripts/bench_ab.py --base /path/to/other/checkout [--rounds 3] [--cases gpt-32 vit-24 ...]
        [--python PYTHON ...] [--also .venvs/torch-2.11.0/bin/python=gpt-32,beit-24 ...]
        [--json docs/results/runtime-ab.json]

`--base` is a checkout of the runtime compared against (a git worktree of an older commit); this
checkout is the other. Each process imports regionalize from its checkout (`PYTHONPATH`), builds the case's
model with a fixed seed, runs an unrelated warm-up compile, then times the first call (compile included;
for a decode case, the first `generate`) and the median of the steady calls (a decode case: a token).
Outputs are compared with eager's in the same process. Writes the JSON and a page beside it (.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FORWARD = ROOT / "docs" / "results" / "forward"
# The libraries benchmark's models (scripts/bench_libraries.py), built as it builds them.
LIBRARIES = ("unet", "flux", "convnext")
CASES = ("gpt-32", "vit-24", "llama-32", "beit-24", "llama-12-dynamic", "llama-12-static", *LIBRARIES)
TOKENS = 16


def _build(case: str) -> tuple[Any, tuple, dict]:
    """The case's model (eval, seeded) and the arguments of a call."""
    import importlib.util

    import torch

    torch.manual_seed(0)
    if case in LIBRARIES:
        sys.path.insert(0, str(ROOT / "scripts"))
        from bench_libraries import build

        return build(case)
    sys.path.insert(0, str(FORWARD))
    if case == "gpt-32":
        spec = importlib.util.spec_from_file_location("gpt", FORWARD / "gpt.py")
        gpt = importlib.util.module_from_spec(spec)
        sys.modules["gpt"] = gpt
        spec.loader.exec_module(gpt)
        model, args = gpt.build()
        return model.eval(), tuple(args), {}
    import models
    import transformers

    if case.startswith("llama-12"):
        config = transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=12,
        )
        ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
        return transformers.LlamaForCausalLM(config).eval(), (ids,), {}
    module = {
        "vit-24": transformers.models.vit.modeling_vit,
        "llama-32": transformers.models.llama.modeling_llama,
        "beit-24": transformers.models.beit.modeling_beit,
    }[case]
    built = getattr(models, case.replace("-", "_").replace("llama_32", "llama"))(module)
    model, args, kwargs = (*built, {})[:3]
    return model, tuple(args), kwargs


def _tensor(output: Any) -> Any:
    """A model's output as one tensor: a tuple's first item, or a transformers output's first field."""
    return output if hasattr(output, "shape") else output[0]


def child(case: str) -> dict:
    """Run in a fresh process: the case's timings, as a dict."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ab-inductor-")
    import torch

    import regionalize

    torch.compile(lambda x: torch.sin(x) + 1)(torch.ones(4))  # an unrelated warm-up compile
    model, args, kwargs = _build(case)
    decode = case.startswith("llama-12")
    generate: dict[str, Any] = {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS, "do_sample": False}
    if case.endswith("static"):
        generate["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(*args, **generate) if decode else model(*args, **kwargs)
        regionalize.compile_regions(model)
        start = time.perf_counter()
        got = model.generate(*args, **generate) if decode else model(*args, **kwargs)
        first = time.perf_counter() - start
        if decode:
            same = bool(torch.equal(got, expected))
        else:
            same = bool(torch.allclose(_tensor(got), _tensor(expected), atol=1e-4, rtol=1e-4))
        times = []
        calls = 5 if decode else 100
        for _ in range(3):
            model.generate(*args, **generate) if decode else model(*args, **kwargs)
        for _ in range(calls):
            start = time.perf_counter()
            model.generate(*args, **generate) if decode else model(*args, **kwargs)
            times.append(time.perf_counter() - start)
    per = statistics.median(times) / (TOKENS if decode else 1)
    return {
        "first_s": round(first, 3),
        "per_call_ms": round(per * 1e3, 3),
        "same": same,
        "torch": torch.__version__,
        "file": regionalize.__file__,
    }


def run(python: str, checkout: Path, case: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [python, str(Path(__file__).resolve()), "--child", case],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=checkout,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="checkout of the runtime compared against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--python", nargs="+", default=[sys.executable], help="interpreters (one a torch)")
    parser.add_argument(
        "--also", nargs="+", default=[], metavar="PYTHON=CASE,CASE", help="more interpreters, some cases each"
    )
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "runtime-ab.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(child(options.child)))
        return
    if options.base is None:
        parser.error("--base is required")
    sides = {"base": options.base.resolve(), "this": ROOT}
    rows = []
    plan = [(python, case) for python in options.python for case in options.cases]
    for also in options.also:
        python, _, cases = also.partition("=")
        plan += [(python, case) for case in cases.split(",")]
    # Each side's processes run in its checkout: an interpreter named by a relative path, from here.
    plan = [(os.path.abspath(python) if os.sep in python else python, case) for python, case in plan]
    for round_ in range(options.rounds):
        for python, case in plan:
            for side in ("base", "this") if round_ % 2 == 0 else ("this", "base"):
                row = {"round": round_, "python": python, "case": case, "side": side}
                row.update(run(python, sides[side], case))
                print(json.dumps(row), flush=True)
                rows.append(row)
    write(options, sides, rows)


def write(options: argparse.Namespace, sides: dict, rows: list[dict]) -> None:
    from regionalize.bench.machine import machine

    commits = {
        side: subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for side, path in sides.items()
    }
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result = {"date": stamp, "machine": machine(), "commits": commits, "rows": rows}
    options.json.write_text(json.dumps(result, indent=1) + "\n")
    options.json.with_suffix(".md").write_text(render(result))


def render(result: dict) -> str:
    """The page: one row a torch and case, the medians of each side and their ratios."""
    commits = result["commits"]
    lines = [
        "# One runtime against another, interleaved",
        "",
        f"`python scripts/bench_ab.py` on {result['date']}, {result['machine']}:"
        f" `regionalize.compile_regions` at {commits['base']} (base) and {commits['this']} (this), each"
        " process fresh with an empty Inductor cache after an unrelated warm-up compile, the two taking"
        " turns. Medians over the rounds; a decode case's first call is its first `generate` of"
        f" {TOKENS} tokens, its per call a token.",
        "",
        "| torch | case | first call base / this | this / base | per call base / this | this / base |"
        " outputs as eager |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    keys = sorted({(r["python"], r["case"]) for r in result["rows"]}, key=lambda k: (k[0], CASES.index(k[1])))
    lines += [_row(result["rows"], python, case) for python, case in keys]
    lines += ["", "Every run: [runtime-ab.json](runtime-ab.json).", ""]
    return "\n".join(lines)


def _row(rows: list[dict], python: str, case: str) -> str:
    medians, ok, version = {}, True, "?"
    for side in ("base", "this"):
        runs = [r for r in rows if (r["python"], r["case"], r["side"]) == (python, case, side)]
        good = [r for r in runs if "error" not in r]
        ok = ok and bool(good) and len(good) == len(runs) and all(r["same"] for r in good)
        version = good[0]["torch"] if good else version
        nan = float("nan")
        medians[side] = (
            statistics.median(r["first_s"] for r in good) if good else nan,
            statistics.median(r["per_call_ms"] for r in good) if good else nan,
        )
    (base_first, base_call), (first, call) = medians["base"], medians["this"]
    return (
        f"| {version} | {case} | {base_first:.2f} s / {first:.2f} s | {first / base_first:.2f}x"
        f" | {base_call:.2f} ms / {call:.2f} ms | {call / base_call:.2f}x | {'yes' if ok else 'no'} |"
    )


if __name__ == "__main__":
    main()
