"""`regionalize verify --manifest --ray`: a zoo on a local Ray cluster of two one-CPU workers (the head
runs nothing), checked against a local run of the same manifest; a worker killed mid-entry; a timeout;
Ctrl-C and --resume; and Ray kept out of every path that does not ask for it."""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regionalize.bench import zoo_cluster
from regionalize.bench.manifest import ManifestError, load
from regionalize.bench.zoo import Row
from regionalize.bench.zoo_ray import INSTALL, ClusterError, _job_folder, _options, shipped

ray = pytest.importorskip("ray")
MODELS = Path(__file__).parent / "models"
# Every entry as cheap as verify allows: no fresh-process timings, the eager backend, no optional variant.
DEFAULTS = """[defaults]
cold-start = false
skip = ["dedup", "per-block", "bypass"]
regionalize = { backend = "eager" }
"""
HANG = "import time\n\n\ndef make():\n    time.sleep(600)\n"
# Kills the Ray worker that runs this entry, at import: as a node or worker lost mid-entry. With a marker
# file named, only the first time.
KILLER = """
import os
import signal
import socket
from pathlib import Path

MARKER = {marker!r}
parent = Path(f"/proc/{{os.getppid()}}/cmdline").read_bytes()
if parent.startswith(b"ray::") and not (MARKER and Path(MARKER).exists()):
    if MARKER:
        Path(MARKER).write_text("killed once")
    os.kill(os.getppid(), signal.SIGKILL)

import torch  # noqa: E402


def make():
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Two one-CPU worker nodes on this machine; the head holds no CPU, so no entry runs on it."""
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    session = made.head_node.get_session_dir_path()
    try:
        for _ in range(2):
            made.add_node(num_cpus=1)
        made.wait_for_nodes()
        yield made.address
    finally:
        made.shutdown()
    assert session not in processes()  # every Ray process of the cluster is gone


def zoo(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zoo.toml"
    path.write_text(DEFAULTS + textwrap.dedent(body))
    return path


def verify(manifest: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "regionalize", "verify", "--manifest", str(manifest), "--out", str(out)]
    return subprocess.run([*command, *extra], capture_output=True, text=True, timeout=400)


def models(out: Path) -> list[dict]:
    return json.loads((out / "zoo.json").read_text())["models"]


def processes() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def scratch() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("regionalize-zoo-*")}


