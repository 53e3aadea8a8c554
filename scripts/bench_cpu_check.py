"""Inductor's CPU check on a cold start: torch's own, one instruction set after another, against the
runtime's, which checks the sets at once.

Before its first CPU kernel, Inductor builds and loads a small C++ program for each vector instruction set
the CPU reports (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`). Each start here is a fresh process with
an empty `TORCHINDUCTOR_CACHE_DIR`, as a first call finds it on a new machine or container, under the
timing lock; the two ways take turns, and the page gives medians. Both must find the same sets and flags.

    python scripts/bench_cpu_check.py [--rounds 5] [--out docs/results/cpu-check]  # writes OUT.json, OUT.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCK = "/work/timing.lock"
WAYS = {"torch": "one set after another (torch's own)", "runtime": "the sets at once (the runtime's)"}


def child(way: str) -> dict[str, Any]:
    """Runs the check one way in this process and returns its seconds and the sets it found."""
    import time

    import torch  # noqa: F401  # imported before the clock, as every start imports it
    from torch._inductor import cpu_vec_isa

    from regionalize.runtime.internals import cpu

    began = time.perf_counter()
    if way == "torch":
        cpu_vec_isa.valid_vec_isa_list()
    elif (thread := cpu.cpu_check()) is not None:  # None where this torch has no CPU check to start
        thread.join()
    seconds = time.perf_counter() - began
    found = [[str(isa), isa.build_arch_flags()] for isa in cpu_vec_isa.valid_vec_isa_list()]
    return {"seconds": seconds, "found": found}


def start(way: str) -> dict[str, Any]:
    """Runs one start in a fresh process on an empty cache, under the timing lock."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        command = ["flock", LOCK, sys.executable, __file__, "--child", way]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(rounds: int) -> dict[str, Any]:
    """Runs both ways `rounds` times, taking turns, the order reversed every round."""
    import torch

    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for index in range(rounds):
        for way in list(WAYS) if index % 2 == 0 else list(reversed(WAYS)):
            runs[way].append(start(way))
            print(way, f"{runs[way][-1]['seconds']:.2f} s", flush=True)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, Python {platform.python_version()}",
        "torch": torch.__version__,
        "rounds": rounds,
        "runs": runs,
    }


def markdown(results: dict[str, Any], source: str) -> str:
    """Renders the page: each way's median, and whether both found the same sets."""
    medians = {way: statistics.median(r["seconds"] for r in results["runs"][way]) for way in WAYS}
    found = {json.dumps(r["found"]) for runs in results["runs"].values() for r in runs}
    sets = ", ".join(name for name, _ in results["runs"]["torch"][0]["found"]) or "none"
    lines = [
        "# Inductor's CPU check on a cold start",
        "",
        f"Written by `scripts/bench_cpu_check.py` from {source}; do not edit. {results['machine']}, torch "
        f"{results['torch']}, {results['date']}. Each start is a fresh process with an empty Inductor cache; "
        f"the two ways took turns, {results['rounds']} rounds, medians. Sets found: {sets}; "
        f"{'the same sets and flags' if len(found) == 1 else 'different sets or flags'} both ways.",
        "",
        "| check | seconds | against torch's |",
        "|---|--:|--:|",
    ]
    for way, what in WAYS.items():
        lines.append(f"| {what} | {medians[way]:.2f} s | {medians['torch'] / medians[way]:.2f}x sooner |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "cpu-check")
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results = measure(args.rounds)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results, args.out.with_suffix(".json").name))


if __name__ == "__main__":
    main()
