"""Per-call speed and first call on a GPU: full compile, the rewrite's forms, and CUDA graphs.

    python scripts/bench_cuda.py [--batches 1 8] [--repeats 5] [--models gpt llama] [--variants ...]
                                 [--device cuda] [--add]

Models: a GPT-style stack of 32 blocks (defined here) and transformers' Llama with 16 layers (small
config, random weights, nothing downloaded), each built from the codemod's own output of its source.
Variants: eager; full (`model.compile()`), full with Dynamo's graph deduplication, full
`reduce-overhead`; hierarchical (the default rewrite: the blocks' owner compiled whole, each block a
nested region); per-block (`--form per-block`: each block compiled on its own); hierarchical with CUDA
graphs (`--mode reduce-overhead`: the owner's forward is one graph around the nested regions);
hierarchical with the depyf dispatcher (`--guard-bypass depyf`).

Each variant runs in a fresh process with an empty Inductor cache: first call (compile included), then
per-call time in `--repeats` rounds of 50 calls (median, min and max of the rounds), peak GPU memory,
the largest difference from eager over six calls whose outputs are all kept alive until the end, and
the form each owner of the rewrite ran in (whole, or per block after a fallback, and why).
Writes docs/results/cuda.md and docs/results/cuda.json; `--add` keeps the rows already there, so that a table
too long for one sitting can be measured in parts. `--device cpu` runs the same on CPU as a smoke test.
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
DOCS = ROOT / "docs" / "results"
VARIANTS = {
    "eager": None,
    "full": None,
    "full_dedup": None,
    "full_reduce_overhead": None,
    "hierarchical": {},
    "per_block": {"form": "per-block"},
    "hierarchical_cuda_graphs": {"mode": "reduce-overhead"},
    "hierarchical_depyf": {"guard_bypass": "depyf"},
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
    sys.modules[name] = module  # as an import would: Dynamo looks the regions' module up by name
    exec(compile(source, like.__file__ if like else name, "exec"), module.__dict__)
    return module


def rewritten(source: str, settings: dict[str, str]) -> str:
    from regionalize.codemod import transform_source
    from regionalize.shared.options import Options

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
    if variant == "full_dedup":
        torch._dynamo.config.use_graph_deduplication = True
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

    from regionalize.bench.accounting import served_forms

    result["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
    result["forms"] = served_forms(net)  # which form each owner ran in: whole, or per block and why
    return result


def run_fresh(model: str, variant: str, batch: int, repeats: int, device: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": path}
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


def table(results: list[dict[str, Any]], device_name: str, torch_version: str) -> str:
    lines = [
        f"# CUDA benchmark: {device_name}, torch {torch_version}",
        "",
        f"Generated {datetime.date.today()} by `python scripts/bench_cuda.py` (rows of several sittings",
        "joined with `--add`). Per call: median (min-max) of rounds of 50 calls; first call in a fresh",
        "process with an empty Inductor cache; max diff over six outputs all kept alive, against eager.",
        "*Hierarchical* is the default rewrite (the blocks' owner compiled whole, each block a nested",
        "region); *owners ran* says whether it ran whole or fell back per block (not recorded: a row",
        "measured before the script recorded it). A large max diff under full `reduce-overhead` is torch's",
        "CUDA-graph memory reuse: a later call overwrites the outputs kept from earlier ones (torch asks",
        "callers to clone them); the rewrite's CUDA-graph form returns copies.",
        "",
        "| model | batch | variant | first call | per call | peak memory | max diff | owners ran |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['variant']} | error: {r['error']} | | | | |")
            continue
        ms = r["ms_per_call"]
        memory = "-" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f} MiB"
        skips = f" ({r['cudagraph_skips']} CUDA-graph skips)" if r["cudagraph_skips"] else ""
        forms = "; ".join(f"{k}: {v}" for k, v in r.get("forms", {}).items())
        settings = VARIANTS[r["variant"]]
        owned = settings is not None and settings.get("form") != "per-block"
        forms = forms or ("not recorded" if owned else "-")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['variant']}{skips} | {r['first_call_s']:.2f} s | "
            f"{ms['median']:.3f} ms ({ms['min']:.3f}-{ms['max']:.3f}) | {memory} | {r['max_abs_diff']:.2e} | "
            f"{forms} |"
        )
    return "\n".join(lines) + "\n"


def kept(path: Path, device_name: str) -> list[dict[str, Any]]:
    """The rows of an earlier run on the same device, so that one table can be measured in parts."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if earlier["device"] != device_name or earlier.get("torch") != torch.__version__:
        where = f"{earlier['device']}, torch {earlier.get('torch')}"
        sys.exit(f"error: {path} was measured on {where}: not adding to it")
    return earlier["results"]


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
    parser.add_argument("--out", type=Path, default=DOCS / "cuda")
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the rows already in --out's JSON (from the same device) and replace those measured again",
    )
    parser.add_argument(
        "--table-only", action="store_true", help="write --out's table again from its JSON, measuring nothing"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available() and not args.table_only:
        sys.exit("error: no CUDA device (use --device cpu for a smoke test)")
    if args.table_only:
        measured = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(
            table(measured["results"], measured["device"], measured["torch"])
        )
        return
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    results = kept(args.out.with_suffix(".json"), name) if args.add else []
    for model in args.models:
        for batch in args.batches:
            for variant in args.variants:
                row = (model, variant, batch)
                results = [r for r in results if (r["model"], r["variant"], r["batch"]) != row]
                results.append(run_fresh(model, variant, batch, args.repeats, args.device))
                print(json.dumps(results[-1]), flush=True)
                results.sort(key=lambda r: (r["model"], r["batch"], list(VARIANTS).index(r["variant"])))
                # Written after every row: a sitting cut short keeps what it measured, for --add.
                args.out.with_suffix(".json").write_text(
                    json.dumps({"device": name, "torch": torch.__version__, "results": results}, indent=2)
                    + "\n"
                )
                args.out.with_suffix(".md").write_text(table(results, name, torch.__version__))
    print(table(results, name, torch.__version__))


if __name__ == "__main__":
    main()
