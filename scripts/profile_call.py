"""Where a call's time goes on Swin's stages, against a full compile: the frames, the code outside them, the
pieces.

    python scripts/profile_call.py [--processes 2] [--rounds 15]

Builds transformers' Swin with stages of 2, 2, 6 and 2 layers and a drop-path rate a layer
(docs/results/forward/models.py, random weights, one seed for every form), compiles it in each form below in
one process, and times its calls in rounds, the forms interleaved; `--processes` fresh processes, the
medians of all their rounds. Writes docs/results/forward/call-profile.md with the date, machine and
versions. About 4 minutes on 2 CPU cores.

The forms take apart what the default pays a call over a full compile: the code outside the owner (the
patch embedding, the final norm), a compiled frame per stage rather than one (runtime 26's default, each
stage its layers' owner), and inside the frame the blocks' regions and pieces and the runtime's entry
(without its fresh chunk of Python's frame stack, which a form leaves out), and the stretches between
blocks that the default runs as traced (a form compiles them).
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
PAGE = ROOT / "docs" / "results" / "forward" / "call-profile.md"
FORMS = {
    "eager": "the model as it is",
    "full": "`torch.compile` of the model: one frame",
    "encoder": "the encoder compiled whole, no regions: one frame, the patch embedding and final norm eager",
    "stages": "each stage compiled whole, no regions: a frame a stage",
    "stage-owners": "runtime 26's default: each stage the owner of its layers, a frame a stage",
    "unchunked": "the default without the fresh chunk of Python's frame stack that each owner call opens",
    "stretches": "the default with the short stretches between blocks compiled, not run as traced",
    "default": "`regionalize.compile_regions(model)`, as the rewrite: the encoder takes its stages' layers",
}

CHILD = r"""
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch, models, transformers.models.swin.modeling_swin as swin
import regionalize
from regionalize.runtime import owner, pieces
from regionalize.runtime.stack import chunk_slots
rounds, forms = int(sys.argv[2]), sys.argv[3:]
torch.set_grad_enabled(False)
# "unchunked" runs the owner's call as a frame of its usual size, swapped in for its rounds only.
chunked = owner.serve_call.__code__
big = chunked.co_stacksize > chunk_slots  # not where this Python opens no chunk (3.10)
unchunked = chunked.replace(co_stacksize=chunked.co_stacksize - chunk_slots) if big else chunked


# "stretches" compiles the short stretches between blocks (the patch mergings), which the default runs as
# traced; the setting is read when the owner compiles, at the form's first call.
traced = pieces.traced_ops


def swapped(form):
    owner.serve_call.__code__ = unchunked if form == "unchunked" else chunked
    pieces.traced_ops = 0 if form == "stretches" else traced


def built(form):
    torch.manual_seed(0)
    model, (pixels,) = models.swin(swin)
    if form == "full":
        model.compile()
    elif form == "encoder":  # static: owners of one class at four widths (docs/form-hierarchical.md)
        model.encoder.forward = torch.compile(model.encoder.forward, dynamic=False, fullgraph=True)
    elif form == "stages":
        for stage in model.encoder.layers:
            stage.forward = torch.compile(stage.forward, dynamic=False, fullgraph=True)
    elif form == "stage-owners":
        for stage in model.encoder.layers:
            regionalize.compile_region(*stage.blocks, owner=stage)
    elif form in ("default", "unchunked", "stretches"):
        regionalize.compile_regions(model)
    return model, pixels


calls = {form: built(form) for form in forms}
reference = calls["eager"][0](calls["eager"][1]).last_hidden_state
for form, (model, pixels) in calls.items():
    swapped(form)
    diff = (model(pixels).last_hidden_state - reference).abs().max().item()
    print(f"DIFF {form} {diff:.3g}", flush=True)
    for _ in range(5):
        model(pixels)
for _ in range(rounds):
    for form, (model, pixels) in calls.items():
        swapped(form)
        start = time.perf_counter()
        for _ in range(10):
            model(pixels)
        print(f"CALL {form} {(time.perf_counter() - start) / 10 * 1000:.4f}", flush=True)
"""


def measured(processes: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each form's per-call times in ms, every round of every process, and its largest output difference
    from eager."""
    times: dict[str, list[float]] = {form: [] for form in FORMS}
    diffs = dict.fromkeys(FORMS, 0.0)
    factories = str(ROOT / "docs" / "results" / "forward")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for _ in range(processes):
            args = [sys.executable, "-c", CHILD, factories, str(rounds), *FORMS]
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                kind, form, value = line.split()
                if kind == "CALL":
                    times[form].append(float(value))
                elif kind == "DIFF":
                    diffs[form] = max(diffs[form], float(value))
    return times, diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    import torch
    import transformers

    times, diffs = measured(options.processes, options.rounds)
    full = statistics.median(times["full"])
    lines = [
        "# Where a call's time goes: Swin's stages",
        "",
        f"Measured by `python scripts/profile_call.py` on {datetime.date.today()}: transformers' Swin "
        "(`models.py:swin`: stages of 2, 2, 6 and 2 layers, a drop-path rate a layer), batch 1, 128x128, "
        f"eval, no grad; runtime {VERSION}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {machine()}. The forms compiled in one process and called in rounds of "
        "10 calls, "
        f"interleaved: {options.rounds} rounds in each of {options.processes} fresh processes, the median "
        "of all rounds. *Largest difference*: from eager's output, every form built from one seed.",
        "",
        "| form | what it is | per call | against full | largest difference |",
        "|---|---|--:|--:|--:|",
    ]
    for form, what in FORMS.items():
        median = statistics.median(times[form])
        ratio = f"{median / full:.2f}x" if form != "full" else "-"
        lines.append(f"| {form} | {what} | {median:.2f} ms | {ratio} | {diffs[form]:.2g} |")
    PAGE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
