"""Serving a transformers decoder on a GPU: first generate, decode per token, peak memory (issue 37).

The model is transformers' `LlamaForCausalLM` in the Llama-3-8B shape (hidden 4096, 32 layers, 32 heads,
8 KV heads, intermediate 14336, vocab 128256), random weights, bf16, built on the GPU: nothing is
downloaded. A 128-token prompt, greedy `generate` of 32 new tokens (`min_new_tokens` = `max_new_tokens`).
Each variant runs in a fresh process with an empty Inductor (and Triton) cache, after one small unrelated
warm-up compile:

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
hidden 256) is generated eagerly and each variant's way in one more process, and its tokens compared
with eager's.

The GPU machine has no libcst, so the rewrites are made here first and carried along (`.bench/` is
gitignored). They must be made from the transformers the GPU machine has (5.17.0): the script checks
that the modeling_llama.py there is the one they were made from.

    # here: transformers' 5.17.0 wheel (no install), its modeling_llama.py rewritten three ways
    pip download transformers==5.17.0 --no-deps -d /tmp/tf517
    python scripts/bench_serving.py --prepare .bench/serving \\
        --transformers-wheel /tmp/tf517/transformers-5.17.0-py3-none-any.whl
    # on the GPU machine, about 8 minutes: one device run of both lines (joined by `;`: the copy runs
    # even where the timeout cuts the benchmark short), carry [".bench/serving"], timeout_s 600:
    timeout 570 python scripts/bench_serving.py --rewritten-dir .bench/serving
    cp docs/serving/serving.* "$OUT"/
    # back here: the files it wrote, unchanged
    cp <files_at>/serving.md <files_at>/serving.json docs/serving/

`--hot` also times each compiled variant's restart: its first generate in one more process, without the
warm-up compile, that finds the compile caches the first process left on disk.

Without `--rewritten-dir`, where libcst imports, the rewrites are made from the installed transformers
into a temporary folder. `--variants` runs a subset; `--no-token-check` leaves the fp32 check out.
Writes serving.md and serving.json to `--out` (docs/serving) after every variant, so that a run cut
short keeps what it measured. `--add` keeps the rows already there (same machine, versions and
settings): where one command cannot run them all, the rest are measured by the same two lines with
`--variants <the rest> --add`, after the first part's files are copied back into docs/serving (the
working tree, and so they, travel to the GPU machine). A smoke run of the whole pipeline on CPU (tiny
config, fp32, written to a temporary folder unless `--out` says otherwise; never to docs/serving):

    python scripts/bench_serving.py --device cpu --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "serving"
MODELING = "transformers.models.llama.modeling_llama"
LLAMA_DIR = "transformers/models/llama/"
RESULT = "BENCH_SERVING_RESULT "  # the line a worker prints its result on
# The rewrites of modeling_llama.py, by the codemod's Options.
REWRITES: dict[str, dict[str, str]] = {
    "default": {},
    "reduce_overhead": {"mode": "reduce-overhead"},
    "per_block": {"form": "per-block"},
}
# variant -> (rewrite or None for the original, how it is compiled, the cache `generate` uses)
VARIANTS: dict[str, tuple[str | None, str, str]] = {
    "eager": (None, "none", "dynamic"),
    "full": (None, "full", "dynamic"),
    "transformers_static": (None, "transformers", "static"),
    "rewrite": ("default", "rewrite", "dynamic"),
    "rewrite_static": ("default", "rewrite + transformers", "static"),
    "rewrite_static_cuda_graphs": ("reduce_overhead", "rewrite + transformers", "static"),
    "per_block": ("per_block", "rewrite", "dynamic"),
    "accelerate_regions": (None, "accelerate", "dynamic"),
}
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # the prompt avoids them
LLAMA3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
}
CHECK = {  # the fp32 token check: same family, small
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
SMOKE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
TARGET_SOONER, TARGET_LIMIT = 5.0, 1.5  # issue 37's targets
TARGETS = (
    f"first generate >= {TARGET_SOONER:g}x sooner than full",
    f"decode <= {TARGET_LIMIT:g}x the memory-bound limit",
    "decode no slower than transformers_static",
    "tokens identical in fp32",
    "no eager fallback",
    "restart no later than full's",
)


# -- the rewrites: made where libcst imports, loaded where it need not -------------------------------------


def installed_modeling_file() -> Path:
    spec = importlib.util.find_spec(MODELING)
    assert spec is not None and spec.origin, f"cannot find {MODELING}"
    return Path(spec.origin)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare(out: Path, wheel: Path | None) -> dict[str, Any]:
    """Write the rewrites of modeling_llama.py (of `wheel`, or of the installed transformers), the runtime
    they import as `transformers._regionalize`, and manifest.json saying what they were made from."""
    from regionalize.codemod import transform_source
    from regionalize.codemod.runtime_copy import VERSION, runtime_text
    from regionalize.shared.options import Options

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-serving-wheel-") as unpacked:
        if wheel is not None:
            # The file inside its package tree, so that the codemod sees a module of the transformers
            # package (the runtime imported from its top) and reads the package's own modules that the
            # file imports from; the other models are left out.
            with zipfile.ZipFile(wheel) as archive:
                for name in archive.namelist():
                    model = name.startswith("transformers/models/") and name.count("/") > 2
                    if name.startswith("transformers/") and (not model or name.startswith(LLAMA_DIR)):
                        archive.extract(name, unpacked)
            path, version = Path(unpacked) / LLAMA_DIR / "modeling_llama.py", wheel.name.split("-")[1]
        else:
            import importlib.metadata

            path, version = installed_modeling_file(), importlib.metadata.version("transformers")
        source = path.read_text(encoding="utf-8")
        files = {}
        for key, settings in REWRITES.items():
            result = transform_source(source, Options(**settings), str(path))
            assert result.status == "success", f"{key}: {result.status}: {result.reason}"
            assert "from ..._regionalize import" in result.code, f"{key}: the runtime is not imported"
            name = f"modeling_llama__{key}.py"
            (out / name).write_text(result.code, encoding="utf-8")
            files[key] = {"file": name, "options": settings}
    (out / "_regionalize.py").write_text(runtime_text(), encoding="utf-8")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    manifest = {
        "transformers": version,
        "source_sha256": sha256(source),
        "runtime": VERSION,
        "regionalize_commit": commit or None,
        "rewrites": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_prepared(prepared: Path) -> dict[str, Any]:
    """The manifest, once the installed modeling_llama.py is known to be the file it was made from."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    here = installed_modeling_file().read_text(encoding="utf-8")
    if sha256(here) != manifest["source_sha256"]:
        import importlib.metadata

        installed = importlib.metadata.version("transformers")
        sys.exit(
            f"error: {prepared} holds rewrites of transformers {manifest['transformers']}'s "
            f"modeling_llama.py; this machine has transformers {installed}, whose file differs: make them "
            f"again with --prepare and --transformers-wheel (transformers-{installed}-py3-none-any.whl)"
        )
    return manifest


