"""The command line as a user runs it: diffs, --apply, --check, reports, exit codes and bad input."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import regionalize
from regionalize.cli import main
from regionalize.shared import source_files

MODEL = """\
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])
"""
CLEAN = "import torch.nn as nn\n\nhead = nn.Linear(4, 4)\n"


def invoke(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    runner = CliRunner()
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = runner.invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(before)  # later tests' paths are relative to the folder pytest started in
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL, encoding="utf-8")
    return path


def test_default_shows_diff_and_changes_nothing(model: Path) -> None:
    code, out, err = invoke(str(model))
    assert code == 1
    assert f"--- a/{model}" in out and f"+++ b/{model}" in out
    assert "+        for block in self.layers:" in out
    assert f"{model}:7:23: RGZ001 compile comprehension of Layer regionally" in out
    assert "1 file scanned, 1 would change, 1 site to rewrite" in err and "nothing written: --apply" in err
    assert model.read_text(encoding="utf-8") == MODEL


def test_a_form_feed_is_no_line_end_in_the_diff_or_the_site_lines(tmp_path: Path) -> None:
    """Python ends lines at \\n and \\r only; `str.splitlines` also at a form feed (a page break)."""
    path = tmp_path / "model.py"
    path.write_text(MODEL.replace("\n\n\nclass", "\n\x0c\n\nclass"), encoding="utf-8")
    code, out, _ = invoke(str(path))
    assert code == 1
    assert f"{path}:7:23: RGZ001" in out
    assert "@@ -5,3 +5,5 @@" in out and "No newline" not in out
    code, out, _ = invoke("--apply", str(path))
    written = path.read_text(encoding="utf-8").split("\n")
    assert written[1] == "\x0c"
    assert [line.strip() for line in written[7:9]] == ["for block in self.layers:", "block.compile()"]


def test_apply_writes_then_nothing_is_pending(model: Path) -> None:
    code, out, err = invoke("--apply", str(model))
    assert code == 0
    assert "block.compile()" in model.read_text(encoding="utf-8")
    # Quiet as Black and Ruff: the site lines and the summary, no diff.
    assert "RGZ001" in out and "+++" not in out and "1 changed" in err
    code, out, _ = invoke("--check", str(model))
    assert code == 0
    assert "RGZ002" in out


def test_check_prints_site_lines_without_diff(model: Path) -> None:
    code, out, _ = invoke("--check", str(model))
    assert code == 1
    assert "RGZ001" in out and "+++" not in out


def test_clean_file_exits_zero(tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text(CLEAN, encoding="utf-8")
    assert invoke(str(path))[0] == 0


def test_apply_and_check_are_exclusive(model: Path) -> None:
    assert invoke("--apply", "--check", str(model))[0] == 2


def test_check_with_diff_prints_the_diffs_as_black_does(model: Path) -> None:
    before = model.read_text(encoding="utf-8")
    code, out, _ = invoke("--check", "--diff", str(model))
    assert code == 1
    assert "+++" in out and "RGZ001" in out
    assert model.read_text(encoding="utf-8") == before


def test_diff_on_request_with_apply_and_off_for_the_dry_run(model: Path, tmp_path: Path) -> None:
    code, out, _ = invoke("--no-diff", str(model))
    assert code == 1 and "+++" not in out and "RGZ001" in out
    code, out, _ = invoke("--apply", "--diff", str(model))
    assert code == 0 and f"+++ b/{model}" in out


def test_json_report(model: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    code, out, _ = invoke("--format", "json", str(model), str(missing))
    assert code == 2
    data = json.loads(out)
    by_path = {f["path"]: f for f in data["files"]}
    site = by_path[str(model)]["sites"][0]
    assert {k: site[k] for k in ("line", "col", "code", "pattern", "block", "action")} == {
        "line": 7,
        "col": 23,
        "code": "RGZ001",
        "pattern": "comprehension",
        "block": "Layer",
        "action": "rewrite",
    }
    assert by_path[str(missing)]["error"] == "No such file or directory"
    assert data["summary"]["sites_rewritten"] == 1 and data["summary"]["errors"] == 1


def test_sarif_report_file(model: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "report.sarif"
    code, out, _ = invoke("--format", "sarif", "--report", str(out_file), str(model))
    assert code == 1
    sarif = json.loads(out_file.read_text(encoding="utf-8"))
    assert sarif["version"] == "2.1.0"
    result = sarif["runs"][0]["results"][0]
    assert result["ruleId"] == "RGZ001"
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 7, "startColumn": 23}
    assert json.loads(out) == sarif


def test_a_report_file_that_cannot_be_written_is_an_error(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    target = tmp_path / "report.json"
    code, out, err = invoke("--report", str(target), "-j", "1", str(model))
    assert code == 2
    assert f"error: {target}: cannot write the report: No space left on device" in err
    assert "RGZ001" in out  # the run itself still reports its sites


@pytest.mark.parametrize(
    "command", [["--report"], ["verify", "--factory", "f", "--json"], ["tune", "--factory", "f", "--json"]]
)
def test_an_output_file_in_a_missing_folder_is_refused_before_the_run(
    command: list[str], model: Path, tmp_path: Path
) -> None:
    target = tmp_path / "missing" / "out.json"
    code, _, err = invoke(*command, str(target), str(model))
    assert code == 2
    assert f"the folder of '{target}' does not exist" in err


def test_bad_files_are_reported_and_the_rest_still_processed(tmp_path: Path, model: Path) -> None:
    (tmp_path / "broken.py").write_text("import torch.nn as nn\nnn.ModuleList([\n", encoding="utf-8")
    (tmp_path / "latin.py").write_bytes(b"# nn.ModuleList\nx = '\xe9'\n")
    (tmp_path / "huge.py").write_bytes(b"# nn.ModuleList\n" + b"x = 1\n" * (2 * 1024 * 1024))
    (tmp_path / "mac.py").write_bytes(MODEL.replace("\n", "\r").encode())
    os.symlink(tmp_path / "loop_b.py", tmp_path / "loop_a.py")
    os.symlink(tmp_path / "loop_a.py", tmp_path / "loop_b.py")
    names = ("broken.py", "latin.py", "huge.py", "mac.py", "loop_a.py", "nope.py")
    code, _, err = invoke("--apply", *(str(tmp_path / n) for n in names), str(model))
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 6, err
    assert any("mac.py: lone CR line endings" in line for line in errors)
    assert (tmp_path / "mac.py").read_bytes() == MODEL.replace("\n", "\r").encode()
    assert any("broken.py: cannot parse" in line for line in errors)
    assert any("latin.py: not valid utf-8" in line for line in errors)
    assert any("huge.py: file is larger than 10 MiB" in line for line in errors)
    assert any("loop_a.py: Too many levels of symbolic links" in line for line in errors)
    assert any("nope.py: No such file or directory" in line for line in errors)
    assert "block.compile()" in model.read_text(encoding="utf-8")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_named_and_skipped_walked(tmp_path: Path, model: Path) -> None:
    """Reading a FIFO waits for a writer: named, it is one error line; under a walked folder, not taken."""
    os.mkfifo(tmp_path / "pipe.py")
    code, _, err = invoke(str(tmp_path / "pipe.py"), str(model))
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {tmp_path / 'pipe.py'}: not a regular file"
    ]
    code, out, err = invoke("--check", str(tmp_path))
    assert code == 1 and "error:" not in err
    assert {line.split(":")[0] for line in out.splitlines()} == {str(model)}
    # In a package, the codemod reads its sibling modules (declarations, classes): never the FIFO.
    (tmp_path / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "declared.py").write_text("class M:\n    _repeated_blocks = ['Layer']\n", encoding="utf-8")
    code, out, err = invoke("--check", str(model))
    assert code == 1 and "error:" not in err


def test_a_file_name_that_is_not_utf8_goes_through(tmp_path: Path) -> None:
    name = os.fsdecode(b"\xffmodel.py")
    try:
        (tmp_path / name).write_text(MODEL, encoding="utf-8")
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system takes only valid names")
    code, out, err = invoke("--check", str(tmp_path))
    assert code == 1 and "error:" not in err
    assert out.count("RGZ001") == 1


def test_a_file_that_cannot_be_written_is_an_error_and_left_as_it_was(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    before = model.read_bytes()
    monkeypatch.setattr(source_files.os, "replace", refuse)
    code, _, err = invoke("--apply", "-j", "1", str(model))
    assert code == 2
    assert f"error: {model}: cannot write: Permission denied" in err
    assert "0 changed" in err and model.read_bytes() == before
    assert [p.name for p in model.parent.iterdir()] == [model.name]  # no temporary file left


def test_a_symlink_is_written_through_beside_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file goes beside the target: a rename is atomic only within one file system."""
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "model.py"
    target.write_text(MODEL, encoding="utf-8")
    (tmp_path / "links" / "model.py").symlink_to(target)
    made = []
    mkstemp = source_files.tempfile.mkstemp
    monkeypatch.setattr(
        source_files.tempfile, "mkstemp", lambda **kw: made.append(kw["dir"]) or mkstemp(**kw)
    )
    code, _, _ = invoke("--apply", "-j", "1", str(tmp_path / "links" / "model.py"))
    assert code == 0
    assert made == [str(tmp_path / "real")]
    assert (tmp_path / "links" / "model.py").is_symlink() and "block" in target.read_text(encoding="utf-8")


