"""Where a restart's time goes, for blocks that differ in float constants (stochastic depth).

    python scripts/profile_restart.py [--repeats 3]

Builds transformers' BEiT with 24 layers and `drop_path_rate=0.1` (docs/results/forward/models.py, random
weights) and times its first call in fresh processes, each form with its own Inductor cache folder: once
cold (an empty cache), then `--repeats` hot restarts (the cache the cold one left), interleaved; each pays
torch.compile's imports before its clock starts, as verify's do. The forms:
a full `torch.compile`, `regionalize.compile_regions` as the runtime serves it (the owner in pieces), the
same without Inductor's CPU check started ahead, the same with the pieces' inputs learnt by a fake run
(both as runtime 24 did), and the same with the float check turned off (a region traced a block, runtime
22's form). Then one hot restart of the full compile and of the pieces under cProfile. Writes
docs/results/forward/restart-profile.md with the date, machine and versions. About 9 minutes on 2 CPU
cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from regionalize.bench.machine import machine
from regionalize.codemod.runtime_copy import VERSION

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "forward" / "restart-profile.md"
FORMS = ("full", "pieces", "unchecked", "fake-run", "regions")
# What the profile shows of a restart: Dynamo's trace, the backend's compile (a cache load), the guards.
SHOWN = (
    ("Dynamo's trace of the owner, the compile inside it", "symbolic_convert.py", "(run)"),
    ("the backend: compiled code loaded from the cache", "output_graph.py", "(compile_and_call_fx_graph)"),
    ("AOTAutograd cache loads", "autograd_cache.py", "(try_load)"),
    ("the pieces compiled: their keys and cache loads", "pieces.py", "(pieces_compiled)"),
    ("building the guards", "_dynamo/guards.py", "(__init__)"),
)

CHILD = r"""
import cProfile, io, pstats, sys, time
sys.path.insert(0, sys.argv[3])
import torch, models, transformers.models.beit.modeling_beit as beit
import regionalize
form, profile = sys.argv[1], sys.argv[2] == "1"
torch.set_grad_enabled(False)
model, (pixels,) = models.beit_24(beit)
if form == "full":
    model.compile()
else:
    import regionalize.runtime.owner as owner
    if form == "regions":
        owner.differing_constants = lambda blocks: None
    if form == "unchecked":
        owner.cpu_check = lambda: None
    if form == "fake-run":
        import regionalize.runtime.pieces as pieces
        pieces.recorded_inputs = lambda split: None
    regionalize.compile_regions(model)
# torch.compile's own imports paid before the clock by every form, as verify's workers do: a full
# compile pays them as the model is built, the runtime at the owner's first call.
torch.compile(lambda: None)
prof = cProfile.Profile()
start = time.perf_counter()
if profile:
    prof.enable()
model(pixels)
prof.disable()
print(f"TIME {time.perf_counter() - start:.3f}")
if profile:
    for (file, line, name), (_, calls, _, cumulative, _) in pstats.Stats(prof).stats.items():
        print(f"PROFILE {file}:{line}:{name} {calls} {cumulative:.3f}")
"""


def first_call(form: str, cache: Path, profile: bool = False) -> tuple[float, dict[str, tuple[int, float]]]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    factories = str(ROOT / "docs" / "results" / "forward")
    args = [sys.executable, "-c", CHILD, form, "1" if profile else "0", factories]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
    seconds, found = 0.0, {}
    for line in out.splitlines():
        if line.startswith("TIME "):
            seconds = float(line.split()[1])
        elif line.startswith("PROFILE "):
            where, calls, cumulative = line[8:].rsplit(" ", 2)
            found[where] = (int(calls), float(cumulative))
    return seconds, found


def shown(profile: dict[str, tuple[int, float]], file: str, name: str) -> str:
    hits = [(c, t) for where, (c, t) in profile.items() if file in where and where.endswith(":" + name[1:-1])]
    if not hits:
        return "-"
    calls, seconds = max(hits, key=lambda hit: hit[1])
    return f"{seconds:.2f} s ({calls} calls)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        caches = {form: Path(tmp) / form for form in FORMS}
        cold = {form: first_call(form, caches[form])[0] for form in FORMS}
        hot: dict[str, list[float]] = {form: [] for form in FORMS}
        for _ in range(repeats):
            for form in FORMS:
                hot[form].append(first_call(form, caches[form])[0])
        profiles = {form: first_call(form, caches[form], profile=True) for form in ("full", "pieces")}
    lines = [
        "# Where a restart's time goes: blocks that differ in float constants",
        "",
        f"Measured by `python scripts/profile_restart.py` on {datetime.date.today()}: transformers' BEiT, 24 "
        f"layers, `drop_path_rate=0.1`, batch 1, eval, no grad; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {machine()}. First call in fresh processes (torch.compile's "
        "imports paid before the clock), each form with its own Inductor cache: "
        f"cold once, then {repeats} hot restarts interleaved (median). *Regions*: the owner with a region "
        f"traced a block (runtime 22's form); *pieces*: runtime {VERSION}'s; *unchecked*: the same without "
        "Inductor's CPU check started ahead in a thread; *fake-run*: the same with each piece's inputs "
        "learnt by a run of the split graph on fake tensors, not taken from Dynamo's record; *full*: "
        "`torch.compile` of the model.",
        "",
        "| form | cold | hot (median) | hot runs | hot against full |",
        "|---|--:|--:|---|--:|",
    ]
    full_hot = statistics.median(hot["full"])
    for form in FORMS:
        median = statistics.median(hot[form])
        runs = ", ".join(f"{t:.2f}" for t in hot[form])
        ratio = f"{full_hot / median:.2f}x" if form != "full" else "-"
        lines.append(f"| {form} | {cold[form]:.2f} s | {median:.2f} s | {runs} | {ratio} |")
    lines += [
        "",
        "One hot restart each under cProfile (which slows Python code, not torch's C++), cumulative:",
        "",
        "| part | full | pieces |",
        "|---|--:|--:|",
    ]
    lines.append(f"| the first call | {profiles['full'][0]:.2f} s | {profiles['pieces'][0]:.2f} s |")
    for label, file, name in SHOWN:
        cells = [shown(profiles[form][1], file, name) for form in ("full", "pieces")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    PAGE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
