"""Progress of a zoo on Ray (`--ray`): each entry's start, node and steps, and how many are done, running
and queued, with each running one's elapsed time and node. A local run keeps its own progress lines."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from regionalize.bench.zoo import Row

_EVERY_S = 30.0  # a summary at least this often, so that a long entry is not taken for a hang


class Board:
    """The entries' states, printed through `progress` as they change."""

    def __init__(self, names: list[str], progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.numbers = {name: number for number, name in enumerate(names, 1)}
        self.state = dict.fromkeys(names, "queued")
        self.started: dict[str, float] = {}
        self.where: dict[str, str] = {}
        self.nodes: dict[str, str] = {}  # each running entry's Ray node id
        self.said = time.monotonic()

    def label(self, name: str) -> str:
        return f"[{self.numbers[name]}/{len(self.numbers)} {name}]"

    def events(self, items: Iterable[tuple[str, str, Any]]) -> None:
        """What workers sent: (name, "started", placement) or (name, "step", the child's step line)."""
        for name, kind, value in items:
            if kind == "started":
                self.state[name] = "running"
                self.started[name] = time.monotonic()
                self.where[name] = node_name(value)
                self.nodes[name] = value["node"]
                self.progress(f"{self.label(name)} started on {self.where[name]} ({value['device']})")
                self.summary()
            elif kind == "step" and self.state.get(name) == "running":
                self.progress(f"{self.label(name)} {value}")

    def requeued(self, name: str) -> None:
        self.state[name] = "queued"

    def finished(self, name: str, row: Row) -> None:
        self.state[name] = "done"
        reason = f": {row.reason}" if row.reason else ""
        where = f" on {self.where[name]}" if name in self.where else ""
        self.progress(f"{self.label(name)} {row.status}{reason} ({row.seconds:.0f} s){where}")
        self.summary()

    def tick(self) -> None:
        if time.monotonic() - self.said >= _EVERY_S:
            self.summary()

    def summary(self) -> None:
        now = time.monotonic()
        running = [
            f"{name} on {self.where.get(name, '?')} {now - self.started[name]:.0f} s"
            for name, state in self.state.items()
            if state == "running"
        ]
        done = sum(state == "done" for state in self.state.values())
        queued = sum(state == "queued" for state in self.state.values())
        inside = f" ({', '.join(running)})" if running else ""
        self.progress(f"{done} done, {len(running)} running{inside}, {queued} queued")
        self.said = now


def node_name(placement: dict[str, Any]) -> str:
    """A node as the report names it: its host and the first 8 hex digits of its Ray node id, which tell
    apart two nodes on one host (a local test cluster, or one Ray node per GPU of a machine)."""
    return f"{placement['host']}/{placement['node'][:8]}"
