"""Steady-state cost per call of the compile forms, with and without the guard bypass.

    python scripts/bench_guard_bypass.py [--repeats 5] [--calls 2000] [--md docs/results/guard-bypass.md]

Two models, each built by the codemod's own output (so what is timed is what users get):
- seed: 100 modules chained, module i adds the float i, one-element tensor (overhead only);
- recipe: 64 x Layer (Linear, ReLU, sigmoid, Linear, ReLU) of width 64, batch 8.
Variants: eager; full (`model.compile()`); full + the `depyf` dispatcher on the whole model (the
seed's setting); hierarchical (the default rewrite), + `filter`, + `depyf` (on the owner's one frame);
per-block, + `depyf`. Each variant is checked against eager first; timings are interleaved rounds of
`--calls` calls under no_grad, and the table shows the median over `--repeats` rounds, in microseconds.
Writes the table, with the date, machine and versions, to `--md`.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from regionalize.bench.machine import machine
from regionalize.codemod import transform_source
from regionalize.shared.options import Options

SEED = """
import torch
from torch import nn


class AddConstant(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        return x + self.value


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[AddConstant(float(i)) for i in range(100)])

    def forward(self, x):
        return self.layers(x)
"""

RECIPE = """
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear1 = nn.Linear(dim, dim)
        self.linear2 = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.linear2(torch.sigmoid(torch.relu(self.linear1(x)))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(64) for _ in range(64)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

MODELS = {"seed (100 x add i)": (SEED, torch.ones(1)), "recipe (64 x Layer)": (RECIPE, torch.randn(8, 64))}
NAMES = [
    "eager",
    "full",
    "full + depyf",
    "hierarchical",
    "hierarchical + filter",
    "hierarchical + depyf",
    "per-block",
    "per-block + depyf",
]


def variant(source: str, name: str) -> torch.nn.Module:
    """The model of `source` compiled as `name` (one of NAMES), built from the codemod's output."""
    kind, _, bypass = name.partition(" + ")
    code = source
    if kind in ("hierarchical", "per-block"):
        code = transform_source(source, Options(form=kind, guard_bypass=bypass or "none")).code
    module = ModuleType(f"bench_{abs(hash((source, name)))}")
    sys.modules[module.__name__] = module  # as an import would: Dynamo looks decorators' modules up
    exec(compile(code, module.__name__, "exec"), module.__dict__)
    torch.manual_seed(0)
    model = module.Model().eval()
    if kind == "full" and bypass:  # the seed's setting: one whole-model graph, dispatched directly
        bypass._regionalize_dispatch(model)
    elif kind == "full":
        model.compile()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--md", type=Path, default=Path("docs/results/guard-bypass.md"))
    args = parser.parse_args()
    rows = []
    with torch.no_grad():
        for label, (source, x) in MODELS.items():
            torch._dynamo.reset()
            models = {name: variant(source, name) for name in NAMES}
            expected = models["eager"](x)
            for name, model in models.items():
                for _ in range(3):  # compile and settle
                    torch.testing.assert_close(model(x), expected, msg=name)
            rounds: dict[str, list[float]] = {name: [] for name in NAMES}
            for _ in range(args.repeats):
                for name, model in models.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        model(x)
                    rounds[name].append((time.perf_counter() - start) / args.calls * 1e6)
            medians = {name: statistics.median(values) for name, values in rounds.items()}
            cells = " | ".join(f"{medians[name]:.1f}" for name in NAMES)
            ratio = medians["hierarchical + depyf"] / medians["full"]
            rows.append(f"| {label} | {cells} | {ratio:.2f} |")
            print(rows[-1], flush=True)
    header = (
        f"Measured by `python scripts/bench_guard_bypass.py` on {datetime.date.today().isoformat()}: "
        f"torch {torch.__version__}, {machine()}; {args.calls} calls x {args.repeats} interleaved "
        "rounds under no_grad, "
        "median microseconds per call. Every variant was first checked against eager."
    )
    table = [
        "| model | " + " | ".join(NAMES) + " | hierarchical + depyf / full |",
        "|---" * (len(NAMES) + 2) + "|",
        *rows,
    ]
    args.md.write_text("# Guard bypass: cost per call\n\n" + header + "\n\n" + "\n".join(table) + "\n")
    print(f"wrote {args.md}")


if __name__ == "__main__":
    main()
