"""`verify --manifest --resume`: the rows an earlier run left in the output folder, where still good.

A row is kept when the earlier run verified the same manifest entry (everything that changes the result:
model, factory, settings; not its timeout or where it ran) with the same regionalize and runtime, has a
result (a timeout or a crash is run again), and was measured with the torch found here, when there is one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from regionalize import __version__
from regionalize.bench.manifest import Entry
from regionalize.bench.zoo import Row
from regionalize.codemod.runtime_copy import VERSION

# Settings that do not change what verify finds: a row measured under another of these still stands.
_NOT_KEYED = ("timeout", "ray")


def entry_key(entry: Entry) -> str:
    """A digest of what a row's result depends on: the entry as verified and regionalize's versions."""
    settings = {k: v for k, v in entry.settings.items() if k not in _NOT_KEYED}
    keyed = [entry.name, entry.factory, entry.model, entry.rewritten, settings, __version__, VERSION]
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def earlier_rows(results: Path, entries: list[Entry], torch: str | None) -> dict[str, Row]:
    """The rows of `results` (an earlier STEM.json) that --resume keeps, by entry name."""
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    keys = {entry.name: entry_key(entry) for entry in entries}
    kept = {}
    for raw in data.get("models", []) if isinstance(data, dict) else []:
        if _still_good(raw, keys, torch):
            kept[raw["name"]] = _row(raw)
    return kept


def _still_good(raw: Any, keys: dict[str, str], torch: str | None) -> bool:
    if not isinstance(raw, dict) or keys.get(raw.get("name")) != raw.get("key"):
        return False
    result = raw.get("result")
    if not isinstance(result, dict):
        return False
    return torch is None or result.get("torch_version") in (None, torch)


def _row(raw: dict[str, Any]) -> Row:
    return Row(
        raw["name"],
        raw["status"],
        raw.get("reason", ""),
        float(raw.get("seconds", 0.0)),
        raw["result"],
        raw.get("report", ""),
        placement=(raw.get("placement") or {}) | {"resumed": True},
        key=raw["key"],
    )
