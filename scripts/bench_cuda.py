"""Per-call speed and first call on a GPU: full compile, regional, and regional with CUDA graphs.

    python scripts/bench_cuda.py [--batches 1 8] [--repeats 5] [--models gpt llama] [--device cuda]

Models: a GPT-style stack of 32 blocks (defined here) and transformers' Llama with 16 layers (small
config, random weights, nothing downloaded), each built from the codemod's own output of its source.
Variants: eager; full (`model.compile()`), full `reduce-overhead`; regional (the default rewrite);
regional with CUDA graphs (`--mode reduce-overhead`: the owner's forward is one graph around nested
block regions); regional with the depyf dispatcher (`--guard-bypass depyf`).

Each variant runs in a fresh process with an empty Inductor cache: first call (compile included), then
per-call time in `--repeats` rounds of 50 calls (median, min and max of the rounds), peak GPU memory,
and the largest difference from eager over six calls whose outputs are all kept alive until the end.
Writes docs/bench_cuda.md and docs/bench_cuda.json. `--device cpu` runs the same on CPU as a smoke test.
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
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
VARIANTS = {
    "eager": None,
    "full": None,
    "full_reduce_overhead": None,
    "regional": {},
    "regional_cuda_graphs": {"mode": "reduce-overhead"},
    "regional_depyf": {"guard_bypass": "depyf"},
}

GPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=1024, d=512, heads=8, layers=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
"""


def module_from(source: str, name: str, like: ModuleType | None = None) -> ModuleType:
    module = ModuleType(name)
    if like is not None:  # a rewritten transformers file keeps its package for relative imports
        module.__package__, module.__file__ = like.__package__, like.__file__
        sys.modules[name] = module
    exec(compile(source, like.__file__ if like else name, "exec"), module.__dict__)
    return module


def rewritten(source: str, settings: dict[str, str]) -> str:
    from regionalize.codemod import transform_source
    from regionalize.options import Options

    result = transform_source(source, Options(**settings))
    assert result.status == "success", result.reason
    return result.code


def build(model: str, variant: str, device: str) -> tuple[torch.nn.Module, Any]:
    """The variant's model (weights from seed 0) and a function of input ids returning a tensor."""
    settings = VARIANTS[variant]
    if model == "gpt":
        source = GPT if settings is None else rewritten(GPT, settings)
        torch.manual_seed(0)
        net = module_from(source, "bench_gpt").GPT().to(device).eval()
        return net, net
    import transformers
    from transformers.models.llama import modeling_llama

    source = Path(modeling_llama.__file__).read_text(encoding="utf-8")
    module = (
        modeling_llama
        if settings is None
        else module_from(rewritten(source, settings), modeling_llama.__name__ + "_rgz", modeling_llama)
    )
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    net = module.LlamaForCausalLM(config).to(device).eval()
    return net, lambda ids: net(ids, use_cache=False).logits


def worker(model: str, variant: str, batch: int, repeats: int, device: str) -> dict[str, Any]:
    """One variant in this (fresh) process."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(1)
    length = 64 if model == "gpt" else 32
    inputs = [torch.randint(0, 1024, (batch, length), device=device) for _ in range(6)]
    eager, run_eager = build(model, "eager", device)
    with torch.no_grad():
        expected = [run_eager(x) for x in inputs]
    del eager, run_eager
    net, run = build(model, variant, device)
    if variant.startswith("full"):
        net.compile(**({"mode": "reduce-overhead"} if variant == "full_reduce_overhead" else {}))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result: dict[str, Any] = {"model": model, "variant": variant, "batch": batch}
    with torch.no_grad():
        sync()
        start = time.perf_counter()
        run(inputs[0])
        sync()
        result["first_call_s"] = time.perf_counter() - start
        for _ in range(10):
            run(inputs[0])
        kept = [run(x) for x in inputs]  # all alive while the later ones run
        sync()
        result["max_abs_diff"] = max(
            (k.float() - e.float()).abs().max().item() for k, e in zip(kept, expected, strict=True)
        )
        rounds = []
        for r in range(repeats):
            sync()
            start = time.perf_counter()
            for _ in range(50):
                run(inputs[r % len(inputs)])
            sync()
            rounds.append((time.perf_counter() - start) / 50 * 1000)
    result["ms_per_call"] = {"median": statistics.median(rounds), "min": min(rounds), "max": max(rounds)}
    result["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    from torch._dynamo.utils import counters

    result["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
    return result


def run_fresh(model: str, variant: str, batch: int, repeats: int, device: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, __file__, "--worker", model, variant, str(batch), str(repeats), device]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return {"model": model, "variant": variant, "batch": batch, "error": "timed out after 900 s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": model, "variant": variant, "batch": batch, "error": error[:300]}
    return json.loads(lines[-1])


def table(results: list[dict[str, Any]], device_name: str) -> str:
    lines = [
        f"# CUDA benchmark: {device_name}, torch {torch.__version__}",
        "",
        f"Generated {datetime.date.today()} by `python scripts/bench_cuda.py`. Per call: median (min-max) of",
        "rounds of 50 calls; first call in a fresh process with an empty Inductor cache; max diff over six",
        "kept outputs against eager.",
        "",
        "| model | batch | variant | first call | per call | peak memory | max diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['variant']} | error: {r['error']} | | | |")
            continue
        ms = r["ms_per_call"]
        memory = "-" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f} MiB"
        skips = f" ({r['cudagraph_skips']} CUDA-graph skips)" if r["cudagraph_skips"] else ""
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['variant']}{skips} | {r['first_call_s']:.2f} s | "
            f"{ms['median']:.3f} ms ({ms['min']:.3f}-{ms['max']:.3f}) | {memory} | {r['max_abs_diff']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, variant, batch, repeats, device = sys.argv[2:7]
        print(json.dumps(worker(model, variant, int(batch), int(repeats), device)))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["gpt", "llama"], choices=["gpt", "llama"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path, default=DOCS / "bench_cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device (use --device cpu for a smoke test)")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    results = []
    for model in args.models:
        for batch in args.batches:
            for variant in args.variants:
                results.append(run_fresh(model, variant, batch, args.repeats, args.device))
                print(json.dumps(results[-1]), flush=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"device": name, "results": results}, indent=2) + "\n"
    )
    args.out.with_suffix(".md").write_text(table(results, name))
    print(table(results, name))


if __name__ == "__main__":
    main()
