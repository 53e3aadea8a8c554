"""Probe for issue 71 (a restart that traces nothing): how soon a fresh process reaches its first call.

A 24-block ViT-like model is built in the script (no downloads, no weights: seeded random init) and served
under `torch.no_grad()` in fresh processes, each under `flock /work/timing.lock` so that no other timing
runs beside it. Each process is a "start" of one mode:

- `full`: `torch.compile(model)`, torch's full compile.
- `regions`: `regionalize.compile_regions(model)`, the runtime as it is today (owner whole, blocks nested
  regions).
- `aot`: the prototype of saved owners. The owner's frame (a function of the owner, as the runtime's
  `_regionalize_owner_compiled` compiles: `owner._call_impl(*args)`) with each block's `forward` a nested
  compile region, compiled by `torch.compile(frame, fullgraph=True).aot_compile(...)`; saved on its first
  run under the root of `TORCHINDUCTOR_CACHE_DIR`, loaded by a later process, its guards checked.
- `aot-full`: the same without nested regions: torch's own `aot_compile` of the whole model (the anchor).

Start kinds: `cold` (an empty `TORCHINDUCTOR_CACHE_DIR`), `hot` (the same directory again: Inductor's caches
warm and, for the aot modes, the saved artifact), and for the aot modes `bare` in the first round only (a new
directory holding only the artifact, Inductor's caches empty: its load compiles the C++ kernels again).
The rounds are interleaved (each mode's cold then hot, mode after
mode) and the medians of `--rounds` reported. Every start checks its output against an eager copy of the
model built in the same process after the timed part.

    PYTHONPATH=. python scripts/restart_probe.py            # writes docs/results/restart-probe.{md,json}
    PYTHONPATH=. python scripts/restart_probe.py --python /work/main/.venvs/torch-2.15.0/bin/python \\
        --out docs/results/restart-probe-2.15.0

`--child MODE` runs one start and prints its JSON record (what the driver runs under flock), under cProfile
with RESTART_PROBE_PROFILE=PATH. `--render` rewrites the page from the .json. RESTART_PROBE_DEPTH=N builds
N blocks for a quick try (24 measured).
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # before torch's import: a restart's time counts from here

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

MODES = ("full", "regions", "aot", "aot-full")
LOCK = "/work/timing.lock"
DEPTH = int(os.environ.get("RESTART_PROBE_DEPTH", "24"))  # 24 measured; fewer for a quick try
WIDTH, HEADS, TOKENS, BATCH, PATCH = 192, 3, 64, 2, 48
ATOL = 1e-4
PER_CALL_RUNS = 21


import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

_IMPORTED = time.perf_counter()


class Block(nn.Module):
    """Pre-norm attention and MLP."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """A ViT-like encoder of DEPTH blocks. At module level: torch saves no class of a local scope."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(PATCH, WIDTH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(torch.randn(1, TOKENS + 1, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(DEPTH))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, patches):
        x = self.embed(patches)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def build_model(nested):
    """The model, seeded; with `nested`, each block's forward a nested compile region (the form the
    runtime's owner frame traces). Eager outside a compile either way."""
    if nested and not hasattr(Block.forward, "__wrapped__"):
        Block.forward = torch.compiler.nested_compile_region(Block.forward)
    torch.manual_seed(0)
    return ViT().eval(), Block


def owner_frame(owner, *args, **kwargs):
    """The owner's frame, as the runtime's owner frame: a function of the module, its call hooks and all."""
    return owner._call_impl(*args, **kwargs)


