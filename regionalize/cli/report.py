"""What a run found, rendered: site lines, the summary, JSON or SARIF (the sites and reports themselves are
`regionalize.shared.sites`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import cast

from regionalize import __version__
from regionalize.shared import rules
from regionalize.shared.sites import CODES, FileReport, Site, shown

# What a rewrite site did, when it is not compiling a container.
_REWRITES = {
    "RGZ003": "move {} out of the compiled region",
    "RGZ004": "make {} symbolic while traced",
    "RGZ005": "move {} to the import form",
}


def site_line(path: str, site: Site) -> str:
    """One line per site, in the `path:line:col: CODE message` shape that editors and CI parse."""
    what = f"{site.pattern} of {site.block}" if site.block else site.pattern
    rewrite = _REWRITES.get(site.code, "compile {} regionally").format(what)
    text = {"rewrite": rewrite, "skip": f"skip {what}", "warn": f"warning for {what}"}[site.action]
    if site.reason:
        text += f": {site.reason}"
    return f"{shown(path)}:{site.line}:{site.col}: {site.code} {text}"


def summarize(reports: list[FileReport]) -> dict[str, object]:
    skipped = Counter(s.code for r in reports for s in r.sites if s.action == "skip")
    warnings = Counter(s.code for r in reports for s in r.sites if s.action == "warn")
    return {
        "files_scanned": len(reports),
        "files_changed": sum(r.changed for r in reports),
        "sites_rewritten": sum(r.rewrites for r in reports),
        "skipped": dict(sorted(skipped.items())),
        "warnings": dict(sorted(warnings.items())),
        "errors": sum(r.error is not None for r in reports),
    }


def summary_line(summary: dict[str, object], written: bool = True) -> str:
    """The run in one line: files, sites, skips and warnings by code, errors. A dry run (`written` false)
    says what would change, in Black's words, since nothing was written."""
    skipped, warnings = cast(dict[str, int], summary["skipped"]), cast(dict[str, int], summary["warnings"])
    files, changed, sites, errors = (
        cast(int, summary[key]) for key in ("files_scanned", "files_changed", "sites_rewritten", "errors")
    )
    parts = [
        f"{_count(files, 'file')} scanned",
        f"{changed} changed" if written else f"{changed} would change",
        f"{_count(sites, 'site')} " + ("rewritten" if written else "to rewrite"),
        f"{sum(skipped.values())} skipped" + (f" ({_counts(skipped)})" if skipped else ""),
        _count(sum(warnings.values()), "warning") + (f" ({_counts(warnings)})" if warnings else ""),
        _count(errors, "error"),
    ]
    return ", ".join(parts)


# A dry run that found rewrites wrote nothing: the summary names what comes next, so that a first run
# does not leave the reader guessing whether the files changed.
NEXT_STEP = "nothing written: --apply writes the rewrites, then regionalize verify checks a model"


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _count(n: int, word: str) -> str:
    return f"{n} {_plural(n, word)}"


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{code} x{n}" for code, n in counter.items())


def to_json(reports: list[FileReport]) -> str:
    files = [
        {"path": r.path, "changed": r.changed, "sites": [_site_json(s) for s in r.sites], "error": r.error}
        for r in reports
    ]
    return json.dumps({"version": __version__, "files": files, "summary": summarize(reports)}, indent=2)


def _site_json(site: Site) -> dict[str, object]:
    # `doc`: the code's page, so that a tool reading the report can lead its user to what to do.
    return {**asdict(site), "doc": rules.path(site.code)}


def to_sarif(reports: list[FileReport]) -> str:
    """SARIF 2.1.0, so code-scanning tools show each site inline."""
    # Each rule carries its whole page as `help`, which code-scanning tools show beside the result.
    descriptors = [_rule(code, text) for code, text in CODES.items()]
    levels = {"rewrite": "warning", "skip": "note", "warn": "warning"}
    results = []
    for report in reports:
        location = {"physicalLocation": {"artifactLocation": {"uri": report.path}}}
        if report.error:
            results.append(
                {
                    "ruleId": "RGZ900",
                    "level": "error",
                    "message": {"text": report.error},
                    "locations": [location],
                }
            )
        for site in report.sites:
            region = {"startLine": site.line, "startColumn": site.col}
            results.append(
                {
                    "ruleId": site.code,
                    "level": levels[site.action],
                    "message": {"text": site_line(report.path, site).split(": ", 1)[1]},
                    "locations": [{"physicalLocation": {**location["physicalLocation"], "region": region}}],
                }
            )
    run = {
        "tool": {
            "driver": {
                "name": "regionalize",
                "version": __version__,
                "rules": descriptors,
                "informationUri": "https://pypi.org/project/regionalize/",
            }
        },
        "results": results,
    }
    sarif = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": [run]}
    return json.dumps(sarif, indent=2)


def _rule(code: str, text: str) -> dict[str, object]:
    page = rules.page(code)
    rule: dict[str, object] = {
        "id": code,
        "shortDescription": {"text": text},
        "help": {"text": page, "markdown": page},
    }
    if (uri := rules.help_uri(code)) is not None:
        rule["helpUri"] = uri
    return rule
