"""Restarts side by side: how soon a fresh process reaches its first call, cold and hot, by depth.

A ViT-like encoder of N blocks is built in the script (seeded random weights, no downloads) and served under
`torch.no_grad()`, each start a fresh process under `flock /work/timing.lock`. Modes:

- `full`: `torch.compile(model)`, torch's full compile.
- `aot-full`: torch's own `aot_compile` of the whole model (`torch.compile(fn, fullgraph=True).aot_compile`),
  saved on its first start and loaded by later ones (the anchor: what a user would write by hand).
- `regions`: `regionalize.compile_regions(model, saved=False)`, saved owners off.
- `saved`: `regionalize.compile_regions(model)`: saved owners, the default (docs/saved-owners.md).
- `per-block`: `block.compile()` for each block (the recipe).

Kinds: `cold` (an empty `TORCHINDUCTOR_CACHE_DIR`) and `hot` (the same directory again: Inductor's caches
and the saved files, as a restarted service finds them). Each round runs every mode's cold then hot start,
mode after mode, depth after depth; the page gives medians. Every start checks its output against an eager
copy of the model built in the same process after the timed part.

    python scripts/bench_restart.py [--depths 12 16 24 32 64] [--modes ...] [--rounds 2] [--python PY]
        [--drop-path RATE] [--out docs/results/restart]  # writes OUT.json and OUT.md; --render rewrites it

`--drop-path 0.1` gives each block a stochastic-depth rate of its own, spaced over depth
(docs/results/restart-stochastic-depth.md).

`--child MODE` runs one start (depth from RESTART_DEPTH) and prints its JSON record.
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # before torch's import: a restart's time counts from here

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

_IMPORTED = time.perf_counter()

MODES = ("full", "aot-full", "regions", "saved", "per-block")
NAMES = {
    "full": "`torch.compile(model)`",
    "aot-full": "torch's `aot_compile` of the whole model, saved (anchor)",
    "regions": "`regionalize.compile_regions(model, saved=False)`",
    "saved": "`regionalize.compile_regions(model)` (saved owners, the default)",
    "per-block": "`block.compile()` each block",
}
LOCK = "/work/timing.lock"
WIDTH, HEADS, TOKENS, BATCH, PATCH = 192, 3, 64, 2, 48
PER_CALL_RUNS = 21


class Block(nn.Module):
    """Pre-norm attention and MLP, each branch dropped at the block's stochastic-depth rate in training."""

    def __init__(self, dim, heads, drop_path=0.0):
        super().__init__()
        self.heads, self.drop_path = heads, drop_path
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.dropped(self.proj(a.transpose(1, 2).reshape(b, n, c)))
        return x + self.dropped(self.fc2(F.gelu(self.fc1(self.norm2(x)))))

    def dropped(self, y):
        if self.drop_path == 0.0 or not self.training:
            return y
        keep = 1 - self.drop_path
        return y * y.new_empty(y.shape[0], 1, 1).bernoulli_(keep) / keep


class ViT(nn.Module):
    """A ViT-like encoder of `depth` blocks. At module level: torch saves no class of a local scope."""

    def __init__(self, depth, drop_path=0.0):
        super().__init__()
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]  # spaced over depth, as timm's
        self.embed = nn.Linear(PATCH, WIDTH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(torch.randn(1, TOKENS + 1, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS, rate) for rate in rates)
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, patches):
        x = self.embed(patches)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def whole_frame(model, patches):
    """The anchor's frame: the model as an argument, so that its parameters are inputs, not constants."""
    return model(patches)


def anchor(model, patches):
    """torch's own `aot_compile` of the whole model as a user would write it: loaded where saved, else
    compiled ahead of the call and saved. Returns the callable and what it did."""
    path = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "anchor", f"vit-{len(model.blocks)}.pt2")
    if os.path.exists(path):
        context = torch._guards.tracing(torch._guards.TracingContext(None))  # 2.13 asks for one
        with context, open(path, "rb") as file:
            return torch.compiler.load_compiled_function(file), "loaded"
    compiled = torch.compile(whole_frame, fullgraph=True).aot_compile(((model, patches), {}))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    compiled.save_compiled_function(path)
    return compiled, "saved"