def artifact_key(owner, block_cls, args, mode):
    """The prototype's key: what the compiled code depends on that guards do not check across processes.
    The source of the owner's and blocks' classes (the runtime would hash the code objects of what they
    call, as Dynamo's SourceInfo lists them), torch's version and build, Python's, the parameters' shapes,
    dtypes and devices, the inputs', the compile options and the form."""
    parts = [
        inspect.getsource(type(owner)),
        inspect.getsource(block_cls),
        torch.__version__,
        str(torch.version.git_version),
        platform.python_version(),
        repr([(n, tuple(p.shape), p.dtype, p.device) for n, p in owner.named_parameters()]),
        repr([(tuple(a.shape), a.dtype, a.device) for a in args]),
        repr({"fullgraph": True, "backend": "inductor"}),
        mode,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def cache_root():
    """The root of torch's own cache directory: TORCHINDUCTOR_CACHE_DIR, else Inductor's default."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir()


def aot_serve(owner, block_cls, args, mode):
    """Load the owner's saved frame where its key's artifact exists and its guards hold; otherwise compile it
    ahead of its call, save it atomically and return it. Returns (callable, what happened, artifact path)."""
    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        torch._dynamo.config.enable_aot_compile = True  # off by default on 2.11
    folder = os.path.join(cache_root(), "regionalize", "owners")
    path = os.path.join(folder, artifact_key(owner, block_cls, args, mode) + ".aot")
    if os.path.exists(path):
        try:
            with open(path, "rb") as file:
                loaded = torch.compiler.load_compiled_function(file)
            if loaded.guard_check(owner, *args):
                return loaded, "loaded", path
            why = "its guards failed"
        except Exception as error:  # a corrupt file, another torch's: never fatal
            why = f"{type(error).__name__}: {str(error)[:120]}"
        warnings.warn(f"restart_probe: saved owner not loaded ({why}); compiling it", stacklevel=2)
    compiled = torch.compile(owner_frame, fullgraph=True).aot_compile((tuple([owner, *args]), {}))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        os.close(fd)
        compiled.save_compiled_function(temp)  # 2.11 writes in place: renamed after, whole or not at all
        os.replace(temp, path)
    except Exception as error:  # a read-only directory: served, not saved
        warnings.warn(f"restart_probe: saved owner not written ({error})", stacklevel=2)
    return compiled, "compiled", path


def child(mode):
    """One start: build, compile or load, first call; then the eager check. Prints its JSON record.
    With RESTART_PROBE_PROFILE=PATH the start runs under cProfile, its stats written to PATH (`python -m
    cProfile` would run the script as another `__main__`, whose classes `inspect` cannot find)."""
    profile_path = os.environ.get("RESTART_PROBE_PROFILE")
    if not profile_path:
        return served_start(mode)
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        return served_start(mode)
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)


def served_start(mode):
    imported = _IMPORTED
    nested = mode == "aot"
    model, block_cls = build_model(nested)
    patches = torch.randn(BATCH, TOKENS, PATCH, generator=torch.Generator().manual_seed(1))
    record = {"mode": mode}
    with torch.no_grad():
        if mode == "full":
            compiled = torch.compile(model)
            out = compiled(patches)
        elif mode == "regions":
            import regionalize

            compiled = regionalize.compile_regions(model)
            out = compiled(patches)
        else:
            served, record["artifact"], path = aot_serve(model, block_cls, (patches,), mode)
            out = served(model, patches)
            record["artifact_bytes"] = os.path.getsize(path) if os.path.exists(path) else None
        first = time.perf_counter()
        from torch._dynamo.utils import counters

        record["dynamo_frames"] = {k: dict(v) for k, v in counters.items() if k in ("frames", "stats")}
        call = (lambda: served(model, patches)) if mode.startswith("aot") else (lambda: compiled(patches))
        times = []
        for _ in range(PER_CALL_RUNS):  # per call, once compiled: the aot path checks its guards in Python
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        record["per_call_ms"] = statistics.median(times) * 1e3

        reference, _ = build_model(False)
        expected = reference(patches)
    record.update(
        import_s=imported - _START,
        first_call_s=first - _START,
        after_import_s=first - imported,
        max_abs_diff=float((out - expected).abs().max()),
        equal=bool(torch.allclose(out, expected, atol=ATOL)),
    )
    print("RESULT " + json.dumps(record, default=str))


def start(python, mode, cache, env_extra):
    """One fresh process of `mode` on `cache`, under the timing lock; its record."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, **env_extra)
    cmd = ["flock", LOCK, python, os.path.abspath(__file__), "--child", mode]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"mode": mode, "error": (done.stderr or done.stdout)[-2000:]}
    record = json.loads(lines[-1][len("RESULT ") :])
    record["warnings"] = [line for line in done.stderr.splitlines() if "restart_probe:" in line]
    return record


