"""Run the codemod over the source of real model libraries from PyPI: crashes, parses, idempotence, coverage.

    python scripts/real_world.py [--libs transformers timm ...] [--jobs 2] [--json OUT] [--examples N]

Wheels are downloaded (never installed, never committed) into .downloads/ at pinned versions. For every
.py file: the codemod must not raise, every output must parse, and a second pass over the output must
change nothing. Reported per library: files, files with sites, sites, rewritten, share rewritten, skips
and warnings by code, files that do not parse (reported, not crashes), time.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import time
import zipfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from regionalize.codemod import transform_source
from regionalize.runner import read_source, unified_diff

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / ".downloads"
LIBRARIES = {
    "transformers": "transformers==5.23.0",
    "timm": "timm==1.0.31",
    "diffusers": "diffusers==0.42.1",
    "open_clip": "open_clip_torch==3.3.0",
    "torchvision": "torchvision==0.29.1",
}


def fetch(requirement: str) -> Path:
    name, version = requirement.split("==")
    tree = DOWNLOADS / f"{name}-{version}"
    if not tree.exists():
        wheels = DOWNLOADS / "wheels"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), requirement]
        subprocess.run(command, check=True)
        prefix = name.replace("-", "_").lower()
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{prefix}-{version}"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tree, [n for n in archive.namelist() if n.endswith(".py")])
    return tree


def check(path: str) -> dict[str, object]:
    """One file: what the codemod found, and whether its output holds up."""
    try:
        text = read_source(path).text
    except (OSError, ValueError) as exc:
        return {"path": path, "unreadable": str(exc)}
    try:
        first = transform_source(text)
    except Exception as exc:  # exactly what this script exists to catch
        return {"path": path, "crash": f"{type(exc).__name__}: {exc}"}
    result: dict[str, object] = {"path": path, "sites": [(s.code, s.action) for s in first.sites]}
    if first.status == "failure":
        result["unparsable"] = first.reason
        return result
    if first.changed:
        try:
            ast.parse(first.code)
        except SyntaxError as exc:
            result["bad_output"] = str(exc)
        second = transform_source(first.code)
        if second.code != first.code:
            result["not_idempotent"] = unified_diff(path, first.code, second.code)
        result["diff"] = unified_diff(path, text, first.code)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--libs", nargs="+", default=list(LIBRARIES), choices=list(LIBRARIES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--examples", type=int, default=0, help="print this many diffs per library")
    args = parser.parse_args()

    rows, problems = [], []
    print(
        "| library | files | with sites | sites | rewritten | share | skipped by code | warnings | "
        "unparsable | crashes | time |"
    )
    print("|---" * 11 + "|")
    for label in args.libs:
        files = sorted(str(p) for p in fetch(LIBRARIES[label]).rglob("*.py"))
        started = time.perf_counter()
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(check, files, chunksize=8))
        seconds = time.perf_counter() - started
        sites = [site for r in results for site in r.get("sites", [])]  # type: ignore[attr-defined]
        rewritten = sum(action == "rewrite" for _, action in sites)
        real = [s for s in sites if s[1] != "warn"]
        skipped = Counter(code for code, action in sites if action == "skip")
        warnings = Counter(code for code, action in sites if action == "warn")
        bad = [r for r in results if {"crash", "bad_output", "not_idempotent"} & r.keys()]
        problems += bad
        row = {
            "library": LIBRARIES[label],
            "files": len(files),
            "with_sites": sum(bool(r.get("sites")) for r in results),
            "sites": len(real),
            "rewritten": rewritten,
            "share": rewritten / len(real) if real else 0.0,
            "skipped": dict(sorted(skipped.items())),
            "warnings": dict(warnings),
            "unparsable": sum("unparsable" in r for r in results),
            "crashes": len(bad),
            "seconds": seconds,
        }
        rows.append(row)
        print(
            f"| {row['library']} | {row['files']} | {row['with_sites']} | {row['sites']} | {rewritten} | "
            f"{row['share']:.0%} | {', '.join(f'{c} {n}' for c, n in row['skipped'].items())} | "
            f"{', '.join(f'{c} {n}' for c, n in warnings.items())} | {row['unparsable']} | {len(bad)} | "
            f"{seconds:.1f} s |"
        )
        for r in [r for r in results if r.get("diff")][: args.examples]:
            print(r["diff"])
    for problem in problems:
        print(
            f"PROBLEM {problem['path']}: "
            + "; ".join(
                f"{k}: {problem[k]}" for k in ("crash", "bad_output", "not_idempotent") if k in problem
            )
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