def load_rewritten(prepared: Path, key: str) -> ModuleType:
    """The rewrite `key`, imported as a sibling of transformers' module (relative imports resolve in its
    package), its runtime as the package's `transformers._regionalize`, as regionalize verify does."""
    runtime_name = "transformers._regionalize"
    if runtime_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(runtime_name, prepared / "_regionalize.py")
        assert spec is not None and spec.loader is not None
        runtime = importlib.util.module_from_spec(spec)
        sys.modules[runtime_name] = runtime
        spec.loader.exec_module(runtime)
    path = (prepared / f"modeling_llama__{key}.py").resolve()
    name = f"{MODELING}__regionalized_{key}"
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)  # Dynamo, tracebacks and inspect read the lines back from it
    sys.modules[name] = module  # registered before running, as an import does
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


# -- the workers (fresh processes) -------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Any, device: str) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def warm_up(device: str) -> None:
    """A compile unrelated to the model: the backend's one-time start-up is not the model's."""
    import torch

    def unrelated(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ x.T).softmax(-1).sum(0)

    torch.compile(unrelated)(torch.randn(32, 32, device=device))
    sync(device)


def build(job: dict[str, Any], variant: str, sizes: dict[str, int], dtype_name: str) -> tuple[Any, dict]:
    """The variant's model (weights from seed 0, built on the device) and the keywords of its generate."""
    import torch
    import transformers

    rewrite, how, cache = VARIANTS[variant]
    if rewrite is None:
        module = importlib.import_module(MODELING)
    else:
        module = load_rewritten(Path(job["prepared"]), rewrite)
    config = transformers.LlamaConfig(**sizes, **SPECIAL)
    torch.manual_seed(0)
    with torch.device(job["device"]):
        model = module.LlamaForCausalLM._from_config(config, dtype=getattr(torch, dtype_name))
    model.eval()
    if how == "full":
        model.forward = torch.compile(model.forward)
    elif how == "accelerate":
        from accelerate.utils import compile_regions

        model = compile_regions(model)
    extra = {"cache_implementation": "static"} if cache == "static" else {"disable_compile": True}
    return model, extra


