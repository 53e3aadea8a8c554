"""`regionalize verify --manifest zoo.toml --ray [ADDRESS]`: the zoo's entries as Ray tasks, one report.

Each entry is one task (`ray_task.verify_entry`) that runs today's fresh `python -m regionalize verify`
process on a worker. A task reserves a whole GPU where the entry targets CUDA, or a whole node's CPUs
otherwise, so that no two timings share a device; an entry's `ray` table may say otherwise. A task lost
with its worker or node is submitted once more, then reported `crashed` with the cause. Ctrl-C, or a
SIGTERM (a scheduler cancelling the job), cancels what is left and returns the rows done. Only this
module and `ray_task` import Ray: the runtime, the codemod and a local run never do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regionalize.bench import ray_task
from regionalize.bench.manifest import Entry
from regionalize.bench.zoo import Row
from regionalize.bench.zoo_board import Board

INSTALL = 'error: --ray needs Ray: pip install "regionalize[ray]"'
_ATTEMPTS = 2  # a lost worker costs one retry
_POLL_S = 1.0
_CONNECT_S = 10.0


class ClusterError(Exception):
    """The cluster cannot run the manifest as written (no node big enough for an entry): one line."""


@dataclass
class _Job:
    number: int
    entry: Entry
    options: dict[str, Any]
    ref: Any = None
    attempts: int = 0
    lost: list[str] = field(default_factory=list)  # why each attempt was lost
    lost_on: list[str] = field(default_factory=list)  # and on which Ray node


def run_zoo_ray(
    entries: list[Entry], cwd: Path, reports: Path, progress: Callable[[str], None], address: str
) -> tuple[list[Row | None], bool]:
    """Verify every entry on the Ray cluster at `address` ("local" starts one, "auto" joins the running
    one); reports[/NAME.txt] gets each one's report. Returns the rows in manifest order (None where Ctrl-C
    came first) and whether it did."""
    import ray

    reports = reports.resolve()
    reports.mkdir(parents=True, exist_ok=True)
    _connect(ray, address, _job_folder(entries))
    try:
        nodes = _nodes(ray)
        progress(f"Ray at {address}: {_describe(nodes)}")
        jobs = [_Job(n, e, _options(e, nodes)) for n, e in enumerate(entries, 1)]
        with _terminate_interrupts():
            return _run(ray, jobs, cwd, reports, progress)
    finally:
        ray.shutdown()  # a cluster started here stops with it; a joined one is only left


@contextlib.contextmanager
def _terminate_interrupts() -> Iterator[None]:
    """SIGTERM taken as Ctrl-C while the tasks run: Slurm's `scancel` and a container's stop send it, and the
    rows done must still be written. Set after `ray.init`, which installs a handler of its own, and put
    back after; only the main thread may set one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _job_folder(entries: list[Entry]) -> str | None:
    """The one local working_dir the entries ship, if any. Ray uploads a local folder for a whole job
    (`ray.init`), never for one task; a task's own working_dir must be a URI of an archive."""
    shipped_dirs = (entry.settings.get("ray", {}).get("working_dir") for entry in entries)
    folders = {folder for folder in shipped_dirs if folder and not _is_uri(folder)}
    if len(folders) > 1:
        raise ClusterError(
            f"the entries ship {len(folders)} local working_dir folders; Ray uploads one a run: give one "
            "folder, or each entry a URI of an archive (s3://, gs://, https://...zip)"
        )
    return next(iter(folders), None)


def _is_uri(value: str) -> bool:
    return "://" in value


def _reachable(address: str) -> None:
    """A HOST:PORT that answers, checked in seconds: ray.init retries an unreachable one for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # local, auto, or a URI: ray.init's own checks are quick
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}") from None


def _connect(ray: Any, address: str, working_dir: str | None) -> None:
    import logging

    started = address == "local"
    _reachable(address)
    # Workers' output is the entries' own, kept in their reports: not echoed to this terminal.
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.ERROR,  # its own notices (token auth, ...) are not the zoo's
            include_dashboard=False if started else None,
            runtime_env={"working_dir": working_dir} if working_dir else None,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {_first_line(exc)}") from None


def _nodes(ray: Any) -> list[dict[str, float]]:
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def _describe(nodes: list[dict[str, float]]) -> str:
    cpus = sum(n.get("CPU", 0) for n in nodes)
    gpus = sum(n.get("GPU", 0) for n in nodes)
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:g} CPUs, {gpus:g} GPUs"


def _options(entry: Entry, nodes: list[dict[str, float]]) -> dict[str, Any]:
    """The task's resources: a GPU for a CUDA entry, else every CPU of the smallest node with CPUs; the
    entry's ray table over that. Refuses what no node has, where Ray would wait for it forever."""
    table = entry.settings.get("ray", {})
    device = entry.settings.get("device", "auto")
    cuda = device == "cuda" or (device == "auto" and any(n.get("GPU", 0) for n in nodes))
    cpus = min((n["CPU"] for n in nodes if n.get("CPU", 0) > 0), default=1)
    options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1} if cuda else {"num_gpus": 0, "num_cpus": cpus}
    options |= {key: table[key] for key in ("num_cpus", "num_gpus", "resources") if key in table}
    wanted = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options.get("resources", {})}
    if not any(all(n.get(k, 0) >= v for k, v in wanted.items() if v) for n in nodes):
        asked = ", ".join(f"{v:g} {k}" for k, v in wanted.items() if v)
        raise ClusterError(f"{entry.name} asks for {asked}, which no node of the cluster has")
    if _is_uri(table.get("working_dir", "")):  # a local one is the job's (_job_folder)
        options["runtime_env"] = {"working_dir": table["working_dir"]}
    return options