def child(mode):
    depth, drop_path = int(os.environ["RESTART_DEPTH"]), float(os.environ.get("RESTART_DROP_PATH", 0))
    torch.manual_seed(0)
    model = ViT(depth, drop_path).eval()
    patches = torch.randn(BATCH, TOKENS, PATCH, generator=torch.Generator().manual_seed(1))
    record = {"mode": mode, "depth": depth}
    built = time.perf_counter()
    # torch's imports of its compiler, paid by every mode before the clock starts, as verify's worker does
    for name in ("torch._dynamo", "torch._inductor.compile_fx"):
        importlib.import_module(name)

    clock = time.perf_counter()
    with torch.no_grad():
        if mode == "aot-full":
            served, record["found"] = anchor(model, patches)
            call = lambda: served(model, patches)  # noqa: E731
        else:
            if mode == "full":
                model = torch.compile(model)
            elif mode == "per-block":
                for block in model.blocks:
                    block.compile()
            else:
                import regionalize

                regionalize.compile_regions(model, saved=mode == "saved")
            call = lambda: model(patches)  # noqa: E731
        out = call()
        first = time.perf_counter()
        if mode == "saved":
            record["found"] = regionalize.describe(model)[0].saved
        times = []
        for _ in range(PER_CALL_RUNS):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        torch.manual_seed(0)
        expected = ViT(depth, drop_path).eval()(patches)
    record.update(
        import_s=_IMPORTED - _START,
        compiler_imports_s=clock - built,
        from_start_s=first - _START,
        first_call_s=first - clock,
        per_call_ms=statistics.median(times) * 1e3,
        equal=bool(torch.allclose(out, expected, atol=1e-4)),
    )
    print("RESULT " + json.dumps(record))


def start(python, mode, depth, cache, drop_path):
    """One fresh process of `mode` at `depth` on `cache`, under the timing lock; its record."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, RESTART_DEPTH=str(depth))
    env["RESTART_DROP_PATH"] = str(drop_path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    cmd = ["flock", LOCK, python, os.path.abspath(__file__), "--child", mode]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"mode": mode, "depth": depth, "error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(lines[-1][len("RESULT ") :])


def drive(args, meta):
    root = tempfile.mkdtemp(prefix="bench-restart-")
    runs = []
    for round_ in range(args.rounds):
        for depth in args.depths:
            for mode in args.modes:
                cache = os.path.join(root, f"{mode}-{depth}-{round_}")
                for kind in ("cold", "hot"):
                    record = start(args.python, mode, depth, cache, args.drop_path)
                    record.update(kind=kind, round=round_)
                    runs.append(record)
                    write(
                        args.out, meta, runs
                    )  # after each start: a sitting cut short keeps what it measured
                    shown = ("depth", "mode", "kind", "first_call_s", "found", "equal", "error")
                    print(json.dumps({k: record[k] for k in shown if k in record})[:300], flush=True)
                shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return runs


def summarize(runs):
    """Medians by depth, mode and kind."""
    groups = {}
    for record in runs:
        if "error" not in record:
            groups.setdefault((record["depth"], record["mode"], record["kind"]), []).append(record)
    return {
        f"{depth} {mode} {kind}": {
            "first_call_s": statistics.median(r["first_call_s"] for r in records),
            "from_start_s": statistics.median(r["from_start_s"] for r in records),
            "per_call_ms": statistics.median(r["per_call_ms"] for r in records),
            "n": len(records),
            "equal": all(r["equal"] for r in records),
            "found": sorted({r["found"] for r in records if "found" in r}),
        }
        for (depth, mode, kind), records in sorted(groups.items())
    }


def markdown(meta, summary, runs, data):
    imports = [r["import_s"] + r["compiler_imports_s"] for r in runs if "import_s" in r]
    lines = [
        "# Restarts: the first call of a fresh process, cold and hot, by depth",
        "",
        f"`python scripts/bench_restart.py` on {meta['date']}, {meta['machine']}; torch {meta['torch']}. "
        f"Model: a ViT-like encoder (width {WIDTH}, {HEADS} heads, {TOKENS + 1} tokens, batch {BATCH}) "
        f"built in the script, `torch.no_grad()`{_stochastic(meta)}. Each start is a fresh process under "
        f"the timing lock; modes interleaved, medians of {meta['rounds']} rounds. *Cold*: an empty "
        "`TORCHINDUCTOR_CACHE_DIR`; *hot*: the directory the cold start left, as a restarted service finds "
        "it. Seconds from the end of torch's imports (`import torch`, and its compiler's, Dynamo and "
        "Inductor, which every mode pays before the clock starts, as `regionalize verify` times a first "
        f"call; {statistics.median(imports) if imports else 0:.2f} s in all) to the first call's output; "
        "the JSON has the seconds from the process's start too (`from_start_s`).",
        "",
    ]
    for depth in meta["depths"]:
        full_hot = summary.get(f"{depth} full hot", {}).get("first_call_s")
        lines += [
            f"## {depth} blocks",
            "",
            "| mode | cold | hot | hot: sooner than full's | per call (hot) | equals eager |",
            "|---|--:|--:|--:|--:|---|",
        ]
        for mode in meta["modes"]:
            cold, hot = (summary.get(f"{depth} {mode} {kind}") for kind in ("cold", "hot"))
            if not cold or not hot:
                lines.append(f"| {NAMES[mode]} | - | - | - | - | failed |")
                continue
            ratio = f"{full_hot / hot['first_call_s']:.2f}x" if full_hot else "-"
            found = f" ({', '.join(hot['found'])})" if hot["found"] else ""
            equal = "yes" if cold["equal"] and hot["equal"] else "NO"
            lines.append(
                f"| {NAMES[mode]} | {cold['first_call_s']:.2f} s | {hot['first_call_s']:.2f} s{found} | "
                f"{ratio} | {hot['per_call_ms']:.1f} ms | {equal} |"
            )
        lines.append("")
    lines += _targets(meta, summary)
    errors = [r for r in runs if "error" in r]
    lines += [
        f"Failed starts: {len(errors)}. Every start: [{data}]({data}) (`runs`).",
    ]
    return "\n".join(lines) + "\n"


def _stochastic(meta):
    """The model's stochastic depth, as the page names it: none, or its rates."""
    rate = meta.get("drop_path", 0.0)
    if not rate:
        return ""
    return (
        f", with stochastic depth: each block's drop-path rate a float of its own, 0 to {rate} over depth "
        "(the runtime compiles such an owner [in pieces](../glossary.md#in-pieces))"
    )