def versions(python):
    code = (
        "import torch, platform, json; print(json.dumps({'torch': torch.__version__, "
        "'git': torch.version.git_version, 'python': platform.python_version()}))"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True).stdout)


def drive(args, meta):
    root = tempfile.mkdtemp(prefix="restart-probe-")
    env_extra = {"PYTHONPATH": os.pathsep.join(filter(None, [args.pythonpath, os.environ.get("PYTHONPATH")]))}
    runs = []
    for round_ in range(args.rounds):
        for mode in args.modes:
            cache = os.path.join(root, f"{mode}-{round_}")
            # Only the artifact (Inductor's caches empty): once, as its load compiles C++ again.
            kinds = ["cold", "hot"] + (["bare"] if mode.startswith("aot") and round_ == 0 else [])
            for kind in kinds:
                if kind == "bare":  # only the artifact: Inductor's caches empty
                    bare = os.path.join(root, f"{mode}-{round_}-bare")
                    shutil.copytree(os.path.join(cache, "regionalize"), os.path.join(bare, "regionalize"))
                    record = start(args.python, mode, bare, env_extra)
                else:
                    record = start(args.python, mode, cache, env_extra)
                record.update(kind=kind, round=round_)
                runs.append(record)
                write(args.out, meta, runs)  # after each start: a sitting cut short keeps what it measured
                print(
                    json.dumps({k: record.get(k) for k in ("mode", "kind", "first_call_s", "equal")}),
                    flush=True,
                )
    shutil.rmtree(root, ignore_errors=True)
    return runs


def summarize(runs):
    table = {}
    for record in runs:
        if "error" in record:
            continue
        entry = table.setdefault(record["mode"], {}).setdefault(record["kind"], [])
        entry.append(record)
    summary = {}
    for mode, kinds in table.items():
        for kind, records in kinds.items():
            summary.setdefault(mode, {})[kind] = {
                "first_call_s": statistics.median(r["first_call_s"] for r in records),
                "after_import_s": statistics.median(r["after_import_s"] for r in records),
                "import_s": statistics.median(r["import_s"] for r in records),
                "per_call_ms": statistics.median(r["per_call_ms"] for r in records),
                "n": len(records),
                "all_equal": all(r["equal"] for r in records),
                "artifact": sorted({str(r.get("artifact")) for r in records}),
                "artifact_bytes": max((r.get("artifact_bytes") or 0) for r in records) or None,
            }
    return summary


