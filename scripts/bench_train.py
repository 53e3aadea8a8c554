"""Training steps side by side: the first step, a restart's first step, and the time per step.

Each model is built in the child process from a small config with seeded random weights (nothing downloaded)
and trained with AdamW: forward, loss, backward, optimizer step. Methods:

- `eager`: no compile; its losses are the reference.
- `full`: `model.compile()`, torch's full compile.
- `regions`: `regionalize.compile_regions(model)`, the runtime's default for a built model.
- `per-block`: `block.compile()` for each block, as torchtitan compiles a model for training.
- `whole`: the model compiled whole with each block a `torch.compiler.nested_compile_region` and Inductor's
  buffer reuse off, the form that training would take if the runtime compiled owners whole with backward
  (docs/form-hierarchical.md says why it does not). `whole-reuse` is the same with buffer reuse on, as
  Inductor's default is: its losses show whether Inductor differentiates such a graph correctly.

Kinds: `cold` (an empty `TORCHINDUCTOR_CACHE_DIR`) and `hot` (the same directory again, as a resumed job finds
it). Each round runs every method's cold then hot start, method after method, so methods interleave; the page
gives medians. Per step is the median of the steps after the warm-up in each process. Losses of the first
steps are compared with eager's; a model with drop path runs with `fallback_random` in every method, so that
compiled code draws the same random numbers as eager.

    python scripts/bench_train.py [--models llama-16 ...] [--methods full regions per-block] [--rounds 1]
        [--out docs/results/train/train]  # writes OUT.json and OUT.md; --render rewrites the page

`--child MODEL METHOD` runs one start in this process and prints its JSON record.
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # before torch's import: `process_to_first_step_s` counts from here

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCK = "/work/timing.lock"
METHODS = ("eager", "full", "regions", "per-block", "whole", "whole-reuse")
INTERLEAVED = ("full", "regions", "per-block")  # the methods whose steps take turns in one process
MODELS = (
    "llama-16",
    "llama-32",
    "gpt2-16",
    "gpt2-32",
    "beit-16",
    "llama-16-checkpointed",
    "beit-16-checkpointed",
)
WARMUP, STEPS, COMPARED = 3, 15, 8  # steps after the first: not timed, timed; losses compared with eager's
BATCH, TOKENS, WIDTH = 2, 64, 256


def build(name: str) -> tuple[Any, dict[str, Any], list[Any]]:
    """Returns the model, the keyword arguments of a training call, and its blocks."""
    import torch
    import transformers

    family, depth, *rest = name.split("-")
    layers = int(depth)
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=WIDTH, intermediate_size=688, num_hidden_layers=layers, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=1000, use_cache=False,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
        blocks = list(model.model.layers)
    elif family == "gpt2":
        config = transformers.GPT2Config(
            n_embd=WIDTH, n_layer=layers, n_head=8, vocab_size=1000, n_positions=TOKENS, use_cache=False,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
        blocks = list(model.transformer.h)
    else:  # a ViT with stochastic depth: BEiT's per-layer drop-path rates, in training mode
        import torch._inductor.config

        torch._inductor.config.fallback_random = True  # compiled drop path draws as eager does
        config = transformers.BeitConfig(
            hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_hidden_layers=layers, num_attention_heads=8,
            image_size=64, patch_size=8, drop_path_rate=0.1, num_labels=10,
        )  # fmt: skip
        model = transformers.BeitForImageClassification(config)
        blocks = list(model.beit.layers)
    if rest == ["checkpointed"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    generator = torch.Generator().manual_seed(1)
    if family == "beit":
        pixels = torch.randn(BATCH, 3, 64, 64, generator=generator)
        kwargs = {"pixel_values": pixels, "labels": torch.randint(0, 10, (BATCH,), generator=generator)}
    else:
        ids = torch.randint(0, 1000, (BATCH, TOKENS), generator=generator)
        kwargs = {"input_ids": ids, "labels": ids}
    return model, kwargs, blocks


def compile_model(model: Any, blocks: list[Any], method: str) -> Any:
    """Returns what a training step calls for `method`."""
    import torch

    if method == "full":
        model.compile()
    elif method == "regions":
        sys.path.insert(0, str(ROOT))
        from regionalize.runtime import compile_regions

        return compile_regions(model)
    elif method == "per-block":
        for block in blocks:
            block.compile()
    elif method.startswith("whole"):
        cls = type(blocks[0])
        region = torch.compiler.nested_compile_region(cls.forward)
        cls.forward = lambda self, *args, **kwargs: region(self, *args, **kwargs)
        options = {} if method == "whole-reuse" else {"allow_buffer_reuse": False}
        return torch.compile(model, fullgraph=True, options=options)
    return model


def train_step(call: Any, kwargs: dict[str, Any], optimizer: Any, seed: int) -> tuple[float, float]:
    """Runs one training step (forward, loss, backward, the optimizer's step) and returns its loss and
    seconds."""
    import torch

    torch.manual_seed(seed)
    began = time.perf_counter()
    loss = call(**kwargs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item(), time.perf_counter() - began


def child(name: str, method: str) -> dict[str, Any]:
    """Trains `name` compiled by `method` for a few steps and returns the start, per step and losses."""
    import torch

    model, kwargs, blocks = build(name)
    # torch.compile's own imports (Inductor's), paid before the clock by every method, as verify's worker
    # does: `full` and `per-block` pay them in `compile_model`, the runtime at its first call.
    torch.compile(lambda: None)
    call = compile_model(model, blocks, method)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times = [], []
    for step in range(1 + WARMUP + STEPS):
        loss, seconds = train_step(call, kwargs, optimizer, step)
        losses.append(loss)
        times.append(seconds)
        if step == 0:
            started = time.perf_counter() - _START
    return {
        "first_step_s": times[0],
        "process_to_first_step_s": started,
        "per_step_ms": statistics.median(times[1 + WARMUP :]) * 1e3,
        "losses": losses[:COMPARED],
    }


def interleaved(name: str, rounds: int = 30) -> dict[str, Any]:
    """Times steps of a full compile, `regions` and `per-block` taking turns in one process, from the same
    weights, and returns each one's median: steps in one process vary less than across processes.

    The order reverses every turn, because a step runs slower or faster for the step that ran before it."""
    import copy

    import torch

    model, kwargs, blocks = build(name)
    trained = {}
    for method in INTERLEAVED:
        twin = copy.deepcopy(model)
        twin_blocks = [b for b in twin.modules() if type(b) is type(blocks[0])]
        call = compile_model(twin, twin_blocks, method)
        trained[method] = call, torch.optim.AdamW(twin.parameters(), lr=1e-4), []
    turn = list(trained.values())
    for index in range(WARMUP + rounds):
        for call, optimizer, times in turn if index % 2 else reversed(turn):
            seconds = train_step(call, kwargs, optimizer, index)[1]
            if index >= WARMUP:
                times.append(seconds)
    return {"per_step_ms": {m: statistics.median(t) * 1e3 for m, (_, _, t) in trained.items()}}


def run(name: str, method: str, cache: str) -> dict[str, Any]:
    """Runs one start in a fresh process, under the timing lock, on the Inductor cache `cache`."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    command = ["flock", LOCK, sys.executable, __file__, "--child", name, method]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(models: list[str], methods: list[str], rounds: int, turns: bool) -> dict[str, Any]:
    """Runs every model's methods cold then hot, `rounds` times, and with `turns` the steps taking turns
    in one process once a round; returns the records."""
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for _ in range(rounds):
        for name in models:
            for method in [*methods, *(["interleaved"] if turns else [])]:
                with tempfile.TemporaryDirectory() as cache:
                    for kind in ("cold", "hot") if method != "interleaved" else ("one process",):
                        record = run(name, method, cache)
                        key = f"{method} {kind}" if method != "interleaved" else method
                        cells.setdefault(name, {}).setdefault(key, []).append(record)
                        print(name, method, kind, json.dumps(record)[:160], flush=True)
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    from regionalize.codemod.runtime_copy import VERSION

    return {
        "date": datetime.date.today().isoformat(),
        "runtime": VERSION,
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, Python {platform.python_version()}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "batch": [BATCH, TOKENS],
        "width": WIDTH,
        "steps": [WARMUP, STEPS],
        "rounds": rounds,
        "cells": cells,
    }


def median(
    cells: dict[str, list[dict[str, Any]]], method: str, kinds: tuple[str, ...], key: str
) -> float | None:
    """The median of `key` over `method`'s records of `kinds` ("interleaved": the steps taking turns)."""
    if kinds == ("interleaved",):
        values = [r[key][method] for r in cells.get("interleaved", []) if method in r.get(key, {})]
    else:
        values = [r[key] for kind in kinds for r in cells.get(f"{method} {kind}", []) if key in r]
    return statistics.median(values) if values else None


# Each column: its name, the records it reads, their figure.
FIGURES = (
    ("first step", ("cold",), "first_step_s"),
    ("restart", ("hot",), "first_step_s"),
    ("per step, own process", ("cold", "hot"), "per_step_ms"),
    ("per step, taking turns", ("interleaved",), "per_step_ms"),
)


def markdown(results: dict[str, Any], source: str) -> str:
    """Renders the page: per model, each method's first step, restart and per step against full's."""
    header = " | ".join(f"{name} | vs full" for name, _, _ in FIGURES)
    lines = [
        "# Training steps: first step, restart and per step",
        "",
        f"Written by `scripts/bench_train.py` from {source}; do not edit. "
        f"{results['machine']}, torch {results['torch']}, transformers {results['transformers']}, "
        f"{results['date']}, runtime {results['runtime']}. Batch {results['batch'][0]}x{results['batch'][1]} "
        f"(BEiT: 2 images of 64x64), width {results['width']}, AdamW. Medians of {results['rounds']} "
        "round(s), one fresh process a cell, methods one after another. The first step is timed from its "
        "call, after the imports, torch.compile's included, and the model's build (train.json also keeps the "
        "time from the process's start); the restart is a second process on the first one's compile caches. "
        f"*Per step, own process*: the median of {results['steps'][1]} steps after {results['steps'][0]} "
        "untimed ones, in each process. *Per step, taking turns*: full, `regions` and `per-block` copies of "
        "one model in one process, a step each in turn, 30 turns, the order reversed every turn: steps in "
        "one process vary less than across processes. "
        "*Loss vs eager*: the largest difference from eager's loss over the first 8 steps (fp32).",
        "",
        f"| model | method | {header} | loss vs eager |",
        "|---|---|" + "---|---|" * len(FIGURES) + "---|",
    ]
    for name, cells in results["cells"].items():
        eager = next((r["losses"] for r in cells.get("eager cold", []) if "losses" in r), None)
        for method in METHODS[1:]:
            if f"{method} cold" not in cells:
                continue
            row = [name, method]
            for _, kinds, key in FIGURES:
                full, value = median(cells, "full", kinds, key), median(cells, method, kinds, key)
                row += [_fmt(value, key), _ratio(full, value, sooner=key != "per_step_ms")]
            row.append(_loss(cells, method, eager))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _loss(cells: dict[str, list[dict[str, Any]]], method: str, eager: list[float] | None) -> str:
    """The largest difference from eager's losses, or the errors that stopped the method."""
    records = cells[f"{method} cold"] + cells.get(f"{method} hot", [])
    errors = sorted({r["error"] for r in records if "error" in r})
    if errors:
        return "error: " + "; ".join(errors)
    losses = next((r["losses"] for r in records if "losses" in r), None)
    if not losses or not eager:
        return "n/a"
    return f"{max(abs(a - b) for a, b in zip(losses, eager, strict=True)):.1e}"


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f} ms" if key == "per_step_ms" else f"{value:.2f} s"


