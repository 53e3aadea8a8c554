"""Compile time of full vs regional torch.compile, measured with `regionalize verify`.

Two models: the PyTorch regional-compilation recipe's stack of `Layer`s at several depths (this file is
itself the model file the codemod rewrites), and Llama from transformers, built from a small config
with random weights (nothing is downloaded). Each model goes through the whole verifier: equivalence,
checkpoint compatibility, graph accounting, steady-state latency, and compile time as the median
first call of fresh processes with empty inductor caches.

    python scripts/bench_compile.py [--depths 8 16 32 64] [--repeats 2] [--no-llama]

writes docs/results/compile.md (with every run's raw timing) and docs/results/compile-vs-depth.png.
Takes about 14 minutes on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from regionalize.bench.machine import machine

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
WIDTH = 64
BATCH = 16
DEPTHS = (8, 16, 32, 64)
LLAMA_LAYERS = 8
LLAMA_CACHE_LAYERS = 12  # past recompile_limit (8), to show what a per-layer KV-cache index does


class Layer(nn.Module):
    """The recipe's repeated block: Linear, ReLU, Linear, ReLU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(width, width)
        self.relu1 = nn.ReLU()
        self.linear2 = nn.Linear(width, width)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu2(self.linear2(self.relu1(self.linear1(x))))


class Recipe(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(WIDTH) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def make_recipe(depth: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    return Recipe(depth), (torch.randn(BATCH, WIDTH),)


# The verifier calls a factory without arguments: one per depth in DEPTHS.
make_8 = functools.partial(make_recipe, 8)
make_16 = functools.partial(make_recipe, 16)
make_32 = functools.partial(make_recipe, 32)
make_64 = functools.partial(make_recipe, 64)


def _llama(module: ModuleType, layers: int, use_cache: bool) -> tuple[nn.Module, tuple, dict]:
    config = module.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    ids = torch.randint(0, config.vocab_size, (1, 64))
    return module.LlamaForCausalLM(config), (ids,), {"use_cache": use_cache}


def make_llama(module: ModuleType) -> tuple[nn.Module, tuple, dict]:
    """Prefill without a KV cache: the blocks share one graph."""
    return _llama(module, LLAMA_LAYERS, use_cache=False)


def make_llama_cached(module: ModuleType) -> tuple[nn.Module, tuple, dict]:
    """With a DynamicCache each block guards on its own cache layer, so each one recompiles."""
    return _llama(module, LLAMA_CACHE_LAYERS, use_cache=True)


def run(label: str, model: str, factory: str, repeats: int, cold_start: bool, out: Path) -> dict[str, Any]:
    from regionalize.verify import run_verify

    json_out = out / f"{label}.json"
    start = time.perf_counter()
    code = run_verify(model, factory, None, "auto", repeats, str(json_out), cold_start=cold_start)
    result = json.loads(json_out.read_text())
    result["label"] = label
    result["wall_s"] = time.perf_counter() - start
    print(f"== {label}: exit {code} in {result['wall_s']:.0f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS), choices=DEPTHS)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per compile timing")
    parser.add_argument("--no-llama", dest="llama", action="store_false")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        for depth in args.depths:
            results.append(run(f"recipe-{depth}", __file__, f"make_{depth}", args.repeats, True, out))
        if args.llama:
            from transformers.models.llama import modeling_llama

            llama = modeling_llama.__file__
            factory = f"{__file__}:make_llama"
            results.append(run(f"llama-{LLAMA_LAYERS}", llama, factory, args.repeats, True, out))
            # Accounting only: the point is the recompiles, not the timings.
            results.append(
                run(
                    f"llama-{LLAMA_CACHE_LAYERS}-kv-cache",
                    llama,
                    f"{__file__}:make_llama_cached",
                    args.repeats,
                    False,
                    out,
                )
            )
    DOCS.mkdir(parents=True, exist_ok=True)
    plot([r for r in results if r["label"].startswith("recipe-")], DOCS / "compile-vs-depth.png")
    (DOCS / "compile.md").write_text(markdown(results, args.repeats))
    print(f"wrote {DOCS / 'compile.md'}, {DOCS / 'compile-vs-depth.png'}")


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [int(r["label"].split("-")[1]) for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, color in (("full", "tab:red"), ("regional", "tab:blue")):
        ax.plot(
            depths,
            [r["compile_s"][variant] for r in results],
            "o-",
            color=color,
            label=f"{variant}, after a warm-up compile",
        )
        ax.plot(
            depths,
            [r["compile_cold_s"][variant] for r in results],
            "s--",
            color=color,
            alpha=0.6,
            label=f"{variant}, cold process",
        )
    ax.set_xlabel("depth (number of repeated Layer blocks)")
    ax.set_ylabel("first call, s (median of fresh processes)")
    ax.set_xticks(depths)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(
        f"torch.compile of the regional-compilation recipe model ({results[0]['device']}, "
        f"torch {results[0]['torch_version']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(results: list[dict[str, Any]], repeats: int) -> str:
    first = results[0]
    lines = [
        "# Compile time: full vs regional torch.compile",
        "",
        f"Measured by `python scripts/bench_compile.py --repeats {repeats}` on {datetime.date.today()}: "
        f"torch {first['torch_version']}, device {first['device']}, {machine()}.",
        "",
        "Each compile time is the first inference call (eval, no autograd) of the model, the median of "
        f"{repeats} fresh processes with an empty `TORCHINDUCTOR_CACHE_DIR`. *Warm* processes first "
        "compile an unrelated function, which pays inductor's one-time start-up (about 10 s on CPU) that "
        "otherwise hides the difference; *cold* is the first compile of the process. *Regional* is the "
        "codemod's default rewrite (`block.compile()` on each block); *full* is `torch.compile(model)` of "
        "the original.",
        "",
        "| model | full, warm | regional, warm | speedup | full, cold | regional, cold | speedup "
        "| graphs full / regional | recompiles (regional) | steady eager / full / regional | equivalent "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["label"],
                    _s(r["compile_s"]["full"]),
                    _s(r["compile_s"]["regional"]),
                    _x(r["compile_speedup"]),
                    _s(r["compile_cold_s"]["full"]),
                    _s(r["compile_cold_s"]["regional"]),
                    _x(r["compile_cold_speedup"]),
                    f"{r['graphs'].get('full', '-')} / {r['graphs'].get('regional', '-')}",
                    str(r["recompiles"].get("regional", "-"))
                    + (" (fell back to eager)" if r["fell_back_to_eager"] else ""),
                    " / ".join(_us(r["steady_us"][v]) for v in ("eager", "full", "regional")),
                    "yes" if r["equivalent"] and r["state_dict_compatible"] else "NO",
                    f"{r['max_abs_diff']:.2g}" if r["max_abs_diff"] is not None else "-",
                ]
            )
            + " |"
        )
    lines += ["", "![compile time vs depth](compile-vs-depth.png)", ""]
    for r in results:
        if r["fell_back_to_eager"]:
            account = r["accounting"]["regional"]
            reasons = "; ".join(f"`{k}` x{n}" for k, n in account["recompile_reasons"].items())
            lines += [f"**{r['label']}**: {account['fallback']}. Recompiles: {reasons}.", ""]
    lines += ["Every fresh-process run, in seconds (cold / warm):", ""]
    for r in results:
        for variant, runs in r["compile_runs"].items():
            cold = ", ".join(f"{s:.2f}" for s in runs["cold"])
            warm = ", ".join(f"{s:.2f}" for s in runs["warm"])
            lines.append(f"- {r['label']} {variant}: cold {cold}; warm {warm}")
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} us"


if __name__ == "__main__":
    main()
