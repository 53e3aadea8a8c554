"""What a zoo run on Ray adds to its report: each row's node and device, the versions each node ran, and
whether timings were taken side by side on one machine (which makes them measure each other)."""

from __future__ import annotations

import collections
from typing import Any

from regionalize.bench.zoo import Row
from regionalize.bench.zoo_board import node_name


def placed(rows: list[Row]) -> bool:
    """Whether any row ran on Ray (and so the table has a node column)."""
    return any(row.placement and "node" in row.placement for row in rows)


def cell(row: Row) -> str:
    """The row's node column: host/node id, device, torch (and CUDA) there; `-` where it never ran."""
    where = row.placement or {}
    if "node" not in where:
        return "-"
    cuda = f", CUDA {where['cuda']}" if where.get("cuda") else ""
    retried = f", attempt {where['attempts']}" if where.get("attempts", 1) > 1 else ""
    earlier = ", earlier run" if where.get("resumed") else ""
    return f"{node_name(where)}, {where['device']}, torch {where.get('torch') or '-'}{cuda}{retried}{earlier}"


def summary(rows: list[Row]) -> dict[str, Any]:
    """Nodes used, the torch/CUDA versions by node (`mixed` where they differ), and the most entries that
    ran at once on one host."""
    placements = [row.placement for row in rows if row.placement and "node" in row.placement]
    versions: dict[str, set[str]] = collections.defaultdict(set)
    for where in placements:
        versions[f"torch {where.get('torch') or '-'}, CUDA {where.get('cuda') or '-'}"].add(node_name(where))
    return {
        "nodes": len({where["node"] for where in placements}),
        "versions": {version: sorted(nodes) for version, nodes in versions.items()},
        "mixed_versions": len(versions) > 1,
        "most_at_once": _most_at_once(placements),
    }


def _most_at_once(placements: list[dict[str, Any]]) -> dict[str, int]:
    """Per host, the most entries whose runs overlapped in time: above 1, their timings shared it."""
    most: dict[str, int] = {}
    for host in {where["host"] for where in placements}:
        spans = [
            (where["started"], where["finished"])
            for where in placements
            if where["host"] == host and "finished" in where and not where.get("resumed")
        ]
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        most[host] = peak
    return most


def lines(meta: dict[str, Any]) -> list[str]:
    """The report's paragraph on the cluster, from `summary`'s dict."""
    if not meta:
        return []
    text = [f"Ran on Ray: {meta['nodes']} node{'s' * (meta['nodes'] != 1)}."]
    if meta["mixed_versions"]:
        by = "; ".join(f"{version} on {', '.join(nodes)}" for version, nodes in meta["versions"].items())
        text.append(f"**Mixed versions across nodes**: {by}. Rows measured on different versions differ.")
    shared = {host: n for host, n in meta["most_at_once"].items() if n > 1}
    for host, n in sorted(shared.items()):
        text.append(
            f"**Timings were taken {n} at a time on one machine** ({host}): those entries shared its "
            "CPUs and memory bandwidth, so their times measure each other as well as the model."
        )
    return ["", " ".join(text)]
