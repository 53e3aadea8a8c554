"""A zoo on a local two-worker Ray cluster against the same zoo run locally (issue 73's targets).

    flock /work/timing.lock python scripts/bench_zoo_ray.py [--repeats 3] [--add] \
        [--json docs/results/zoo-ray.json]

Starts a Ray cluster on this machine (a head that runs nothing and two one-CPU worker nodes), then runs
`regionalize verify --manifest docs/results/zoo-ray/zoo.toml` locally and with `--ray ADDRESS`,
interleaved (local first in odd rounds, Ray first in even ones), `--repeats` times each, and reports the
median wall times and their ratio, whether every round's rows were the local run's (status, equivalence,
graphs, recompiles; not timings), the node each entry ran on, and whether the report said that timings
were taken two at a time on one machine. The cluster's start is timed apart: a zoo joins a running one.
Each run records the load average before it (the machine is shared). `--add` adds the rounds to those
the JSON holds (another sitting); the medians are over all. Writes the JSON, docs/results/zoo-ray.md,
and the last Ray run's report into docs/results/zoo-ray/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from regionalize.bench.machine import machine, torch_versions
from regionalize.codemod.runtime_copy import VERSION

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "docs" / "results" / "zoo-ray"
COMPARED = ("equivalent", "state_dict_compatible", "graphs", "recompiles", "frames", "graph_breaks")
SIDE_BY_SIDE = "**Timings were taken 2 at a time on one machine**"


def run(out: Path, *extra: str) -> tuple[float, list[dict[str, Any]], str]:
    """One zoo run's wall time, rows and Markdown report."""
    command = [sys.executable, "-m", "regionalize", "verify", "--manifest", str(ZOO / "zoo.toml")]
    start = time.perf_counter()
    done = subprocess.run([*command, "--out", str(out), "-q", *extra], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"zoo run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, json.loads((out / "zoo.json").read_text())["models"], (out / "zoo.md").read_text()


def same_rows(local: list[dict[str, Any]], ray: list[dict[str, Any]]) -> bool:
    def essence(row: dict[str, Any]) -> list[Any]:
        return [row["name"], row["status"], *((row["result"] or {}).get(key) for key in COMPARED)]

    return [essence(row) for row in local] == [essence(row) for row in ray]


def measure(repeats: int, address: str, scratch: Path, sitting: str) -> list[dict[str, Any]]:
    """`repeats` rounds, each a local and a Ray run (alternating which goes first); the box is shared, so
    each run records the 1-minute load average before it started."""
    rounds = []
    for round_ in range(repeats):
        rows: dict[str, list[dict[str, Any]]] = {}
        record: dict[str, Any] = {"sitting": sitting}
        for kind in ("local", "ray") if round_ % 2 == 0 else ("ray", "local"):
            extra = ("--ray", address) if kind == "ray" else ()
            record[f"{kind}_load"] = round(os.getloadavg()[0], 2)
            seconds, rows[kind], table = run(scratch / f"{kind}-{round_}", *extra)
            record[f"{kind}_s"] = round(seconds, 1)
            print(f"round {round_ + 1}: {kind} {seconds:.1f} s", file=sys.stderr, flush=True)
            if kind == "ray":
                record["report_says_two_at_a_time"] = SIDE_BY_SIDE in table
        record["ratio"] = round(record["ray_s"] / record["local_s"], 3)
        record["rows_match"] = same_rows(rows["local"], rows["ray"])
        record["nodes"] = {row["name"]: row["placement"]["node"][:8] for row in rows["ray"]}
        rounds.append(record)
    return rounds


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every round of every sitting, and whether each round met the other targets."""
    local = statistics.median(r["local_s"] for r in rounds)
    ray = statistics.median(r["ray_s"] for r in rounds)
    return {
        "median_local_s": round(local, 1),
        "median_ray_s": round(ray, 1),
        "ratio": round(ray / local, 3),
        "median_round_ratio": round(statistics.median(r["ratio"] for r in rounds), 3),
        "target_ratio": 0.75,
        "rows_match_every_round": all(r["rows_match"] for r in rounds),
        "two_nodes_every_round": all(len(set(r["nodes"].values())) == 2 for r in rounds),
        "report_says_two_at_a_time": all(r["report_says_two_at_a_time"] for r in rounds),
    }


def start_cluster() -> tuple[Any, float]:
    from ray.cluster_utils import Cluster

    start = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster, time.perf_counter() - start


def markdown(data: dict[str, Any]) -> str:
    m = data["summary"]
    met = [m[key] <= m["target_ratio"] for key in ("ratio", "median_round_ratio")]
    verdict = {
        (True, True): "met both ways",
        (True, False): "met by the medians' ratio, **not** by the rounds' own",
        (False, True): "met by the rounds' own ratios, **not** by the medians'",
        (False, False): "**not met**",
    }[met[0], met[1]]
    lines = [
        "| sitting | round | local (s) | load before | `--ray` (s) | load before | ray / local |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for number, r in enumerate(data["rounds"], 1):
        load = [f"{r[k]:.1f}" if r.get(k) is not None else "-" for k in ("local_load", "ray_load")]
        lines.append(
            f"| {r['sitting']} | {number} | {r['local_s']:.1f} | {load[0]} | {r['ray_s']:.1f} | {load[1]} "
            f"| {r['ratio']:.2f}x |"
        )
    yes = {True: "yes", False: "**no**"}
    return f"""# A zoo on a local two-worker Ray cluster

`python scripts/bench_zoo_ray.py` ({len(data["rounds"])} rounds in all): {data["machine"]}, torch
{data["torch"]}, Ray {data["ray"]}, regionalize runtime {data["runtime"]}. The four entries of
[zoo-ray/zoo.toml](zoo-ray/zoo.toml) (the test models, compiled in process) run locally one after another
and with `--ray` on a cluster of two one-CPU worker nodes on this machine (the head runs nothing),
interleaved (which goes first alternates). The cluster's start ({data["cluster_start_s"]:.1f} s) is not
counted: a zoo joins a running cluster. The machine is shared: the 1-minute load average before each run
says how busy it was (2.0 is both cores).

{chr(10).join(lines)}

Median wall time: local {m["median_local_s"]:.1f} s, `--ray` {m["median_ray_s"]:.1f} s: **{m["ratio"]:.2f}x**
(the median of the rounds' own ratios, each Ray run against the local run beside it:
{m["median_round_ratio"]:.2f}x). Target: at most {m["target_ratio"]}x: {verdict}. The ratio follows the
load: where the machine was otherwise idle, two workers have both cores to themselves.
Every round's rows were the local run's (status, equivalence, graphs, recompiles, frames, graph
breaks; not timings): {yes[m["rows_match_every_round"]]}. Both worker nodes ran entries in every round:
{yes[m["two_nodes_every_round"]]}. The report said that timings were taken two at a time on one machine:
{yes[m["report_says_two_at_a_time"]]}; they were, so the Ray run's compile and per-call times measure each
other and are not comparable with the local run's. The last Ray run's report:
[zoo-ray/zoo.md](zoo-ray/zoo.md).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "zoo-ray.json")
    parser.add_argument("--add", action="store_true", help="add these rounds to the JSON's, a sitting more")
    args = parser.parse_args()
    earlier = json.loads(args.json.read_text())["rounds"] if args.add and args.json.exists() else []
    sitting = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cluster, started = start_cluster()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            rounds = measure(args.repeats, cluster.address, Path(scratch), sitting)
            last = Path(scratch) / f"ray-{args.repeats - 1}"
            shutil.rmtree(ZOO / "zoo-reports", ignore_errors=True)
            shutil.copytree(last / "zoo-reports", ZOO / "zoo-reports")
            for name in ("zoo.md", "zoo.json"):
                shutil.copy(last / name, ZOO / name)
    finally:
        cluster.shutdown()
    rounds = earlier + rounds
    data = {
        "machine": machine(),
        "torch": torch_versions()["torch"],
        "ray": version("ray"),
        "runtime": VERSION,
        "cluster_start_s": round(started, 1),
        "summary": summary(rounds),
        "rounds": rounds,
    }
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    (ROOT / "docs" / "results" / "zoo-ray.md").write_text(markdown(data))
    print(json.dumps(data["summary"], indent=2))


if __name__ == "__main__":
    main()
