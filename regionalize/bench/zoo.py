"""`regionalize verify --manifest zoo.toml`: every model of a zoo verified, each in its own process.

Torch-free: an entry runs as `python -m regionalize verify ...` in a fresh process group, so one that
crashes, hangs past its timeout or fails is a row with its reason and the others go on. Entries run one
after another: timings taken side by side would measure each other.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from regionalize.bench.manifest import Entry

# Exit status of a whole zoo: the worst of its rows.
EXIT = {"pass": 0, "unchanged": 0, "fail": 1, "error": 2, "timeout": 2, "crashed": 2}
_CHILD_STEP = re.compile(r"verify \[\s*([\d.]+)s\] (.*)")
_TAIL_LINES = 40
_OWN_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class Row:
    """What became of one entry: `status` is a key of EXIT, `reason` says why when it is not a pass."""

    name: str
    status: str
    reason: str
    seconds: float
    result: dict[str, Any] | None
    report: str  # the entry's verify report and log, relative to the output folder
    # With --ray: where it ran (zoo_ray.Placement's fields); with --resume: what the row was run for.
    placement: dict[str, Any] | None = None
    key: str | None = None

    def to_json(self) -> dict[str, Any]:
        row = {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 1),
            "report": self.report,
        }
        row |= {"key": self.key} if self.key else {}
        row |= {"placement": self.placement} if self.placement else {}
        return row | {"result": self.result}


def run_zoo(entries: list[Entry], cwd: Path, reports: Path, progress: Callable[[str], None]) -> list[Row]:
    """Verify each entry in a fresh process, in order; reports[/NAME.txt] gets each one's report and log."""
    reports = reports.resolve()  # the entries run in the manifest's folder
    reports.mkdir(parents=True, exist_ok=True)
    rows = []
    for number, entry in enumerate(entries, 1):
        label = f"[{number}/{len(entries)} {entry.name}]"
        progress(f"{label} started (timeout {entry.timeout} s)")
        row = run_entry(entry, cwd, reports, lambda step, label=label: progress(f"{label} {step}"))
        progress(f"{label} {row.status}{': ' + row.reason if row.reason else ''} ({row.seconds:.0f} s)")
        rows.append(row)
    return rows


def run_entry(
    entry: Entry,
    cwd: Path,
    reports: Path,
    progress: Callable[[str], None],
    preexec_fn: Callable[[], None] | None = None,
) -> Row:
    """Verify one entry in a fresh process group; `preexec_fn` runs in the child before verify does."""
    json_path = reports / f"{entry.name}.json"
    json_path.unlink(missing_ok=True)
    report = reports / f"{entry.name}.txt"
    command = [sys.executable, "-m", "regionalize", "verify", *entry.verify_args(json_path)]
    start = time.perf_counter()
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    with open(report, "w", encoding="utf-8") as sink:
        sink.write("$ regionalize verify " + " ".join(command[4:]) + "\n\n")
        sink.flush()
        # A session of its own: a timeout kills verify's timing processes too.
        child = subprocess.Popen(
            command,
            cwd=cwd,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        assert child.stderr is not None
        pump = threading.Thread(target=_pump, args=(child.stderr, tail, progress), daemon=True)
        pump.start()
        try:
            code = child.wait(timeout=entry.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
        pump.join()
        seconds = time.perf_counter() - start
        if tail:
            sink.write("\n--- stderr (last lines) ---\n" + "".join(tail))
    result = _read_json(json_path)
    json_path.unlink(missing_ok=True)  # its content travels in the zoo's own JSON
    status, reason = _judge(code, result, tail, entry.timeout)
    return Row(entry.name, status, reason, seconds, result, f"{reports.name}/{report.name}")


def _child_env() -> dict[str, str]:
    """This process's environment, with this copy of regionalize first on the path: the child runs it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_OWN_ROOT, env.get("PYTHONPATH")]))
    return env


def _pump(stream: TextIO, tail: deque[str], progress: Callable[[str], None]) -> None:
    for line in stream:
        tail.append(line)
        step = _CHILD_STEP.match(line)
        if step:
            progress(f"{float(step[1]):7.1f}s {step[2]}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _judge(
    code: int | None, result: dict[str, Any] | None, tail: deque[str], timeout: int
) -> tuple[str, str]:
    if code is None:
        return "timeout", f"killed after {timeout} s"
    if result is None or result.get("exit_code") != code:
        last = next((line.strip() for line in reversed(tail) if line.strip()), "no output")
        return "crashed", f"exit status {code}: {last}"
    if result.get("error"):
        error = result["error"]
        if error.get("unchanged"):
            return "unchanged", error["message"]
        return "error", f"{error['stage']}: {error['message'].splitlines()[0] if error['message'] else ''}"
    problems = []
    if not result.get("equivalent"):
        largest = result.get("max_abs_diff")
        where = f" (max {largest:.3g} at {result.get('max_abs_diff_at')})" if largest is not None else ""
        problems.append(f"outputs differ{where}")
    if not result.get("state_dict_compatible"):
        problems.append("the original checkpoint does not load strictly")
    if problems:
        return "fail", "; ".join(problems)
    return "pass", ""