def test_a_zoo_on_ray_gives_the_local_run_s_rows(tmp_path: Path, cluster: str) -> None:
    shipped_folder = tmp_path / "ship"
    shipped_folder.mkdir()
    (shipped_folder / "net.py").write_text((MODELS / "stack.py").read_text())
    (tmp_path / "hang.py").write_text(HANG)
    manifest = zoo(
        tmp_path,
        f"""
        [[model]]
        name = "stack"
        model = "{MODELS / "stack.py"}"
        factory = "make"

        [[model]]
        name = "broken"
        model = "{MODELS / "stack.py"}"
        factory = "make"
        rewritten = "{MODELS / "stack_broken.py"}"

        [[model]]
        name = "shipped"
        model = "ship/net.py"
        factory = "make"
        ray = {{ working_dir = "ship" }}

        [[model]]
        name = "hangs"
        model = "hang.py"
        factory = "make"
        timeout = 4

        [[model]]
        name = "trained"
        model = "{MODELS / "stack.py"}"
        factory = "make"
        workload = "train"
        steps = 2
        """,
    )
    before = scratch()
    local, remote = verify(manifest, tmp_path / "local"), verify(manifest, tmp_path / "ray", "--ray", cluster)
    assert local.returncode == remote.returncode == 2, remote.stderr  # the worst row: the timeout
    assert remote.stdout.splitlines()[:4] == local.stdout.splitlines()[:4]
    here, there = models(tmp_path / "local"), models(tmp_path / "ray")
    assert [row["status"] for row in there] == ["pass", "fail", "pass", "timeout", "pass"]
    for mine, theirs in zip(here, there, strict=True):
        assert (mine["name"], mine["status"], mine["reason"]) == (
            theirs["name"],
            theirs["status"],
            theirs["reason"],
        )
        for key in ("equivalent", "state_dict_compatible", "graphs", "recompiles", "frames", "graph_breaks"):
            assert (mine["result"] or {}).get(key) == (theirs["result"] or {}).get(key), key
    # The training entry's steps ran on the worker: each step's loss matched the original's there too.
    trained = there[4]["result"]
    assert trained["workload"]["kind"] == "train" and trained["losses_equal"] and trained["train_ms_per_step"]
    # Each entry had a worker of its own: both nodes ran entries, never the CPU-less head, two at a time.
    nodes = {row["placement"]["node"] for row in there}
    assert len(nodes) == 2 and all(row["placement"]["device"] == "CPU x1" for row in there)
    table = (tmp_path / "ray" / "zoo.md").read_text()
    assert "Ran on Ray: 2 nodes." in table and "**Timings were taken 2 at a time on one machine**" in table
    assert "| node, device, versions |" in table
    assert "placement" not in here[0]  # a local run's rows are as before
    # The shipped entry ran from the copy Ray unpacked, not from the folder here.
    assert not there[2]["result"]["model"].startswith(str(tmp_path))
    assert (
        "killed after 4 s" in there[3]["reason"]
        and "PASS" in (tmp_path / "ray/zoo-reports/stack.txt").read_text()
    )
    # Progress: where each entry runs, and how many are done, running and queued.
    assert (
        "started on " in remote.stderr
        and " running (" in remote.stderr
        and "5 done, 0 running" in remote.stderr
    )
    assert str(tmp_path / "hang.py") not in processes()  # the timeout killed the entry's process group
    assert scratch() == before  # nothing left on the workers


