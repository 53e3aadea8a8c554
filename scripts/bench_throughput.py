"""Bulk-run throughput and memory: regionalize against TorchFix on the transformers models tree.

    python scripts/bench_throughput.py [--repeats 3] [--torchfix-repeats 1] \
        [--json docs/results/throughput.json]

Downloads (never commits) the transformers wheel into .downloads/ and TorchFix into its own virtual
environment there (it pins an older libcst). Runs, interleaved and `--repeats` times each:
`regionalize --check -j 1`, `regionalize --check -j 2` and `torchfix` (default rules, 2 jobs; once by
default, as it takes minutes) over the same tree, and reports medians and ratios from that one run.
Then the peak memory of `-j 1` runs over growing subsets of the files, to show it does not grow with
the number of files. Writes docs/results/throughput.md (the table, with the date, machine and versions).
`--torchfix-repeats 0` leaves TorchFix out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

from regionalize.bench.machine import machine

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / ".downloads"
DOCS = ROOT / "docs" / "results"
TRANSFORMERS = "transformers==5.23.0"
TORCHFIX = "torchfix==0.7.0"


def fetch_tree() -> Path:
    name = TRANSFORMERS.replace("==", "-")
    tree = DOWNLOADS / name
    if not tree.exists():
        wheels = DOWNLOADS / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels, TRANSFORMERS],
            check=True,
        )
        wheel = next(wheels.glob(f"{name}-*.whl"))
        zipfile.ZipFile(wheel).extractall(tree)
    return tree / "transformers" / "models"


def torchfix_bin() -> Path:
    env = DOWNLOADS / "torchfix-venv"
    binary = env / "bin" / "torchfix"
    if not binary.exists():
        venv.create(env, with_pip=True)
        subprocess.run([env / "bin" / "python", "-m", "pip", "install", "-q", TORCHFIX], check=True)
    return binary


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and the peak RSS (MiB) of the command's largest process, measured in a fresh child."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, check=True)
    seconds, kib = out.stdout.split()
    return float(seconds), int(kib) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--torchfix-repeats", type=int, default=1, help="TorchFix is slow; 1 is plenty, 0 leaves it out"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    tree = fetch_tree()
    files = sorted(str(p) for p in tree.rglob("*.py"))
    lines = sum(len(Path(f).read_bytes().splitlines()) for f in files)
    regionalize = [sys.executable, "-m", "regionalize", "--check", "-q"]
    commands = {
        "regionalize -j 1": [*regionalize, "-j", "1", str(tree)],
        "regionalize -j 2": [*regionalize, "-j", "2", str(tree)],
    }
    if args.torchfix_repeats:
        commands["torchfix -j 2"] = [str(torchfix_bin()), "--jobs", "2", str(tree)]
    print(f"tree: {TRANSFORMERS} models, {len(files)} files, {lines} lines; {args.repeats} runs each")
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(args.repeats):
        for name, command in commands.items():  # interleaved, so drift in machine load hits all alike
            if name.startswith("torchfix") and round_ >= args.torchfix_repeats:
                continue
            seconds[name].append(timed(command)[0])
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in medians.items():
        print(f"{name:18} {value:7.1f} s median  ({', '.join(f'{v:.1f}' for v in seconds[name])})")
    ratio = medians["torchfix -j 2"] / medians["regionalize -j 2"] if "torchfix -j 2" in medians else None
    if ratio:
        print(f"torchfix / regionalize, both on 2 jobs: {ratio:.1f}x")

    memory = {}
    for count in (100, 500, len(files)):
        subset = files[:: max(1, len(files) // count)][:count]
        started = time.perf_counter()
        _, peak = timed([*regionalize, "-j", "1", *subset])
        memory[len(subset)] = peak
        print(f"peak memory, -j 1, {len(subset):5} files: {peak} MiB ({time.perf_counter() - started:.1f} s)")
    (DOCS / "throughput.md").write_text(_markdown(len(files), lines, seconds, medians, memory))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "files": len(files),
                    "lines": lines,
                    "seconds": seconds,
                    "medians": medians,
                    "torchfix_ratio": ratio,
                    "peak_mib_by_files": memory,
                },
                indent=2,
            )
            + "\n"
        )


def _markdown(
    files: int, lines: int, seconds: dict[str, list[float]], medians: dict[str, float], memory: dict[int, int]
) -> str:
    from regionalize import __version__

    rows = [
        f"| `{name}` | {medians[name]:.1f} s | {', '.join(f'{v:.1f}' for v in seconds[name])} |"
        for name in medians
    ]
    peaks = ", ".join(f"{peak} MiB for {count:,} files" for count, peak in memory.items())
    return "\n".join(
        [
            "# Bulk-run throughput",
            "",
            f"Measured by `python scripts/bench_throughput.py` on {datetime.date.today()}: {TRANSFORMERS} "
            f"models tree ({files:,} files, {lines:,} lines), `regionalize --check -q`, regionalize "
            f"{__version__}, {machine()}. Runs interleaved, median of each.",
            "",
            "| command | median | runs |",
            "|---|---|---|",
            *rows,
            "",
            f"Peak memory of a `-j 1` run: {peaks}.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
