"""Time per call (per token with `generate`) of a full compile and the default rewrite, by depth of
Python's stack.

CPython keeps a thread's frames in 16 KiB chunks and frees a chunk as soon as the frame at its base returns
(python/cpython issue 142183, fixed in 2026 on 3.13 and later). A call whose frame straddles a chunk's end
maps and unmaps memory every time, and takes a page fault. The default rewrite makes one Python call a block
(its compiled subgraph), a full compile none: until runtime 19, at some depths the default paid that once a
block (at half of them for Qwen2's decode). Since, an owner's call opens a chunk of its own
(`fresh_stack`), and this scan shows whether any depth still costs a block's call a fault.

For each interpreter and each model, one process builds the model in both forms, then at each depth (0 to
`--depths` - 1 extra frames of about 120 bytes, every `--step`th) times `--calls` calls of each form in turn
(with `generate`, per token: (8 tokens - 1 token) / 7 in each of `--calls` rounds), the median, and counts
the minor page faults a call took:

    python scripts/stack_depths.py --python /root/.pyenv/versions/3.11.7/bin/python \\
        --python .venvs/torch-2.14.1/bin/python [--models gpt-32 "qwen2-32 generate"] [--depths 136]

writes docs/results/torch-versions/stack-depths.md and .json, and a page of each run's depths under
stack-depths/ (`--render` writes the pages again from the .json, measuring nothing). Never run it beside
anything else.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_torch_versions as versions

from regionalize.bench.machine import machine

ROOT = Path(__file__).resolve().parents[1]
MARKER = "STACK_DEPTHS_RESULT "
FORMS = ("full", "regional")
TOKENS = 8  # generated a round: the decode timed is (8 tokens - 1 token) / 7


def _per_call(built: Any, calls: int) -> tuple[float, float]:
    """Median milliseconds of one call (with `generate`, of one decoded token) over `calls` calls or rounds,
    and the minor page faults a call or round took."""
    from regionalize.bench.timing import call, timed, timed_pair

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(calls):
        if built.workload is None:
            times.append(timed(lambda: call(built), "cpu"))
        else:
            one, many = timed_pair(built.workload, built.model, "cpu")
            times.append((many - one) / (built.workload.tokens - 1))
    taken = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return statistics.median(times) * 1000, taken / calls


def worker(name: str, depths: range, calls: int) -> dict[str, Any]:
    from regionalize.bench.loading import import_paths
    from regionalize.bench.timing import at_depth, call

    rows = []
    with tempfile.TemporaryDirectory() as work:
        target, make = versions._subject(name, TOKENS)
        with import_paths(target):
            subject = make(Path(work))
            built = {form: subject.build(versions._variant(form)) for form in FORMS}
            for one in built.values():
                call(one)  # compiled
                call(one)
            for depth in depths:
                row: dict[str, Any] = {"depth": depth}
                for form, one in built.items():
                    call(one)
                    ms, faults = at_depth(depth, lambda one=one: _per_call(one, calls))
                    row[form] = {"ms": ms, "faults": faults}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return {"versions": versions.versions(sys.executable), "rows": rows}


def summary(rows: list[dict[str, Any]], faults: int) -> str:
    """The depths where the default took `faults` page faults a call more than a full compile (one a block,
    with `generate` one a block a decoded token), the ratio there and elsewhere, and over every depth."""
    ratios = {row["depth"]: row["regional"]["ms"] / row["full"]["ms"] for row in rows}
    faulting = [row["depth"] for row in rows if row["regional"]["faults"] - row["full"]["faults"] >= faults]
    others = [ratio for depth, ratio in ratios.items() if depth not in faulting]
    there = [ratios[depth] for depth in faulting]
    text = f"a page fault a block more than a full compile at {len(faulting)} of {len(rows)} depths"
    if there:
        where = ", ".join(map(str, faulting))
        text += f" ({where}): {min(there):.2f}x to {max(there):.2f}x a full compile's time"
    if there and others:
        text += f"; elsewhere a median of {statistics.median(others):.2f}x"
    every = list(ratios.values())
    return text + f"; over every depth a median of {statistics.median(every):.2f}x, at most {max(every):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter with its torch (repeatable)")
    parser.add_argument("--models", nargs="+", default=["gpt-32"], choices=list(versions.MODELS))
    parser.add_argument("--depths", type=int, default=136, help="extra frames, 0 to this - 1")
    parser.add_argument("--step", type=int, default=1, help="time every this many depths")
    parser.add_argument("--calls", type=int, default=40, help="calls (with generate, rounds) at each depth")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "torch-versions")
    parser.add_argument("--render", action="store_true", help="write the page again from its .json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for flag in ("depths", "step", "calls"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, not {getattr(args, flag)}")
    depths = range(0, args.depths, args.step)
    if args.worker:
        print(MARKER + json.dumps(worker(args.worker, depths, args.calls)), flush=True)
        return
    if args.render:
        saved = args.out / "stack-depths.json"
        try:
            write(json.loads(saved.read_text(encoding="utf-8")), args.out)
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"{saved}: cannot render it: {type(error).__name__}: {error}")
        return
    runs = []
    for python in args.python or [sys.executable]:
        for name in args.models:
            command = [python, __file__, "--worker", name, "--depths", str(args.depths)]
            command += ["--step", str(args.step), "--calls", str(args.calls)]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
            if done.returncode or not lines:
                sys.exit(f"error: {python} {name}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
            runs.append({"python": python, "model": name, **json.loads(lines[-1][len(MARKER) :])})
            text = summary(runs[-1]["rows"], _faults(name))
            print(f"== torch {runs[-1]['versions']['torch']} {name}: {text}", flush=True)
    pythons = " ".join(dict.fromkeys(f"--python {r['python']}" for r in runs))
    models = " ".join(f'"{name}"' if " " in name else name for name in args.models)
    sitting = {
        "measured": str(datetime.date.today()),
        "runtime": int(versions.RUNTIME.group(1)),
        "machine": machine(),
        "command": f"python scripts/stack_depths.py {pythons} --models {models} --depths {args.depths} "
        f"--step {args.step} --calls {args.calls}",
        "calls": args.calls,
        "runs": runs,
    }
    write(sitting, args.out)


def write(sitting: dict[str, Any], out: Path) -> None:
    """docs/results/torch-versions/stack-depths.md (what each run found) and .json, from a sitting's
    figures; each run's depths in a page of its own under stack-depths/."""
    runs = sitting["runs"]
    lines = [
        "# Time per call by depth of Python's stack\n",
        f"Measured on {sitting['measured']} on {sitting['machine']}, CPU, regionalize runtime "
        f"{sitting['runtime']}, by `{sitting['command']}`: one "
        f"process per torch and model; at each depth the median of {sitting['calls']} calls of each form in "
        "turn (with `generate`, per token: (8 tokens - 1 token) / 7, in as many rounds), and the minor page "
        "faults a call (a round) took. Ratios are the default rewrite's time against a full compile's. "
        "Each run's depths are in the page linked from it.\n",
    ]
    pages = out / "stack-depths"
    if pages.exists():
        shutil.rmtree(pages)
    pages.mkdir(parents=True)
    for r in runs:
        torch, model = r["versions"]["torch"], r["model"]
        name = f"{torch.split('+')[0]}-{model.replace(' ', '-')}.md"
        text = summary(r["rows"], _faults(model))
        lines.append(f"- [torch {torch}, {model}](stack-depths/{name}): {text}.")
        table = [
            f"# Time per call by depth of Python's stack: torch {torch}, {model}\n",
            f"From [stack-depths.md](../stack-depths.md) (measured on {sitting['measured']}): {text}.\n",
            "| depth | full: ms, faults | default: ms, faults | default / full |",
            "|---|---|---|---|",
        ]
        for row in r["rows"]:
            full, default = row["full"], row["regional"]
            table.append(
                f"| {row['depth']} | {full['ms']:.2f}, {full['faults']:.0f} | {default['ms']:.2f}, "
                f"{default['faults']:.0f} | {default['ms'] / full['ms']:.2f}x |"
            )
        (pages / name).write_text("\n".join(table) + "\n", encoding="utf-8")
    (out / "stack-depths.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "stack-depths.json").write_text(json.dumps(sitting, indent=1) + "\n", encoding="utf-8")


def _faults(name: str) -> int:
    """Page faults a call (with `generate`, a round) takes where every block's call takes one."""
    blocks = int(name.split()[0].rsplit("-", 1)[1])
    return blocks * (TOKENS - 1) if versions.MODELS[name][2] else blocks


if __name__ == "__main__":
    main()