def test_a_worker_killed_mid_entry_costs_one_retry_and_then_a_crash(tmp_path: Path, cluster: str) -> None:
    (tmp_path / "once.py").write_text(KILLER.format(marker=str(tmp_path / "killed")))
    (tmp_path / "always.py").write_text(KILLER.format(marker=""))
    manifest = zoo(
        tmp_path,
        """
        [[model]]
        name = "once"
        model = "once.py"
        factory = "make"

        [[model]]
        name = "always"
        model = "always.py"
        factory = "make"
        """,
    )
    done = verify(manifest, tmp_path / "out", "--ray", cluster)
    assert done.returncode == 2, done.stderr
    once, always = models(tmp_path / "out")
    # Nothing to rewrite in it: the second try's row is the model's own, with the retry said.
    assert once["status"] == "unchanged" and "retried once after: WorkerCrashedError" in once["reason"]
    assert once["placement"]["attempts"] == 2
    assert always["status"] == "crashed" and always["reason"].startswith(
        "worker lost twice: WorkerCrashedError"
    )
    assert done.stderr.count("trying once more") == 2
    assert (
        "always.py" not in processes() and "once.py" not in processes()
    )  # the verify processes died with their workers


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_writes_the_rows_done_and_resume_runs_the_rest(
    tmp_path: Path, cluster: str, stop: signal.Signals
) -> None:
    """Ctrl-C, and a scheduler's SIGTERM (Slurm's `scancel`), alike."""
    (tmp_path / "hang.py").write_text(HANG)
    manifest = zoo(
        tmp_path,
        f"""
        [[model]]
        name = "stack"
        model = "{MODELS / "stack.py"}"
        factory = "make"

        [[model]]
        name = "hangs"
        model = "hang.py"
        factory = "make"
        """,
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "regionalize", "verify", "--manifest", str(manifest), "--out", str(out)]
    driver = subprocess.Popen(
        [*command, "--ray", cluster], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert driver.stderr is not None
    for line in driver.stderr:  # until the first entry's row is in
        if "[1/2 stack] pass" in line:
            break
    driver.send_signal(stop)
    stdout, _ = driver.communicate(timeout=60)
    assert driver.returncode == 2 and "interrupted: 1 of 2 entries done; --resume runs the rest" in stdout
    [stack] = models(out)
    assert stack["name"] == "stack" and stack["status"] == "pass"
    deadline = time.monotonic() + 10  # the cancelled worker's verify process dies with it
    while str(tmp_path / "hang.py") in processes():
        assert time.monotonic() < deadline
        time.sleep(0.5)

    resumed = verify(manifest, out, "--ray", cluster, "--resume", "--timeout", "3")
    assert "--resume: 1 of 2 rows kept" in resumed.stderr and "[1/1 hangs] started on" in resumed.stderr
    assert [(row["name"], row["status"]) for row in models(out)] == [("stack", "pass"), ("hangs", "timeout")]
    assert models(out)[0]["seconds"] == stack["seconds"]  # the earlier row itself
    assert "earlier run" in (out / "zoo.md").read_text()


def test_without_ray_ray_is_one_line_on_how_to_install_it(tmp_path: Path) -> None:
    manifest = zoo(tmp_path, f'[[model]]\nname = "a"\nmodel = "{MODELS / "stack.py"}"\nfactory = "make"\n')
    blocked = "import sys; sys.modules['ray'] = None; from regionalize.cli import main; main()"
    argv = ["regionalize", "verify", "--manifest", str(manifest), "--ray"]
    done = subprocess.run([sys.executable, "-c", blocked, *argv[1:]], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.splitlines() == [INSTALL] and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo.toml"]  # nothing else happened


def test_an_address_nothing_answers_at_is_one_error_line(tmp_path: Path) -> None:
    manifest = zoo(tmp_path, f'[[model]]\nname = "a"\nmodel = "{MODELS / "stack.py"}"\nfactory = "make"\n')
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = verify(manifest, tmp_path / "out", "--ray", f"127.0.0.1:{port}")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: cannot reach a Ray cluster at 127.0.0.1:{port}: Connection refused"
    ]


def test_the_runtime_codemod_and_a_local_run_never_import_ray(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text((MODELS / "stack.py").read_text())
    check = (
        "import sys, regionalize.runtime, regionalize.codemod, regionalize.bench.zoo, regionalize.verify;"
        "from regionalize.cli import main;"
        "sys.argv = ['regionalize', sys.argv[1]];"
        "import atexit; atexit.register(lambda: print('ray' in sys.modules));"
        "main()"
    )
    done = subprocess.run([sys.executable, "-c", check, str(source)], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr


def test_a_ray_table_is_checked_and_a_working_dir_is_relative_to_the_manifest(tmp_path: Path) -> None:
    bad = [
        ("ray = { gpus = 1 }", "ray has unknown key 'gpus'"),
        ("ray = { num_cpus = -1 }", "ray must be a number, 0 or more"),
        ("ray = 3", "ray must be a table of num_cpus"),
    ]
    for line, message in bad:
        (tmp_path / "zoo.toml").write_text(f"[[model]]\nname = 'a'\nfactory = 'f'\n{line}\n")
        with pytest.raises(ManifestError, match=message):
            load(tmp_path / "zoo.toml")
    manifest = zoo(
        tmp_path,
        """
        [defaults.ray]
        num_cpus = 2
        working_dir = "ship"

        [[model]]
        name = "a"
        model = "ship/net.py"
        factory = "ship/f.py:make"
        ray = { num_gpus = 1 }
        """,
    )
    [entry] = load(manifest)
    root = str((tmp_path / "ship").resolve())
    assert entry.settings["ray"] == {"num_cpus": 2, "working_dir": root, "num_gpus": 1}
    moved, ships = shipped(entry, tmp_path)
    assert ships and moved.model == "net.py" and moved.factory == "f.py:make"
    # Ray uploads a local folder for a whole run: two are refused, a URI is each task's own.
    other = dataclasses.replace(entry, settings={"ray": {"working_dir": str(tmp_path)}})
    with pytest.raises(ClusterError, match="the entries ship 2 local working_dir folders"):
        _job_folder([entry, other])
    remote = dataclasses.replace(entry, settings={"ray": {"working_dir": "s3://zoo/ship.zip"}})
    assert _job_folder([entry, remote]) == root and _job_folder([remote]) is None
    assert _options(remote, [{"CPU": 2.0}])["runtime_env"] == {"working_dir": "s3://zoo/ship.zip"}
    assert shipped(remote, tmp_path)[0].model == "ship/net.py"  # read inside the archive
    unshipped = dataclasses.replace(entry, settings={k: v for k, v in entry.settings.items() if k != "ray"})
    assert entry.verify_args(Path("o.json")) == unshipped.verify_args(
        Path("o.json")
    )  # a local run: no notice


def test_a_task_reserves_a_gpu_or_a_whole_node_s_cpus_and_what_no_node_has_is_refused(tmp_path: Path) -> None:
    (tmp_path / "zoo.toml").write_text(
        "[[model]]\nname = 'cpu'\nfactory = 'f'\ndevice = 'cpu'\n"
        "[[model]]\nname = 'auto'\nfactory = 'f'\n"
        "[[model]]\nname = 'big'\nfactory = 'f'\nray = { num_cpus = 64 }\n"
    )
    cpu, auto, big = load(tmp_path / "zoo.toml")
    cpu_nodes = [{"CPU": 8.0}, {"CPU": 4.0}, {"memory": 1.0}]  # the smallest node with CPUs: 4
    assert _options(cpu, cpu_nodes) == {"num_gpus": 0, "num_cpus": 4.0}
    assert _options(auto, cpu_nodes) == {"num_gpus": 0, "num_cpus": 4.0}
    gpu_nodes = [{"CPU": 16.0, "GPU": 8.0}]
    assert _options(auto, gpu_nodes) == {"num_gpus": 1, "num_cpus": 1}
    assert _options(cpu, gpu_nodes) == {"num_gpus": 0, "num_cpus": 16.0}
    with pytest.raises(ClusterError, match="big asks for 64 CPU, which no node of the cluster has"):
        _options(big, cpu_nodes)


def test_the_summary_flags_mixed_versions_and_timings_taken_side_by_side() -> None:
    def row(name: str, node: str, host: str, torch: str, span: tuple[float, float]) -> Row:
        where = {"node": node * 8, "host": host, "device": "CPU x1", "torch": torch, "cuda": None}
        return Row(name, "pass", "", 1.0, {}, "", where | {"started": span[0], "finished": span[1]})

    rows = [
        row("a", "1", "m1", "2.13.0", (0, 10)),
        row("b", "2", "m1", "2.13.0", (5, 15)),  # beside a, on the same machine
        row("c", "3", "m2", "2.14.1", (0, 10)),
        row("d", "3", "m2", "2.14.1", (10, 20)),  # after c
    ]
    meta = zoo_cluster.summary(rows)
    assert meta["mixed_versions"] and meta["most_at_once"] == {"m1": 2, "m2": 1} and meta["nodes"] == 3
    text = " ".join(zoo_cluster.lines(meta))
    assert "**Mixed versions across nodes**: torch 2.13.0, CUDA - on m1/11111111, m1/22222222" in text
    assert "taken 2 at a time on one machine** (m1)" in text and "(m2)" not in text
    assert zoo_cluster.cell(rows[2]) == "m2/33333333, CPU x1, torch 2.14.1"
    assert not zoo_cluster.summary([rows[0]])["mixed_versions"]


def test_ray_and_resume_go_with_a_manifest() -> None:
    argv = [sys.executable, "-m", "regionalize", "verify", str(MODELS / "stack.py"), "--factory", "make"]
    done = subprocess.run([*argv, "--resume"], capture_output=True, text=True)
    assert done.returncode == 2 and "--ray and --resume go with --manifest" in done.stderr