def test_a_file_named_twice_is_taken_once(model: Path) -> None:
    code, out, err = invoke("--check", str(model), str(model.parent / "." / model.name), str(model.parent))
    assert code == 1
    assert out.count("RGZ001") == 1 and "1 file scanned" in err


def test_directories_skip_hidden_venv_cache_and_gitignored(tmp_path: Path) -> None:
    for rel in ("pkg/a.py", ".hidden/b.py", "venv/lib/c.py", "pkg/__pycache__/d.py", "gen/e.py", "pkg/f.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(MODEL, encoding="utf-8")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("", encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("gen/\n", encoding="utf-8")
    code, out, _ = invoke("--check", "--exclude", "*/f.py", str(tmp_path))
    assert code == 1
    reported = {line.split(":")[0] for line in out.splitlines()}
    assert reported == {str(tmp_path / "pkg" / "a.py")}


def test_force_exclude_leaves_out_files_named_on_the_command_line(tmp_path: Path) -> None:
    """As pre-commit names them: without it a file named is always taken, whatever `exclude` says."""
    legacy = tmp_path / "legacy" / "model.py"
    legacy.parent.mkdir()
    legacy.write_text(MODEL, encoding="utf-8")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.regionalize]\nexclude = ["*/legacy/*"]\n', encoding="utf-8")
    assert invoke("--check", "legacy/model.py", cwd=tmp_path)[0] == 1
    code, out, err = invoke("--check", "--force-exclude", "legacy/model.py", cwd=tmp_path)
    assert (code, out) == (0, "") and "0 files scanned" in err
    pyproject.write_text(pyproject.read_text() + "force-exclude = true\n", encoding="utf-8")
    assert invoke("--check", "legacy/model.py", cwd=tmp_path)[:2] == (0, "")
    assert invoke("--check", "legacy/model.py", "--exclude", "*/other/*", cwd=tmp_path)[0] == 1


