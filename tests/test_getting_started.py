"""docs/getting-started.md is executed: its files are written, its commands run in order, and what each
prints must be what the page shows (REGIONALIZE_UPDATE_FIXTURES=1 writes what they print into the page,
for review with `git diff`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import docs_examples
import tomllib

from regionalize import __version__

ROOT = docs_examples.ROOT
PAGE = ROOT / "docs" / "getting-started.md"
UPDATE = os.environ.get("REGIONALIZE_UPDATE_FIXTURES") == "1"


def installs_the_command() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"]["regionalize"] == "regionalize.cli:main"
    assert not any(d.startswith("torch") for d in pyproject["project"]["dependencies"])


def installs_the_verifier_and_the_tests() -> None:
    """The extras exist, and CI installs the same line before it runs the suite."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert {"verify", "test"} <= set(extras)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'pip install (--quiet )?"torch==2\.13\.0" -e "\.\[verify,test\]"', ci)


# Commands a test cannot run here (they install into the environment) are checked another way.
CHECKED = {
    "pip install .": installs_the_command,
    'pip install "torch==2.13.0" -e ".[verify,test]"': installs_the_verifier_and_the_tests,
}


def test_every_shell_command_is_checked() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert sorted(docs_examples.shell_commands(text)) == sorted(CHECKED)
    for check in CHECKED.values():
        check()


def test_every_console_command_prints_what_the_page_shows(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert docs_examples.write_files(text, tmp_path) == ["mypkg/model.py"]
    commands = docs_examples.commands(text)
    assert len(commands) >= 4, "the page runs the dry run, --check, --apply and a second run"
    outputs = [(command, docs_examples.run(command.line, tmp_path)) for command in commands]
    if UPDATE:
        PAGE.write_text(docs_examples.updated(text, outputs), encoding="utf-8")
        return
    for command, printed in outputs:
        assert docs_examples.matches(command.shown, printed), (
            f"getting-started.md: `{command.line}` printed\n" + "\n".join(printed)
        )


def test_the_matcher_can_fail() -> None:
    assert docs_examples.matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert docs_examples.matches(["a", "...", "b"], ["a", "b"])
    assert not docs_examples.matches(["a", "...", "d"], ["a", "b", "c", "e"])
    assert not docs_examples.matches(["1 file scanned"], ["2 files scanned"])
    assert not docs_examples.matches([], ["anything"])


def test_commands_run_this_checkout(tmp_path: Path) -> None:
    """`regionalize` in a page's command is this checkout's, whatever else is installed."""
    printed = docs_examples.run("regionalize --version", tmp_path)
    assert printed[0].startswith(f"regionalize {__version__} (runtime ")


def test_the_json_report_has_the_keys_the_page_shows(tmp_path: Path) -> None:
    """The page shows the JSON report's shape as a ```text block (its values left out): its keys, in order,
    are the report's."""
    text = PAGE.read_text(encoding="utf-8")
    shape = next(b[2] for b in docs_examples.FENCE.finditer(text) if b[2].startswith('{"version"'))
    shown = re.findall(r'"(\w+)"', shape)
    docs_examples.write_files(text, tmp_path)
    report = json.loads("\n".join(docs_examples.run("regionalize mypkg/ --format json", tmp_path)))
    file = next(f for f in report["files"] if f["sites"])
    inside = [k for key in file for k in ([key, *file["sites"][0]] if key == "sites" else [key])]
    assert shown == [*report][:2] + inside + ["summary", *report["summary"]]
    assert [*report] == ["version", "files", "summary"]