def _ratio(full: float | None, value: float | None, sooner: bool) -> str:
    """Full's time over this one's for a start (x sooner), this one's over full's for a step (x its time)."""
    if not full or not value:
        return "n/a"
    return f"{full / value:.2f}x" if sooner else f"{value / full:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS[:5]), choices=MODELS)
    parser.add_argument(
        "--methods", nargs="*", default=["eager", "full", "regions", "per-block"], choices=METHODS
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="also time the steps of full, regions and per-block in turns",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "train" / "train")
    parser.add_argument(
        "--render", action="store_true", help="rewrite OUT.md from OUT.json, measuring nothing"
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, method = args.child
        print(json.dumps(interleaved(name) if method == "interleaved" else child(name, method)))
        return
    # Named by appending, so that an OUT with a dot of its own (a torch version) keeps it.
    json_path, page = (args.out.parent / f"{args.out.name}{suffix}" for suffix in (".json", ".md"))
    if args.render:
        results = json.loads(json_path.read_text())
    else:
        results = measure(args.models, args.methods, args.rounds, args.interleaved)
        if json_path.exists():  # a run of some models or methods keeps the others' records
            kept = json.loads(json_path.read_text())["cells"]
            for name, cells in results["cells"].items():
                kept[name] = {**kept.get(name, {}), **cells}
            results["cells"] = kept
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
    page.write_text(markdown(results, json_path.name))
    print(page.read_text())


if __name__ == "__main__":
    main()