def test_an_ignored_directory_named_explicitly_is_walked(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("zoo/\n", encoding="utf-8")
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "m.py").write_text(MODEL, encoding="utf-8")
    code, out, _ = invoke("--check", str(tmp_path / "zoo"))
    assert code == 1 and "zoo/m.py:7:23: RGZ001" in out
    assert invoke("--check", str(tmp_path))[0] == 0  # walked from above, the ignored folder is left out


def test_jobs_keep_output_order(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"m{i}.py").write_text(MODEL, encoding="utf-8")
    _, serial, _ = invoke("--check", "-j", "1", str(tmp_path))
    _, parallel, _ = invoke("--check", "-j", "2", str(tmp_path))
    assert serial == parallel and serial.count("RGZ001") == 6


def test_pyproject_settings_and_flags_win(tmp_path: Path, model: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.regionalize]\nmode = "max-autotune-no-cudagraphs"\nstyle = "wrap"\n', encoding="utf-8"
    )
    _, out, _ = invoke(str(model))
    assert 'torch.compile(Layer(d), mode="max-autotune-no-cudagraphs")' in out
    _, out, _ = invoke("--style", "inplace", str(model))
    assert 'block.compile(mode="max-autotune-no-cudagraphs")' in out


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('colour = "red"', "unknown key tool.regionalize.colour"),
        ('style = "sideways"', "tool.regionalize.style must be one of inplace, wrap"),
        ('form = "whole"', "tool.regionalize.form must be one of hierarchical, per-block"),
        ("jobs = 0", "tool.regionalize.jobs must be a positive integer"),
        ('containers = "Stack"', "tool.regionalize.containers must be a list of strings"),
    ],
)
def test_bad_pyproject_is_a_clear_error(tmp_path: Path, model: Path, table: str, message: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f"[tool.regionalize]\n{table}\n", encoding="utf-8")
    code, _, err = invoke(str(model))
    assert code == 2
    assert str(pyproject) in err and message in err


