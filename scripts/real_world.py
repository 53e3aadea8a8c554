"""Run the codemod over the source of real model libraries from PyPI: crashes, parses, idempotence, coverage.

    python scripts/real_world.py [--libs transformers timm ...] [--jobs N] [--json OUT] [--examples N]
                                 [--style inplace|wrap] [--guard-bypass none|filter|depyf]

Distributions are downloaded with `pip download --no-deps` at pinned versions (wheel, or the sdist where
there is no pure-Python wheel) into .downloads/ (git-ignored, never committed) and only their .py files
are extracted; nothing is installed. For every .py file: the codemod must not raise (a crash), its output
must parse, and a second pass over the output must change nothing and rewrite nothing (idempotence).
Files the codemod cannot parse (Python 2, templates) are counted apart: they are not crashes.
Reported per library: files, files with sites, sites, rewritten, share rewritten (of all sites), coverage
(of the sites not judged a leaf, holder or container of parts, see MISSES), skips and warnings by
code, unparsable files, problems, time. Exits 1 if any file crashed or broke a check.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from regionalize.bench.machine import machine
from regionalize.codemod import transform_source
from regionalize.runner.run import unified_diff
from regionalize.shared.options import GUARD_BYPASS, STYLES, Options
from regionalize.shared.source_files import read_source

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / ".downloads"
# label -> pinned requirement; torchvision's wheel is platform-specific but its .py files are not.
LIBRARIES = {
    "transformers": "transformers==5.23.0",
    "timm": "timm==1.0.31",
    "diffusers": "diffusers==0.42.1",
    "torchvision": "torchvision==0.29.1",
    "open_clip": "open_clip_torch==3.3.0",
    "ultralytics": "ultralytics==8.4.190",
    "x-transformers": "x-transformers==2.31.10",
    "vit-pytorch": "vit-pytorch==1.26.11",
    "fairseq": "fairseq==0.12.2",
    "mmdet": "mmdet==3.3.0",
    "mmpretrain": "mmpretrain==1.2.0",
    "mmsegmentation": "mmsegmentation==1.2.2",
}
PROBLEMS = ("crash", "bad_output", "not_idempotent")
# Per-block integer fixes in forward (RGZ003 call moved out of the graph, RGZ004 forward made symbolic):
# counted apart, since "sites" and "share" are about the containers.
FIXES = ("RGZ003", "RGZ004")
# Skips where a block may be there and was not compiled: the element could not be judged (RGZ103), or the
# site cannot take the edit (RGZ104, RGZ106, RGZ107). The other skips are judgements that the site is not
# the level to compile (a leaf, a holder, a container of parts, too few repeats, already compiled, the
# user's choice): "coverage" counts only these misses against a library, "share" counts every skip.
MISSES = ("RGZ103", "RGZ104", "RGZ106", "RGZ107")
Result = dict[str, Any]


def fetch(requirement: str) -> Path:
    """Download one distribution (never install it) and extract its .py files; cached in .downloads/."""
    name, version = requirement.split("==")
    tree = DOWNLOADS / f"{name}-{version}"
    if tree.exists():
        return tree
    dists = DOWNLOADS / "dists" / tree.name  # one directory per requirement: its only file is the archive
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dists), requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"pip download {requirement} failed:\n{done.stderr}")
    (archive,) = dists.iterdir()
    partial_tree = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial_tree, ignore_errors=True)  # left by an interrupted run
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(partial_tree, [n for n in zipped.namelist() if n.endswith(".py")])
    else:
        with tarfile.open(archive) as tarred:
            members = [m for m in tarred.getmembers() if m.isfile() and m.name.endswith(".py")]
            tarred.extractall(partial_tree, members, filter="data")
    partial_tree.rename(tree)  # only a complete extraction is ever cached
    return tree


def codemod_version() -> str:
    """The commit the codemod is at, with "+dirty" when regionalize/ has uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "regionalize"], check=False).returncode
    return (head.strip() or "unknown") + ("+dirty" if dirty else "")


def check(path: str, options: Options) -> Result:
    """One file: what the codemod found, and whether its output holds up."""
    shown = os.path.relpath(path, DOWNLOADS)
    try:
        text = read_source(path).text
    except (OSError, ValueError) as exc:
        return {"path": shown, "unparsable": f"unreadable: {exc}", "sites": []}
    started = time.perf_counter()
    try:
        first = transform_source(text, options, path)
    except Exception:  # exactly what this script exists to catch
        return {"path": shown, "crash": traceback.format_exc(limit=-3), "sites": []}
    lines = text.splitlines()
    result: Result = {
        "path": shown,
        "seconds": time.perf_counter() - started,
        "sites": [{**asdict(s), "source": lines[s.line - 1].strip()} for s in first.sites],
    }
    if first.status == "failure":
        key = "bad_output" if first.reason.startswith("rewrite") else "unparsable"
        result[key] = first.reason
    if not first.changed:
        return result
    result["diff"] = unified_diff(shown, text, first.code)
    try:
        ast.parse(first.code)
    except SyntaxError as exc:
        result["bad_output"] = f"line {exc.lineno}: {exc.msg}"
        return result
    try:
        second = transform_source(first.code, options, path)
    except Exception:
        result["crash"] = "second pass: " + traceback.format_exc(limit=-3)
        return result
    again = [f"{s.line}: {s.code}" for s in second.sites if s.action == "rewrite"]
    if second.code != first.code or again:
        result["not_idempotent"] = unified_diff(shown, first.code, second.code) or f"rewrites again: {again}"
    return result


