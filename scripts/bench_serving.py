"""Serving a transformers decoder on a GPU: first generate, decode per token, peak memory (issue 37).

The model is transformers' `LlamaForCausalLM` in the Llama-3-8B shape (hidden 4096, 32 layers, 32 heads,
8 KV heads, intermediate 14336, vocab 128256), random weights, bf16, built on the GPU: nothing is
downloaded. A 128-token prompt, greedy `generate` of 32 new tokens (`min_new_tokens` = `max_new_tokens`).
Each variant runs in a fresh process with an empty Inductor (and Triton) cache, after one small unrelated
warm-up compile (a run without `--variants` runs all but `rewrite_static_cuda_graphs`, issue 37's seven):

- `eager`: the original model, DynamicCache;
- `full`: the original, `model.forward = torch.compile(model.forward)`, DynamicCache;
- `transformers_static`: the original, `generate(..., cache_implementation="static")`, which compiles the
  forward itself (transformers' CompileConfig, `mode="reduce-overhead"`): its documented GPU path;
- `rewrite`: the codemod's default rewrite of transformers' modeling_llama.py, DynamicCache;
- `rewrite_static`: the default rewrite with `cache_implementation="static"` and transformers' defaults
  (its auto-compile on CUDA included): what a user following transformers' docs gets after the rewrite;
- `rewrite_static_cuda_graphs`: the rewrite made with `--mode reduce-overhead`, `cache_implementation=
  "static"` (auto-compile on);
- `per_block`: the rewrite made with `--form per-block`, DynamicCache;
- `accelerate_regions`: the original through accelerate's `compile_regions`, DynamicCache.

With a DynamicCache, `generate` gets `disable_compile=True`. *First generate* is the process's first
32-token `generate`, every compile included; *decode* is (generate(32) - generate(1)) / 31, the median
of 5 rounds, with the CUDA graphs replayed per token. The memory-bound limit is the weights' bytes over
the device's copy bandwidth (a large `dst.copy_(src)`, 2 x bytes / time, median of several): the time a
token takes if every weight is read once at that speed. A small fp32 config of the same family (4 layers,
hidden 256) is generated eagerly and each variant's way, a process each, all at once before the variants
run (nothing is timed then), and each variant's tokens compared with eager's.

The GPU machine has no libcst, so the rewrites are made here first and carried along (`.bench/` is
gitignored). They must be made from the transformers the GPU machine has (5.17.0): the script checks
that the modeling_llama.py there is the one they were made from.

    # here: transformers' 5.17.0 wheel (no install), its modeling_llama.py rewritten three ways
    pip download transformers==5.17.0 --no-deps -d /tmp/tf517
    python scripts/bench_serving.py --prepare .bench/serving \\
        --transformers-wheel /tmp/tf517/transformers-5.17.0-py3-none-any.whl
    # on the GPU machine (carry [".whl", ".bench"], timeout_s 600): the benchmark with --hot, under a
    # timeout that leaves time to copy what it wrote into $OUT, then, in a second call, the CUDA tests
    bash scripts/gpu_checks.sh bench
    bash scripts/gpu_checks.sh tests
    # back here: the files it wrote, unchanged
    cp <files_at>/serving.md <files_at>/serving.json docs/results/serving/

`--hot` also times the restarts that issue 37's restart target compares (`RESTARTED` in
serving/settings.py: a full compile, the static-cache rewrites, transformers' own path): each variant's
first generate in one more process, without the warm-up compile, that finds the compile caches its first
process left on disk. They run after every variant's first process, so that a sitting cut short loses
restarts rather than rows. The header says where the sitting's time went (the bandwidth, the token
check, the first processes, the restarts) and each row's `phases` in serving.json where its process's.

Without `--rewritten-dir`, where libcst imports, the rewrites are made from the installed transformers
into a temporary folder. `--variants` runs a subset; `--no-token-check` leaves the fp32 check out.
Writes serving.md and serving.json to `--out` (docs/results/serving) after every variant, so that a run cut
short keeps what it measured. `--add` keeps the rows already there (same machine, versions and
settings): where one command cannot run them all, the rest are measured by the same two lines with
`--variants <the rest> --add`, after the first part's files are copied back into docs/results/serving (the
working tree, and so they, travel to the GPU machine); each row names its run, and rows are compared
within one. `--render` writes serving.md again from serving.json, measuring nothing. A smoke run of
the whole pipeline on CPU (tiny config, fp32, written to a temporary folder unless `--out` says
otherwise; never to docs/results/serving):

    python scripts/bench_serving.py --device cpu --smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serving.report import dynamo_text, kept, render, rewrites_of, write
from serving.rewrites import check_prepared, prepare
from serving.settings import CHECK, DEFAULT_VARIANTS, DOCS, LLAMA3_8B, RESTARTED, ROOT, SMOKE, VARIANTS
from serving.workers import WORKERS

RESULT = "BENCH_SERVING_RESULT "  # the line a worker prints its result on


def run_fresh(
    job: dict[str, Any], timeout: float, kept: str | None = None, threads: int | None = None
) -> dict[str, Any]:
    """One worker in a fresh process with empty Inductor and Triton caches, or with those in `kept`;
    Inductor compiles on `threads` (its default: a pool the size of the machine)."""
    with contextlib.ExitStack() as stack:
        cache = kept or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-cache-"))
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
        }
        env["PYTHONPATH"] = path
        if threads is not None:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        job = {**job, "spawned": time.time()}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        tail = done.stderr.strip().splitlines() or ["no output"]
        print("\n".join(tail[-15:]), file=sys.stderr, flush=True)
        return {"error": tail[-1][:300], "wall_s": wall}
    return {**json.loads(lines[-1].removeprefix(RESULT)), "wall_s": wall}


def token_check(job: dict[str, Any], variants: list[str], timeout: float) -> dict[str, Any]:
    """Each variant's fp32 tokens against eager's: a process a variant, all at once, each compiling on one
    thread (nothing is timed meanwhile: this runs before the variants)."""
    names = ["eager", *(v for v in variants if v != "eager")]

    def tokens(variant: str) -> dict[str, Any]:
        return run_fresh({**job, "kind": "tokens", "variant": variant}, timeout, threads=1)

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        found = dict(zip(names, pool.map(tokens, names), strict=True))
    expected = found["eager"].get("tokens")
    check: dict[str, Any] = {}
    for variant in variants:
        got = found[variant]
        if expected is None or "error" in got:
            error = got.get("error") or f"eager: {found['eager'].get('error')}"
            check[variant] = {"verdict": "error", "error": error}
            continue
        tokens = got["tokens"]
        longer = range(max(len(tokens), len(expected)))
        first = next((i for i in longer if tokens[i : i + 1] != expected[i : i + 1]), None)
        verdict = "identical" if first is None else "differ"
        check[variant] = {"verdict": verdict, "tokens": tokens, "first_differ": first}
    return check


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        job = json.loads(sys.argv[2])
        print(RESULT + json.dumps(WORKERS[job["kind"]](job), default=str), flush=True)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="write the rewrites to DIR and stop")
    parser.add_argument("--transformers-wheel", type=Path, help="with --prepare: rewrite this wheel's file")
    parser.add_argument("--rewritten-dir", type=Path, help="the rewrites --prepare wrote")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=DEFAULT_VARIANTS,
        choices=list(VARIANTS),
        help=f"default: {' '.join(DEFAULT_VARIANTS)}",
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="tiny config, fp32: the pipeline, no figures")
    parser.add_argument("--prompt-len", type=int, help="default 128 (smoke 8)")
    parser.add_argument("--tokens", type=int, help="new tokens per generate, default 32 (smoke 4)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-token-check", dest="token_check", action="store_false")
    parser.add_argument(
        "--hot",
        action="store_true",
        help=f"also time the restart of {', '.join(RESTARTED)} (those measured), after every variant's "
        "first process: the first generate in one more process that finds the compile caches the first "
        "left on disk",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process")
    parser.add_argument(
        "--out", type=Path, help="folder for serving.md/.json (docs/results/serving; smoke: a temp)"
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the rows already in --out from the same machine and versions (a run in parts)",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="write serving.md in --out (docs/results/serving) again from serving.json, measuring nothing",
    )
    args = parser.parse_args()
    if args.render:
        folder = args.out or DOCS
        if not (folder / "serving.json").is_file():
            sys.exit(f"error: {folder / 'serving.json'}: no such file to render")
        render(folder)
        print(f"wrote {folder / 'serving.md'}")
        return
    # A `timeout` around this script ends it with SIGTERM: as an exception, it ends the worker too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.prepare:
        manifest = prepare(args.prepare, args.transformers_wheel)
        print(f"wrote the rewrites of transformers {manifest['transformers']} to {args.prepare}")
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: no CUDA device (--device cpu --smoke runs the pipeline on CPU)")
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-serving-smoke-")) if args.smoke else DOCS)
    if args.smoke and out.resolve() == DOCS.resolve():
        sys.exit(f"error: a smoke run does not write to {DOCS}")
    out.mkdir(parents=True, exist_ok=True)
    variants = [v for v in VARIANTS if v in args.variants]
    temporary = prepared = None
    if any(VARIANTS[v][0] for v in variants):
        prepared = args.rewritten_dir
        if prepared is None:
            if importlib.util.find_spec("libcst") is None:
                sys.exit("error: no libcst here: make the rewrites with --prepare and pass --rewritten-dir")
            prepared = temporary = Path(tempfile.mkdtemp(prefix="bench-serving-rewrites-"))
            prepare(temporary, None)
    job_base = {
        "device": args.device,
        "dtype": "float32" if args.smoke else "bfloat16",
        "model": SMOKE if args.smoke else LLAMA3_8B,
        "check_model": SMOKE if args.smoke else CHECK,
        "prompt_len": args.prompt_len or (8 if args.smoke else 128),
        "tokens": args.tokens or (4 if args.smoke else 32),
        "rounds": args.rounds,
        "prepared": None if prepared is None else str(prepared.resolve()),
        "variants": variants,
        "copy_bytes": 2**26 if args.device == "cpu" else 2**30,
    }
    started = time.perf_counter()
    meta: dict[str, Any] = {
        "date": str(datetime.date.today()),
        "commands": [shlex.join(["python", "scripts/bench_serving.py", *sys.argv[1:]])],
        "device": args.device,
        "smoke": args.smoke,
        "prepared": None if prepared is None else check_prepared(prepared),
        **{k: job_base[k] for k in ("dtype", "model", "check_model", "prompt_len", "tokens", "rounds")},
    }
    stages = meta["stages"] = {}  # seconds each stage of this sitting took
    meta["bandwidth"] = run_fresh({**job_base, "kind": "bandwidth"}, args.timeout)
    stages["bandwidth_s"] = meta["bandwidth"]["wall_s"]
    print(f"== bandwidth: {json.dumps(meta['bandwidth'])}", flush=True)
    rows, check = kept(out, meta, variants, args.token_check) if args.add else ({}, {})

    def save() -> None:
        meta["wall_s"] = time.perf_counter() - started
        ordered = {v: rows[v] for v in VARIANTS if v in rows}
        write(out, meta, ordered, {v: check[v] for v in VARIANTS if v in check})

    if args.token_check:
        begun = time.perf_counter()
        check.update(token_check(job_base, variants, 2 * args.timeout))
        stages["token_check_s"] = time.perf_counter() - begun
        print(f"== tokens: { {v: c['verdict'] for v, c in check.items()} }", flush=True)
        save()
    with contextlib.ExitStack() as stack:
        caches = {}  # each variant's compile caches, which its restart finds
        stages["first_processes_s"] = 0.0
        for variant in variants:
            caches[variant] = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-cache-"))
            job = {**job_base, "kind": "variant", "variant": variant}
            rows[variant] = row = run_fresh(job, args.timeout, caches[variant])
            row["date"], row["rewrites"] = meta["date"], rewrites_of(meta, variant)
            stages["first_processes_s"] += row["wall_s"]
            summary = row.get("error") or (
                f"first generate {row['first_generate_s']:.2f} s, "
                f"decode {row['decode_ms_per_token']:.2f} ms/token, forms {row['forms']}, {dynamo_text(row)}"
            )
            print(f"== {variant} ({row['wall_s']:.0f} s): {summary}", flush=True)
            save()
        stages["restarts_s"] = 0.0
        for variant in [v for v in RESTARTED if args.hot and v in variants and "error" not in rows[v]]:
            row = rows[variant]
            job = {**job_base, "kind": "restart", "variant": variant}
            again = run_fresh(job, args.timeout, caches[variant])
            row["restart_first_generate_s"] = again.get("first_generate_s")
            row["restart_error"], row["restart_phases"] = again.get("error"), again.get("phases")
            stages["restarts_s"] += again["wall_s"]
            summary = again.get("error") or f"first generate {again['first_generate_s']:.2f} s"
            print(f"== {variant} restart ({again['wall_s']:.0f} s): {summary}", flush=True)
            save()
    if temporary is not None:
        shutil.rmtree(temporary, ignore_errors=True)
    print((out / "serving.md").read_text())
    print(f"wrote {out / 'serving.md'}, {out / 'serving.json'}")
    if any(c["verdict"] != "identical" for c in check.values()):
        sys.exit(1)  # the fp32 tokens are not all eager's


if __name__ == "__main__":
    main()
