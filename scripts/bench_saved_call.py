"""Per call with saving on against saving off, in one process: what a saved owner's own checks cost.

A saved owner runs the frame torch saved, after its guards and the runtime's checks of the guards torch drops
(`guard_reads.Watch`); an owner with saving off runs `torch.compile`'s frame. Two copies of one model (seeded
random weights, no downloads), one compiled each way, take turns in one process, so that the machine's
drift between processes does not enter the ratio: `--rounds` rounds of `--calls` calls each, the order
swapped every round, medians of every call. Each model runs in two processes on one cache: the first saves
its owner, the second loads it.

Models: the restart benchmark's ViT-like encoder (scripts/bench_restart.py) at 4 and 24 blocks, a 4-block
MLP at width 64 (the smallest per call, where a fixed cost shows most), and transformers' BART at 12 layers
a side as the decode benchmark builds it (scripts/bench_decode.py), whose call is a greedy `generate` of 16
tokens: its decoder's frame reads many globals and classes whose guards torch drops.

    python scripts/bench_saved_call.py [--rounds 30] [--calls 20] [--out docs/results/saved-call]

`--child MODEL` runs one process and prints its JSON record.
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
from collections.abc import Callable

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_restart

LOCK = "/work/timing.lock"
MODELS = ("vit-4", "vit-24", "mlp-4", "bart-12")
TOKENS = 16  # a BART call's generated tokens


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class MLP(nn.Module):
    def __init__(self, depth: int, dim: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(name: str) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """Returns the model (eval, seeded) and its call."""
    kind, depth = name.split("-")
    torch.manual_seed(0)
    if kind == "bart":
        import bench_decode
        from transformers.models.bart import modeling_bart

        model, (ids,) = bench_decode.make("bart", int(depth), modeling_bart)
        return model.eval(), lambda m: m.generate(
            ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False
        )
    if kind == "vit":
        model = bench_restart.ViT(int(depth)).eval()
        shape = (bench_restart.BATCH, bench_restart.TOKENS, bench_restart.PATCH)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    else:
        model, x = MLP(int(depth)).eval(), torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(x)


def child(name: str, rounds: int, calls: int) -> dict:
    import regionalize

    (on, call), (off, _) = build(name), build(name)
    regionalize.compile_regions(on)
    regionalize.compile_regions(off, saved=False)
    times: dict[str, list[float]] = {"on": [], "off": []}
    with torch.no_grad():
        equal = torch.allclose(call(on).float(), call(off).float(), atol=1e-5)
        for _ in range(5):  # warm both
            call(on), call(off)
        for round_ in range(rounds):
            for mode in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                model = on if mode == "on" else off
                for _ in range(calls):
                    began = time.perf_counter()
                    call(model)
                    times[mode].append(time.perf_counter() - began)
    owner = regionalize.describe(on)[-1]  # BART's encoder first, then its decoder
    on_ms, off_ms = (statistics.median(times[m]) * 1e3 for m in ("on", "off"))
    return {"model": name, "found": owner.saved, "equal": bool(equal), "on_ms": on_ms, "off_ms": off_ms}


def run(name: str, cache: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("REGIONALIZE_SAVED_OWNERS", None)
    command = [sys.executable, os.path.abspath(__file__), "--child", name]
    command += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
    done = subprocess.run(["flock", LOCK, *command], env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{name}: {(done.stderr or done.stdout)[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def markdown(data: dict) -> str:
    rows = [
        f"| {r['model']} | {r['found']} | {r['on_ms']:.3f} ms | {r['off_ms']:.3f} ms | "
        f"{r['on_ms'] / r['off_ms']:.3f}x | {'yes' if r['equal'] else 'NO'} |"
        for r in data["runs"]
    ]
    return "\n".join(
        [
            "# Per call, saving on against saving off",
            "",
            f"Measured {data['date']} on {data['machine']}, torch {data['torch']}, Python {data['python']}, "
            f"by `python scripts/bench_saved_call.py --rounds {data['rounds']} --calls {data['calls']}` "
            "([saved-call.json](saved-call.json)). Two copies of each model in one process, one saving and "
            "one not, take turns; medians of every call (bart-12's call is a `generate` of "
            f"{TOKENS} tokens). The first process saves the owner, the second loads it.",
            "",
            "| model | saved owner | per call, saving on | per call, saving off | on / off | outputs equal |",
            "|---|---|--:|--:|--:|---|",
            *rows,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", choices=MODELS)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default="docs/results/saved-call")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.rounds, args.calls)))
        return
    runs = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="bench-saved-call-") as cache:
            for _ in ("saves", "loads"):
                runs.append(run(name, cache, args))
                print(json.dumps(runs[-1]), flush=True)
    data = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()}-core {os.uname().machine} CPU",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "rounds": args.rounds,
        "calls": args.calls,
        "runs": runs,
    }
    with open(args.out + ".json", "w", encoding="utf-8") as file:
        json.dump(data, file, indent=1)
    with open(args.out + ".md", "w", encoding="utf-8") as file:
        file.write(markdown(data))


if __name__ == "__main__":
    main()