def _targets(meta, summary):
    """Issue 71's targets, read off the medians: the saved owners' hot start against the full compile's and
    in seconds, its growth with depth, its cold start against saving off's, its time per call."""

    def got(depth, mode, kind, figure="first_call_s"):
        return summary.get(f"{depth} {mode} {kind}", {}).get(figure)

    lines = ["## Against the targets", ""]
    for depth in (24, 32):
        saved, full = got(depth, "saved", "hot"), got(depth, "full", "hot")
        if saved and full:
            lines.append(
                f"- {depth} blocks, hot: {saved:.2f} s after torch's imports, {full / saved:.2f}x sooner "
                "than the full compile's (targets: at most 1.0 s, at least 5x)."
            )
    small, large = got(16, "saved", "hot"), got(64, "saved", "hot")
    if small and large:
        lines.append(
            f"- Depth: 64 blocks' hot start takes {large / small:.2f}x 16 blocks' (target: at most 1.3x)."
        )
    for depth in meta["depths"]:
        saved, default = got(depth, "saved", "cold"), got(depth, "regions", "cold")
        per, full = got(depth, "saved", "hot", "per_call_ms"), got(depth, "full", "hot", "per_call_ms")
        if saved and default and per and full:
            lines.append(
                f"- {depth} blocks, cold: {saved / default:.2f}x saving off's; per call {per / full:.2f}x "
                "the full compile's (targets: at most 1.1x each)."
            )
    return [*lines, ""] if len(lines) > 2 else []


def versions(python):
    code = (
        "import torch, platform, json; "
        "print(json.dumps({'torch': torch.__version__, 'python': platform.python_version()}))"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True).stdout)


def write(out, meta, runs):
    summary = summarize(runs)
    text = markdown(meta, summary, runs, os.path.basename(out) + ".json")
    with open(out + ".json", "w") as file:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, file, indent=1)
    with open(out + ".md", "w") as file:
        file.write(text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--depths", nargs="+", type=int, default=[12, 16, 24, 32, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="docs/results/restart")
    parser.add_argument(
        "--drop-path", type=float, default=0.0, help="the last block's stochastic-depth rate (0: none)"
    )
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json only")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.render:
        with open(args.out + ".json") as file:
            saved = json.load(file)
        return print(write(args.out, saved["meta"], saved["runs"]))
    from regionalize.bench.machine import machine

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        **versions(args.python),
        "rounds": args.rounds,
        "modes": args.modes,
        "depths": args.depths,
        "drop_path": args.drop_path,
    }
    print(write(args.out, meta, drive(args, meta)))


if __name__ == "__main__":
    main()