def shipped(entry: Entry, manifest_folder: Path) -> tuple[Entry, bool]:
    """The entry as a task sees it, and whether it ships its files. With a working_dir, Ray unpacks it as
    the task's current folder: paths inside a local working_dir are made relative to it, and with a URI's
    archive, paths relative to the manifest's folder are read inside the archive instead."""
    shipped_dir = entry.settings.get("ray", {}).get("working_dir")
    if shipped_dir is None:
        return entry, False
    root = manifest_folder.resolve() if _is_uri(shipped_dir) else Path(shipped_dir)

    def inside(value: str | None) -> str | None:
        if value is None or not Path(value).is_absolute() or not Path(value).is_relative_to(root):
            return value
        return str(Path(value).relative_to(root))

    home, sep, name = entry.factory.rpartition(":")
    factory = f"{inside(home)}:{name}" if sep else entry.factory
    moved = dataclasses.replace(
        entry, model=inside(entry.model), rewritten=inside(entry.rewritten), factory=factory
    )
    return moved, True


def _run(
    ray: Any, jobs: list[_Job], cwd: Path, reports: Path, progress: Callable[[str], None]
) -> tuple[list[Row | None], bool]:
    events = ray.remote(num_cpus=0)(ray_task.EventBox).remote()  # what started where, and the steps
    task = ray.remote(ray_task.verify_entry)
    board = Board([job.entry.name for job in jobs], progress)
    rows: list[Row | None] = [None] * len(jobs)
    pending = {}
    try:
        for job in jobs:
            _submit(task, job, cwd, reports.name, events)
            pending[job.ref] = job
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            board.events(ray.get(events.take.remote()))
            for ref in ready:
                job = pending.pop(ref)
                label = board.label(job.entry.name)
                row = _collect(ray, job, reports, lambda line, label=label: progress(f"{label} {line}"))
                if row is None:  # lost: submitted again, preferably on another node
                    job.lost_on += [board.nodes[job.entry.name]] if job.entry.name in board.nodes else []
                    _submit(task, job, cwd, reports.name, events)
                    pending[job.ref] = job
                    board.requeued(job.entry.name)
                else:
                    rows[job.number - 1] = row
                    board.finished(job.entry.name, row)
            board.tick()
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)  # kills the worker: its verify process dies with it
        progress(f"interrupted: {len(pending)} entries cancelled")
        return rows, True
    finally:
        ray.kill(events)
    return rows, False


def _submit(task: Any, job: _Job, cwd: Path, reports_name: str, events: Any) -> None:
    entry, ships = shipped(job.entry, cwd)
    # Retries are this module's, not Ray's (max_retries=0): each is counted and its cause kept.
    job.ref = task.options(max_retries=0, **job.options, **_elsewhere(job.lost_on)).remote(
        entry, None if ships else str(cwd), reports_name, events
    )
    job.attempts += 1


def _elsewhere(nodes: list[str]) -> dict[str, Any]:
    """After a lost attempt: prefer any node but the ones it was lost on (a soft preference: where no
    other node has room, the same node serves)."""
    if not nodes:
        return {}
    from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

    return {"scheduling_strategy": NodeLabelSchedulingStrategy({}, soft={"ray.io/node-id": NotIn(*nodes)})}


def _collect(ray: Any, job: _Job, reports: Path, progress: Callable[[str], None]) -> Row | None:
    """The job's row, its report written here; None where its worker was lost and one try is left."""
    try:
        outcome: ray_task.Outcome = ray.get(job.ref)
    except _lost_errors(ray) as exc:
        cause = _first_line(exc)
        job.lost.append(cause)
        if job.attempts < _ATTEMPTS:
            progress(f"worker lost ({cause}); trying once more")
            return None
        return _crashed(job, reports, f"worker lost twice: {'; then '.join(job.lost)}")
    except ray.exceptions.RayError as exc:  # the task could not run at all: no retry would help
        return _crashed(job, reports, f"task failed: {_first_line(exc)}")
    (reports / f"{job.entry.name}.txt").write_text(outcome.report_text, encoding="utf-8")
    row = outcome.row
    if job.lost:
        row.reason = "; ".join(filter(None, [row.reason, f"retried once after: {job.lost[0]}"]))
    row.placement = (row.placement or {}) | {"attempts": job.attempts}
    return row


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    e = ray.exceptions
    return (
        e.WorkerCrashedError,
        e.NodeDiedError,
        e.LocalRayletDiedError,
        e.ObjectLostError,
        e.OwnerDiedError,
        e.OutOfMemoryError,  # Ray's memory monitor killed the worker: another node may have room
    )


def _crashed(job: _Job, reports: Path, reason: str) -> Row:
    report = reports / f"{job.entry.name}.txt"
    report.write_text(f"{job.entry.name}: crashed: {reason}\n", encoding="utf-8")
    return Row(job.entry.name, "crashed", reason, 0.0, None, f"{reports.name}/{report.name}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".strip()
