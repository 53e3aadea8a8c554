"""Every fixtures/<case>.in.py must rewrite to <case>.out.py and report <case>.sites; a second pass on the
output must change nothing. A new pattern is a new pair of files, nothing else.

A case's first line may set options as a TOML inline table: `# regionalize-test: {style = "wrap"}`.
Set REGIONALIZE_UPDATE_FIXTURES=1 to rewrite the expected files, then review them with `git diff`.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest
import tomllib

from regionalize.cli.report import site_line
from regionalize.codemod import transform_source
from regionalize.shared import config
from regionalize.shared.options import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# A case in a package folder (`package_imports/model.in.py`) is judged with its package's modules read.
CASES = sorted(str(p.relative_to(FIXTURES)).removesuffix(".in.py") for p in FIXTURES.glob("**/*.in.py"))
UPDATE = os.environ.get("REGIONALIZE_UPDATE_FIXTURES") == "1"
HEADER = "# regionalize-test:"


def options_for(source: str) -> Options:
    first = source.splitlines()[0] if source else ""
    if not first.startswith(HEADER):
        return Options()
    table = tomllib.loads("t = " + first.removeprefix(HEADER).strip())["t"]
    return Options.from_settings(config.check(table, "fixture header"))


def check_or_update(path: Path, actual: str) -> None:
    if UPDATE:
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"{path.name} is missing: run with REGIONALIZE_UPDATE_FIXTURES=1 and review"
    assert actual == path.read_text(encoding="utf-8")


def test_there_are_cases() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_fixture(case: str) -> None:
    source = (FIXTURES / f"{case}.in.py").read_text(encoding="utf-8")
    options = options_for(source)
    path = str(FIXTURES / f"{case}.py")  # where the file would live: its module's name, its package
    result = transform_source(source, options, path)
    assert result.status in ("success", "skip"), result.reason
    cst.parse_module(result.code)
    check_or_update(FIXTURES / f"{case}.out.py", result.code)
    lines = "".join(site_line(f"{case}.in.py", s) + "\n" for s in result.sites)
    check_or_update(FIXTURES / f"{case}.sites", lines)

    second = transform_source(result.code, options, path)
    assert second.code == result.code, "a second run must change nothing"
    assert not any(s.action == "rewrite" for s in second.sites)
