"""The hooks in .pre-commit-hooks.yaml, run for real by pre-commit against a throwaway repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = "import torch.nn as nn\n\nlayers = nn.ModuleList([Block(8) for _ in range(4)])\n"

pytestmark = pytest.mark.skipif(shutil.which("pre-commit") is None, reason="pre-commit is not installed")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pre-commit-home")


def try_repo(repo: Path, hook: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    return subprocess.run(
        ["pre-commit", "try-repo", str(ROOT), hook, "--files", "model.py", "--color", "never"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "model.py").write_text(MODEL, encoding="utf-8")
    git(tmp_path, "add", "model.py")
    return tmp_path


def test_report_hook_fails_the_commit_with_diff_and_sites(repo: Path, pre_commit_home: Path) -> None:
    done = try_repo(repo, "regionalize", pre_commit_home)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "model.py:3:10: RGZ001 compile comprehension of Block regionally" in done.stdout
    assert "+for block in layers:" in done.stdout
    assert (repo / "model.py").read_text(encoding="utf-8") == MODEL


def test_apply_hook_rewrites(repo: Path, pre_commit_home: Path) -> None:
    done = try_repo(repo, "regionalize-apply", pre_commit_home)
    assert done.returncode == 1  # pre-commit fails a hook that modified files, so the user reviews them
    assert "files were modified by this hook" in done.stdout
    assert "block.compile()" in (repo / "model.py").read_text(encoding="utf-8")


def test_hooks_leave_out_what_the_configuration_excludes(repo: Path, pre_commit_home: Path) -> None:
    """pre-commit names every file; the hooks' --force-exclude makes `exclude` apply to them."""
    (repo / "pyproject.toml").write_text('[tool.regionalize]\nexclude = ["model.py"]\n', encoding="utf-8")
    for hook in ("regionalize", "regionalize-apply"):
        done = try_repo(repo, hook, pre_commit_home)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (repo / "model.py").read_text(encoding="utf-8") == MODEL


def test_hook_install_pulls_no_torch(tmp_path: Path) -> None:
    """What pre-commit installs for the hooks: this package and its dependencies, resolved by pip."""
    report = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"regionalize", "libcst", "click"} <= names
    assert not names & {"torch", "depyf", "nvidia-cuda-runtime-cu12"}
