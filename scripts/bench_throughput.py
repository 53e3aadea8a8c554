"""Bulk-run throughput and memory: regionalize against TorchFix on the transformers models tree.

    python scripts/bench_throughput.py [--repeats 3] [--json docs/throughput.json]

Downloads (never commits) the transformers wheel into .downloads/ and TorchFix into its own virtual
environment there (it pins an older libcst). Runs, interleaved and `--repeats` times each:
`regionalize --check -j 1`, `regionalize --check -j 2` and `torchfix` (default rules, 2 jobs; once by
default, as it takes minutes) over the same tree, and reports medians and ratios from that one run.
Then the peak memory of `-j 1` runs over growing subsets of the files, to show it does not grow with
the number of files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / ".downloads"
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
    parser.add_argument("--torchfix-repeats", type=int, default=1, help="TorchFix is slow; 1 is plenty")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    tree = fetch_tree()
    files = sorted(str(p) for p in tree.rglob("*.py"))
    lines = sum(len(Path(f).read_bytes().splitlines()) for f in files)
    regionalize = [sys.executable, "-m", "regionalize", "--check", "-q"]
    commands = {
        "regionalize -j 1": [*regionalize, "-j", "1", str(tree)],
        "regionalize -j 2": [*regionalize, "-j", "2", str(tree)],
        "torchfix -j 2": [str(torchfix_bin()), "--jobs", "2", str(tree)],
    }
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
    ratio = medians["torchfix -j 2"] / medians["regionalize -j 2"]
    print(f"torchfix / regionalize, both on 2 jobs: {ratio:.1f}x")

    memory = {}
    for count in (100, 500, len(files)):
        subset = files[:: max(1, len(files) // count)][:count]
        started = time.perf_counter()
        _, peak = timed([*regionalize, "-j", "1", *subset])
        memory[len(subset)] = peak
        print(f"peak memory, -j 1, {len(subset):5} files: {peak} MiB ({time.perf_counter() - started:.1f} s)")
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


if __name__ == "__main__":
    main()