@pytest.mark.parametrize(
    "text",
    [
        '[ tool.regionalize ]\nstyle = "wrap"\n',
        '[tool]\nregionalize.style = "wrap"\n',
        '[tool]\nregionalize = { style = "wrap" }\n',
    ],
)
def test_pyproject_table_in_any_toml_spelling(tmp_path: Path, model: Path, text: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
    _, out, _ = invoke(str(model))
    assert "torch.compile(Layer(d))" in out


def test_pyproject_that_is_not_toml_is_an_error_not_ignored(tmp_path: Path, model: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.regionalize\nstyle = "wrap"\n', encoding="utf-8")
    code, _, err = invoke(str(model))
    assert code == 2
    assert f"{pyproject}: not valid TOML: Expected ']'" in err
    pyproject.write_text("[project\nname = 'other'\n", encoding="utf-8")  # not ours: not read
    code, _, err = invoke(str(model))
    assert code == 1 and "error:" not in err


def test_help_explains() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    assert "Exit status: 0 nothing left to rewrite, 1 rewrites pending" in out
    assert "--guard-bypass" in out and "regionalize verify" in out


def test_help_and_usage_errors_name_the_command_as_typed() -> None:
    """`regionalize PATH...` runs the rewrite: its usage says so, not the subcommand's name."""
    code, out, _ = invoke("--help")
    assert out.startswith("Usage: regionalize [OPTIONS] PATH...\n") and "regionalize rewrite" not in out
    assert all(f"\n  {name} " in out for name in ("verify", "tune", "rule"))  # the Commands section
    code, _, err = invoke("--no-such-flag", "x.py")
    assert code == 2 and "Try 'regionalize --help' for help." in err and "rewrite" not in err


def test_version_names_the_package_and_the_runtime() -> None:
    """The runtime's version is read from the header of its module, never copied."""
    header = (
        (Path(__file__).parents[1] / "regionalize" / "runtime" / "__init__.py").read_text().split("\n")[0]
    )
    runtime = header.split(":")[0].removeprefix("# regionalize runtime ")
    code, out, _ = invoke("--version")
    assert code == 0 and runtime.isdigit()
    assert out == f"regionalize {regionalize.__version__} (runtime {runtime})\n"


def test_summary_counts_in_words_and_names_the_next_step(model: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text(MODEL, encoding="utf-8")
    _, _, err = invoke("--check", str(model))
    assert err.startswith(
        "1 file scanned, 1 would change, 1 site to rewrite, 0 skipped, 0 warnings, 0 errors"
    )
    assert err.rstrip().endswith(
        "nothing written: --apply writes the rewrites, then regionalize verify checks a model"
    )
    _, _, err = invoke(str(model), str(other), "--no-diff")
    assert err.startswith("2 files scanned, 2 would change, 2 sites to rewrite")
    _, _, err = invoke("--apply", str(model), str(other))
    assert err == "2 files scanned, 2 changed, 2 sites rewritten, 0 skipped, 0 warnings, 0 errors\n"
    _, _, err = invoke("--check", str(model))  # nothing left: nothing to name
    assert "nothing written" not in err and "0 would change" in err


def test_a_site_compiled_per_block_says_why(tmp_path: Path) -> None:
    lone = tmp_path / "lone.py"
    lone.write_text("import torch.nn as nn\n\nlayers = nn.ModuleList([Block(8) for _ in range(4)])\n")
    assert "regionally: per block: no owner known (" in invoke("--check", str(lone))[1]
    assert (
        "regionally: per block, as --form per-block asks"
        in invoke("--check", "--form", "per-block", str(lone))[1]
    )


def test_python_dash_m(model: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "regionalize", "--check", str(model)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "RGZ001" in done.stdout


@pytest.mark.parametrize(
    ("data", "expected_tail"),
    [
        (MODEL.replace("\n", "\r\n").encode(), b"block.compile()\r\n"),
        (b"\xef\xbb\xbf" + MODEL.encode(), b"block.compile()\n"),
        (b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + MODEL.encode(), b"block.compile()\n"),
    ],
    ids=["crlf", "bom", "latin-1"],
)
def test_apply_keeps_bytes_mode_and_encoding(tmp_path: Path, data: bytes, expected_tail: bytes) -> None:
    path = tmp_path / "model.py"
    path.write_bytes(data)
    path.chmod(0o751)
    assert invoke("--apply", str(path))[0] == 0
    written = path.read_bytes()
    assert written.startswith(data[:30])
    assert written.endswith(expected_tail)
    if b"\r\n" in data:
        assert b"\n" not in written.replace(b"\r\n", b"")
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".regionalize-")]


def test_depyf_bypass_needs_inplace(model: Path) -> None:
    code, _, err = invoke("--style", "wrap", "--guard-bypass", "depyf", str(model))
    assert code == 2
    assert "--guard-bypass depyf compiles blocks in place: it needs --style inplace" in err


OWNER = (
    MODEL
    + """
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""
)


@pytest.mark.parametrize(
    ("flags", "config", "written"),
    [
        ((), "", None),
        (("--saved-owners",), "", "saved=True"),
        (("--no-saved-owners",), "", "saved=False"),
        ((), "saved-owners = true\n", "saved=True"),
        (("--no-saved-owners",), "saved-owners = true\n", "saved=False"),  # the flag over the key
    ],
)
def test_saved_owners_is_written_into_each_owners_call(
    tmp_path: Path, flags: tuple[str, ...], config: str, written: str | None
) -> None:
    path = tmp_path / "model.py"
    path.write_text(OWNER, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(f"[tool.regionalize]\n{config}", encoding="utf-8")
    code, out, _ = invoke(*flags, "model.py", cwd=tmp_path)
    assert code == 1
    [call] = [line for line in out.splitlines() if "compile_region(" in line]
    assert call.endswith(f"owner=self, {written})" if written else "owner=self)"), call


def test_saved_owners_needs_the_hierarchical_form(model: Path) -> None:
    code, _, err = invoke("--saved-owners", "--form", "per-block", str(model))
    assert code == 2 and "--saved-owners saves the blocks' owner compiled whole" in err
