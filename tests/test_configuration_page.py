"""docs/configuration.md agrees with the code: its reference table is generated from the options' own
definitions, its examples load, and its pre-commit snippets name hooks that exist, with their commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from regionalize.shared import config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_configuration
import render_docs

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(kind: str) -> list[str]:
    return [m[2] for m in FENCE.finditer(PAGE.read_text(encoding="utf-8")) if m[1] == kind]


def test_the_reference_is_generated_from_the_definitions() -> None:
    shown = render_docs.block(PAGE.read_text(encoding="utf-8"), "configuration")[1]
    assert shown == docs_configuration.reference(), "docs/configuration.md: run python scripts/render_docs.py"


def test_the_reference_lists_every_key_with_its_flag() -> None:
    table = docs_configuration.reference()
    for key in config.KEYS:
        flag = "--container" if key == "containers" else f"--{key}"
        assert re.search(rf"^\| `{key}` \| [^|]*`{flag}`", table, re.M), key
    # The page's words for the one key that is not spelled as its flag.
    assert "`containers` (the flag is\n`--container`" in PAGE.read_text(encoding="utf-8")


def test_the_reference_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key added to the code changes the table, which the page then no longer matches."""
    before = docs_configuration.reference()
    monkeypatch.setitem(config.KEYS, "quiet", config.boolean)
    assert docs_configuration.reference() != before


@pytest.mark.parametrize("text", blocks("toml"))
def test_toml_examples_load(text: str) -> None:
    import tomllib

    config.check(tomllib.loads(text)["tool"]["regionalize"], "docs/configuration.md")


def hooks() -> dict[str, dict[str, object]]:
    return {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


@pytest.mark.parametrize("text", blocks("yaml"))
def test_pre_commit_snippets_name_hooks_that_exist(text: str) -> None:
    """A remote snippet names hooks of .pre-commit-hooks.yaml and pins a full commit hash, not a tag the
    repository does not have; a local one runs the same command as the hook of its id."""
    for repo in yaml.safe_load(text)["repos"]:
        for hook in repo["hooks"]:
            assert hook["id"] in hooks()
            if repo["repo"] == "local":
                assert hook["entry"] == hooks()[hook["id"]]["entry"]
                assert hook["types"] == hooks()[hook["id"]]["types"]
        if repo["repo"] != "local":
            assert re.fullmatch(r"[0-9a-f]{40}", str(repo["rev"])), "pin a commit: the repository has no tags"