def markdown(meta, summary, runs):
    lines = [
        "# Restart probe (issue 71)",
        "",
        f"Measured {meta['date']} on {meta['machine']}; torch {meta['torch']} ({meta['git'][:12]}), "
        f"Python {meta['python']}. Model: a {DEPTH}-block ViT-like encoder (width {WIDTH}, {HEADS} heads, "
        f"{TOKENS + 1} tokens, batch {BATCH}), `torch.no_grad()`, built in `scripts/restart_probe.py`. "
        f"Each start a fresh process under `flock {LOCK}`; modes interleaved, median of {meta['rounds']} "
        "(n= where a sitting cut short took fewer; the bare start once).",
        "",
        "Seconds from the process's start (before `import torch`) to the first call's output; in brackets, "
        "from torch's import on.",
        "",
        "| mode | cold | hot restart | bare (artifact only) | per call (hot) | artifact | equals eager |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "full": "`torch.compile(model)`",
        "regions": "`regionalize.compile_regions` today",
        "aot": "owner frame + nested regions, saved (prototype)",
        "aot-full": "whole model `aot_compile`, no regions (anchor)",
    }

    def cell(mode, kind):
        found = summary.get(mode, {}).get(kind)
        if found is None:
            return "-"
        fewer = "" if found["n"] == meta["rounds"] or kind == "bare" else f", n={found['n']}"
        return f"{found['first_call_s']:.2f} ({found['after_import_s']:.2f}{fewer})"

    for mode in meta["modes"]:
        kinds = summary.get(mode, {})
        size = kinds.get("cold", {}).get("artifact_bytes")
        equal = all(k["all_equal"] for k in kinds.values()) if kinds else False
        per_call = kinds.get("hot", {}).get("per_call_ms")
        row = [names[mode], cell(mode, "cold"), cell(mode, "hot"), cell(mode, "bare")]
        row.append("-" if per_call is None else f"{per_call:.1f} ms")
        row += [f"{size / 1e6:.2f} MB" if size else "-", "yes" if equal else "NO"]
        lines.append("| " + " | ".join(row) + " |")
    full_hot = summary.get("full", {}).get("hot", {}).get("first_call_s")
    if full_hot:
        lines += ["", "Hot restart against the full compile's:"]
        for mode in meta["modes"]:
            hot = summary.get(mode, {}).get("hot", {}).get("first_call_s")
            if hot:
                lines.append(f"- {names[mode]}: {full_hot / hot:.2f}x sooner")
    lines += [
        "",
        "Each start, by round: first call in seconds / per call in ms. The per-call time shows how busy the "
        "shared box was (the lock keeps other timings out, not other work):",
        "",
        "| round | " + " | ".join(f"{m} {k}" for m in meta["modes"] for k in ("cold", "hot")) + " |",
        "| --- |" + " --- |" * (2 * len(meta["modes"])),
    ]
    for round_ in sorted({r["round"] for r in runs if "round" in r}):
        row = [str(round_)]
        for mode in meta["modes"]:
            for kind in ("cold", "hot"):
                key = (mode, kind, round_)
                found = [r for r in runs if (r["mode"], r.get("kind"), r.get("round")) == key]
                ok = [r for r in found if "error" not in r]
                row.append(f"{ok[0]['first_call_s']:.2f} / {ok[0]['per_call_ms']:.0f}" if ok else "-")
        lines.append("| " + " | ".join(row) + " |")
    errors = [r for r in runs if "error" in r]
    loaded = [r for r in runs if r.get("kind") in ("hot", "bare") and r["mode"].startswith("aot")]
    lines += [
        "",
        f"Aot restarts that loaded the artifact: {sum(r.get('artifact') == 'loaded' for r in loaded)} of "
        f"{len(loaded)}; failed starts: {len(errors)}.",
        "",
        "Every run: restart-probe.json (`runs`). The 2-core box is shared and the lock keeps out only other "
        "timings, not other work: compare starts whose per-call times match.",
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pythonpath", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--out", default="docs/results/restart-probe")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json only")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.render:
        with open(args.out + ".json") as file:
            saved = json.load(file)
        return print(write(args.out, saved["meta"], saved["runs"]))
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, {platform.system()}",
        **versions(args.python),
        "rounds": args.rounds,
        "modes": args.modes,
        "model": {"depth": DEPTH, "width": WIDTH, "heads": HEADS, "tokens": TOKENS + 1, "batch": BATCH},
    }
    runs = drive(args, meta)
    print(write(args.out, meta, runs))


def write(out, meta, runs):
    summary = summarize(runs)
    text = markdown(meta, summary, runs)
    with open(out + ".json", "w") as file:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, file, indent=1, default=str)
    with open(out + ".md", "w") as file:
        file.write(text)
    return text


if __name__ == "__main__":
    main()