def prompt(job: dict[str, Any], vocab: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, job["prompt_len"]), generator=generator)
    return ids.to(job["device"])


def generate(model: Any, ids: Any, tokens: int, extra: dict[str, Any]) -> Any:
    import torch

    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            **extra,
        )


def dynamo_account(body: Any) -> tuple[Any, dict[str, Any]]:
    """Run `body`, with what Dynamo did in it: regionalize's accounting where it imports (graph breaks,
    recompiles, eager fallback at a recompile limit), else Dynamo's counters alone."""
    from torch._dynamo.utils import counters

    try:
        from regionalize.verify.accounting import recording
    except Exception:  # optional: the verifier may be elsewhere or changing
        recording = None
    if recording is None:
        counters.clear()
    with recording() if recording is not None else contextlib.nullcontext() as account:
        out = body()
    found: dict[str, Any] = {
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "fell_back_to_eager": None,
    }
    if account is not None:
        found.update(account.to_json())
    return out, found


def served_forms(model: Any) -> dict[str, str] | None:
    try:
        from regionalize.verify.accounting import served_forms as forms
    except Exception:
        return None
    return forms(model)


def restart_worker(job: dict[str, Any]) -> dict[str, Any]:
    """A restarted service's first generate: the compile caches an earlier process left on disk found, no
    warm-up compile first (as `regionalize verify` times a hot start)."""
    import torch

    model, extra = build(job, job["variant"], job["model"], job["dtype"])
    ids = prompt(job, job["model"]["vocab_size"])
    # torch.compile's own imports paid before the clock starts, as the variants that call it at build do.
    torch.compile(lambda: None)
    first, _ = timed(lambda: generate(model, ids, job["tokens"], extra), job["device"])
    return {"variant": job["variant"], "first_generate_s": first}