def summarize(requirement: str, results: list[Result], seconds: float) -> Result:
    sites = [s for r in results for s in r["sites"]]
    real = [s for s in sites if s["action"] != "warn" and s["code"] not in FIXES]
    rewritten = sum(s["action"] == "rewrite" for s in real)
    missed = sum(s["code"] in MISSES for s in real)
    return {
        "library": requirement,
        "files": len(results),
        "with_sites": sum(any(s in real for s in r["sites"]) for r in results),
        "changed": sum("diff" in r for r in results),
        "sites": len(real),
        "rewritten": rewritten,
        "share": rewritten / len(real) if real else 0.0,
        "coverage": rewritten / (rewritten + missed) if rewritten + missed else 0.0,
        "skipped": dict(sorted(Counter(s["code"] for s in real if s["action"] == "skip").items())),
        "warnings": dict(sorted(Counter(s["code"] for s in sites if s["action"] == "warn").items())),
        "per_block_fixes": dict(sorted(Counter(s["code"] for s in sites if s["code"] in FIXES).items())),
        "unparsable": sum("unparsable" in r for r in results),
        **{key: sum(key in r for r in results) for key in PROBLEMS},
        "seconds": round(seconds, 2),
        "slowest_file": max(results, key=lambda r: r.get("seconds", 0.0), default={}).get("path"),
    }


def table_row(row: Result) -> str:
    def counts(counter: dict[str, int]) -> str:
        return ", ".join(f"{code} {n}" for code, n in counter.items()) or "-"

    return (
        f"| {row['library']} | {row['files']} | {row['with_sites']} | {row['sites']} | {row['rewritten']} "
        f"| {row['share']:.0%} | {row['coverage']:.0%} | {counts(row['skipped'])} "
        f"| {counts(row['warnings'])} | {counts(row['per_block_fixes'])} | {row['unparsable']} "
        f"| {row['crash']} | {row['bad_output'] + row['not_idempotent']} | {row['seconds']:.1f} s |"
    )


def markdown(version: str, options: Options, header: list[str], rows: list[Result], problems: list) -> str:
    changed = {k: v for k, v in asdict(options).items() if v != getattr(Options(), k)}
    lines = [
        "# The codemod over real model libraries: the latest run",
        "",
        f"Written by `python scripts/real_world.py --md docs/results/real-world-run.md` on "
        f"{datetime.date.today().isoformat()}: regionalize at `{version}`, options "
        f"{changed or 'default'}, {machine()}; times are wall seconds with `--jobs` processes. What the "
        "columns mean and "
        "what the skips are: [real-libraries.md](../real-libraries.md).",
        "",
        *header,
        *(table_row(row) for row in rows),
        "",
        f"Files with a problem (a crash, an output that does not parse, a second pass that changes it): "
        f"{len(problems)}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--libs", nargs="+", default=list(LIBRARIES), choices=list(LIBRARIES))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="write the table, every site and every problem here")
    parser.add_argument("--examples", type=int, default=0, help="print this many diffs per library")
    parser.add_argument("--style", choices=STYLES, default="inplace")
    parser.add_argument("--guard-bypass", choices=GUARD_BYPASS, default="none")
    parser.add_argument(
        "--md", type=Path, help="also write the table, with the date, machine and versions, to this file"
    )
    args = parser.parse_args()
    options = Options(style=args.style, guard_bypass=args.guard_bypass)

    version = codemod_version()
    print(f"regionalize at {version}, options: {options}\n")
    rows: list[Result] = []
    details: list[Result] = []
    header = [
        "| library | files | with sites | sites | rewritten | share | coverage | skipped by code | warnings "
        "| per-block integer fixes | unparsable | crashes | bad output / not idempotent | time |",
        "|---" * 14 + "|",
    ]
    print("\n".join(header))
    for label in args.libs:
        root = fetch(LIBRARIES[label])
        files = sorted(str(p) for p in root.rglob("*.py"))
        started = time.perf_counter()
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(partial(check, options=options), files, chunksize=8))
        rows.append(summarize(LIBRARIES[label], results, time.perf_counter() - started))
        print(table_row(rows[-1]), flush=True)
        for r in results:
            r["library"] = label
        details += [r for r in results if r["sites"] or r.keys() & {"unparsable", *PROBLEMS}]
        for r in [r for r in results if "diff" in r][: args.examples]:
            print(r["diff"])
    problems = [r for r in details if r.keys() & set(PROBLEMS)]
    for r in problems:
        print(f"PROBLEM {r['path']}: " + "; ".join(f"{k}: {r[k]}" for k in PROBLEMS if k in r))
    if args.md:
        args.md.write_text(markdown(version, options, header, rows, problems))
    if args.json:
        report = {"codemod": version, "options": asdict(options), "libraries": rows, "files": details}
        args.json.write_text(json.dumps(report, indent=1, default=sorted) + "\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
