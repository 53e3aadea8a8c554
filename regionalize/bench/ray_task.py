"""The Ray task of `verify --manifest --ray`: one entry verified on a worker, as a local run verifies it.

Runs on the worker: the entry is today's fresh `python -m regionalize verify` process group (`zoo.run_entry`,
with its timeout), in a scratch folder removed afterwards, so that nothing stays on the worker but torch's
caches. The report's text and where it ran travel back to the driver with the row. Imports no torch: the
versions are read from torch's own `version.py`, which works even where the entry crashed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from regionalize.bench import zoo
from regionalize.bench.machine import torch_versions
from regionalize.bench.manifest import Entry

_PR_SET_PDEATHSIG = 1  # prctl(2)


class Events(Protocol):
    """The driver's event mailbox (an actor handle of `EventBox`): what started where, and the steps."""

    put: Any  # an actor method: events.put.remote(item)


class EventBox:
    """A mailbox the driver empties; workers send to it without waiting for an answer: a Ray task blocked
    in `ray.get` lends its CPUs out, and another entry would start beside it on the same node."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        self.items.append(item)

    def take(self) -> list[Any]:
        items, self.items = self.items, []
        return items


@dataclass
class Outcome:
    """What a task hands back: the row (its placement filled in) and its report's text."""

    row: zoo.Row
    report_text: str


def verify_entry(entry: Entry, cwd: str | None, reports_name: str, events: Events) -> Outcome:
    """Run `entry` here; `cwd` is the manifest's folder where this node sees it, or None for the task's own
    folder (Ray's unpacked `working_dir` when the entry ships one)."""
    where = placement()
    events.put.remote((entry.name, "started", where))
    # Inductor compiles in as many processes as the machine has cores; the task has the CPUs it reserved
    # (Ray sets OMP_NUM_THREADS to them likewise), so that entries side by side do not oversubscribe.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, int(where["cpus"])))
    folder = Path(cwd) if cwd and Path(cwd).is_dir() else Path.cwd()
    with tempfile.TemporaryDirectory(prefix="regionalize-zoo-") as scratch:
        reports = Path(scratch) / reports_name
        reports.mkdir()
        steps = lambda step: events.put.remote((entry.name, "step", step))  # noqa: E731
        row = zoo.run_entry(entry, folder, reports, steps, _die_with_parent)
        report_text = (reports / f"{entry.name}.txt").read_text(encoding="utf-8", errors="replace")
    row.placement = where | {"finished": time.time()}
    return Outcome(row, report_text)


def placement() -> dict[str, Any]:
    """This worker: Ray node, host, GPUs Ray gave the task, CPUs it reserved, and torch's versions."""
    import ray

    context = ray.get_runtime_context()
    gpus = [str(gpu) for gpu in ray.get_gpu_ids()]
    cpus = context.get_assigned_resources().get("CPU", 0)
    return {
        "node": context.get_node_id(),
        "host": socket.gethostname(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "device": f"GPU {','.join(gpus)}" if gpus else f"CPU x{cpus:g}",
        "cpus": cpus,
        "started": time.time(),
    } | torch_versions()


def _die_with_parent() -> None:
    """In the child: SIGKILL when the worker that started it dies (Linux), so that a lost or cancelled
    worker leaves no verify process behind; elsewhere the child outlives it until its own end."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