def variant_worker(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    device, variant = job["device"], job["variant"]
    warm_up(device)
    model, extra = build(job, variant, job["model"], job["dtype"])
    ids = prompt(job, job["model"]["vocab_size"])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    (first, _), account = dynamo_account(
        lambda: timed(lambda: generate(model, ids, job["tokens"], extra), device)
    )
    generate(model, ids, 1, extra)  # untimed: whatever the one-token call alone compiles or captures
    generate(model, ids, job["tokens"], extra)
    rounds = []
    for _ in range(job["rounds"]):
        one, _ = timed(lambda: generate(model, ids, 1, extra), device)
        many, _ = timed(lambda: generate(model, ids, job["tokens"], extra), device)
        rounds.append(
            {"generate_1_s": one, "generate_n_s": many, "ms": (many - one) / (job["tokens"] - 1) * 1e3}
        )
    from torch._dynamo.utils import counters

    account["cudagraph_skips_all"] = counters["inductor"]["cudagraph_skips"]
    account["cuda_graphs_per_token"] = graphs_per_token(model, ids, job["tokens"], extra)
    return {
        "variant": variant,
        "first_generate_s": first,
        "decode_ms_per_token": statistics.median(r["ms"] for r in rounds),
        "rounds": rounds,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "dynamo": account,
        "forms": served_forms(model) if VARIANTS[variant][0] is not None else None,
    }


def graphs_per_token(model: Any, ids: Any, tokens: int, extra: dict[str, Any]) -> float | None:
    """CUDA graphs replayed per decode token, steady: (replays in generate(tokens) - in generate(1)) /
    (tokens - 1). None where regionalize's accounting does not import or no CUDA device is."""
    try:
        from regionalize.verify.accounting import counting_cuda_graphs
    except Exception:  # optional, as in dynamo_account
        return None
    replays = []
    for n in (1, tokens):
        with counting_cuda_graphs() as count:
            generate(model, ids, n, extra)
        if count is None:
            return None
        replays.append(count.replayed)
    return (replays[1] - replays[0]) / (tokens - 1)


def tokens_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The fp32 check: eager's tokens, then each variant's, in this one process (Dynamo reset between)."""
    import torch

    warm_up(job["device"])
    sizes = job["check_model"]
    ids = prompt(job, sizes["vocab_size"])
    expected = None
    found: dict[str, Any] = {}
    for variant in ["eager", *(v for v in job["variants"] if v != "eager")]:
        torch.compiler.reset()
        try:
            model, extra = build(job, variant, sizes, "float32")
            tokens = generate(model, ids, job["tokens"], extra)[0, job["prompt_len"] :].tolist()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            if variant == "eager":  # nothing to compare with
                return {v: {"verdict": "error", "error": f"eager: {error}"} for v in job["variants"]}
            found[variant] = {"verdict": "error", "error": error}
            continue
        if expected is None:
            expected = tokens
        same = tokens == expected
        first = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=True)) if a != b), None)
        found[variant] = {
            "verdict": "identical" if same else "differ",
            "tokens": tokens,
            "first_differ": first,
        }
        del model
    return found


def bandwidth_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Weight bytes (the model built on the meta device) and the device's copy bandwidth."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**job["model"], **SPECIAL)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=getattr(torch, job["dtype"]))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    device, size, copies = job["device"], job["copy_bytes"], 10
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(7):
        seconds, _ = timed(lambda: [dst.copy_(src) for _ in range(copies)], device)
        samples.append(seconds / copies)
    per_copy = statistics.median(samples)
    bandwidth = 2 * size / per_copy
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["transformers"] = transformers.__version__
    with contextlib.suppress(ImportError):
        import accelerate

        versions["accelerate"] = accelerate.__version__
    return {
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "CPU",
        "versions": versions,
        "weight_bytes": weight_bytes,
        "copy_bytes": size,
        "copy_s": samples,
        "bandwidth_gb_s": bandwidth / 1e9,
        "limit_ms_per_token": weight_bytes / bandwidth * 1e3,
    }


WORKERS = {
    "variant": variant_worker,
    "restart": restart_worker,
    "tokens": tokens_worker,
    "bandwidth": bandwidth_worker,
}


def run_fresh(job: dict[str, Any], timeout: float, kept: str | None = None) -> dict[str, Any]:
    """One worker in a fresh process with empty Inductor and Triton caches, or with those in `kept`."""
    with contextlib.ExitStack() as stack:
        cache = kept or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-cache-"))
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
        }
        env["PYTHONPATH"] = path
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


# -- the tables --------------------------------------------------------------------------------------------


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


def _restart(row: dict[str, Any]) -> str:
    if row.get("restart_error"):
        return f"error: {cell(row['restart_error'])}"
    seconds = row.get("restart_first_generate_s")
    return "-" if seconds is None else f"{seconds:.1f}"


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
    dates = " and ".join(sorted({meta["date"], *(row.get("date", meta["date"]) for row in rows.values())}))
    earlier: dict[str, list[str]] = {}  # rows measured on other rewrites than the last command's
    for variant, row in rows.items():
        if row.get("rewrites") not in (None, rewrites_of(meta, variant)):
            earlier.setdefault(row["rewrites"], []).append(variant)
    lines = [
        title,
        "",
        f"Measured by {' and '.join(f'`{c}`' for c in meta['commands'])} on {dates}: {meta['device']} "
        f"({bw.get('device_name', '?')}), "
        f"torch {versions.get('torch', '?')}, transformers {versions.get('transformers', '?')}, accelerate "
        f"{versions.get('accelerate', '-')}, Python {versions.get('python', '?')}; regionalize runtime "
        f"{prepared.get('runtime', '-')} (rewrites of transformers {prepared.get('transformers', '-')}'s "
        f"modeling_llama.py, regionalize {prepared.get('regionalize_commit', '-')}); "
        f"{(meta['wall_s'] + meta.get('earlier_wall_s', 0)) / 60:.1f} minutes in all. {limit_text}."
        + (" Each row is from the last of these commands that names its variant." if several else "")
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
        "| variant | first generate (s) | vs full (x sooner) | restart: first generate (s) "
        "| vs full's restart (x sooner) | decode ms/token | vs memory-bound limit (x) | peak memory "
        "| tokens (fp32 check) | form | Dynamo (first generate) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, row in rows.items():
        verdict = (check.get(variant) or {}).get("verdict", "-")
        if "error" in row:
            lines.append(f"| {variant} | error: {cell(row['error'])} | | | | | | | {verdict} | | |")
            continue
        r = ratios(row, rows, limit)
        memory = "-" if row["peak_memory_gib"] is None else f"{row['peak_memory_gib']:.1f} GiB"
        forms = cell("; ".join(f"{k}: {v}" for k, v in (row.get("forms") or {}).items()) or "-")
        if row.get("forms") == {}:  # a rewrite without an owner: --form per-block
            forms = "no owner: each block compiled on its own"
        lines.append(
            f"| {variant} | {row['first_generate_s']:.1f} | {_x(r['sooner_than_full'])} | "
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
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="tiny config, fp32: the pipeline, no figures")
    parser.add_argument("--prompt-len", type=int, help="default 128 (smoke 8)")
    parser.add_argument("--tokens", type=int, help="new tokens per generate, default 32 (smoke 4)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-token-check", dest="token_check", action="store_false")
    parser.add_argument(
        "--hot",
        action="store_true",
        help="also time each compiled variant's restart: its first generate in one more process that "
        "finds the compile caches the first left on disk",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process")
    parser.add_argument("--out", type=Path, help="folder for serving.md/.json (docs/serving; smoke: a temp)")
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the rows already in --out from the same machine and versions (a run in parts)",
    )
    args = parser.parse_args()
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
    meta["bandwidth"] = run_fresh({**job_base, "kind": "bandwidth"}, args.timeout)
    print(f"== bandwidth: {json.dumps(meta['bandwidth'])}", flush=True)
    rows, check = kept(out, meta, variants, args.token_check) if args.add else ({}, {})

    def save() -> None:
        meta["wall_s"] = time.perf_counter() - started
        ordered = {v: rows[v] for v in VARIANTS if v in rows}
        write(out, meta, ordered, {v: check[v] for v in VARIANTS if v in check})

    if args.token_check:
        found = run_fresh({**job_base, "kind": "tokens"}, 2 * args.timeout)
        meta["token_check_wall_s"] = found.pop("wall_s")
        error = found.pop("error", None)
        check.update({v: {"verdict": "error", "error": error} for v in variants} if error else found)
        print(f"== tokens: { {v: c['verdict'] for v, c in check.items()} }", flush=True)
        save()
    for variant in variants:
        job = {**job_base, "kind": "variant", "variant": variant}
        with tempfile.TemporaryDirectory(prefix="bench-serving-cache-") as cache:
            rows[variant] = row = run_fresh(job, args.timeout, cache)
            row["date"], row["rewrites"] = meta["date"], rewrites_of(meta, variant)
            if args.hot and variant != "eager" and "error" not in row:
                again = run_fresh({**job, "kind": "restart"}, args.timeout, cache)
                row["restart_first_generate_s"] = again.get("first_generate_s")
                row["restart_error"] = again.get("error")
        summary = row.get("error") or (
            f"first generate {row['first_generate_s']:.2f} s, "
            f"restart {row.get('restart_first_generate_s') or '-'} s, "
            f"decode {row['decode_ms_per_token']:.2f} ms/token, forms {row['forms']}, {dynamo_text(row)}"
        )
        print(f"== {variant} ({row['wall_s']:.0f} s): {summary}", flush=True)
        save()
    if temporary is not None:
        shutil.rmtree(temporary, ignore_errors=True)
    print((out / "serving.md").read_text())
    print(f"wrote {out / 'serving.md'}, {out / 'serving.json'}")
    if any(c["verdict"] != "identical" for c in check.values()):
        sys.exit(1)  # the fp32 tokens are not all eager's


if __name__ == "__main__":
    main()
