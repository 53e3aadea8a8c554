"""`regionalize -`: source on standard input, as editors and pipes hand it over (Black's and Ruff's `-`),
run as a user runs it, in a process of its own, so that the bytes on standard output are the real ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent.parent / "fixtures"
MODEL = b"""\
import torch.nn as nn\r
\r
\r
class Model(nn.Module):\r
    def __init__(self, d, n):\r
        super().__init__()\r
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])  # kept\r
"""
BOM = b"\xef\xbb\xbf"


def regionalize(*args: str, stdin: bytes, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "regionalize", *args], input=stdin, capture_output=True, cwd=cwd, timeout=120
    )


def test_apply_prints_what_apply_writes_to_the_file(tmp_path: Path) -> None:
    """The same bytes as --apply on a file of that text (a BOM and CRLF kept); the site lines and the
    summary go to stderr, as standard output carries the code."""
    (tmp_path / "model.py").write_bytes(BOM + MODEL)
    done = regionalize("--apply", "-", stdin=BOM + MODEL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert regionalize("--apply", "model.py", stdin=b"", cwd=tmp_path).returncode == 0
    assert done.stdout == (tmp_path / "model.py").read_bytes() != BOM + MODEL
    assert (
        done.stdout.startswith(BOM)
        and b"\r\n" in done.stdout
        and b"\n" not in done.stdout.replace(b"\r\n", b"")
    )
    assert b"-:7:23: RGZ001 compile comprehension of Layer regionally" in done.stderr


def test_dry_run_and_check_print_no_code(tmp_path: Path) -> None:
    dry = regionalize("-", stdin=MODEL, cwd=tmp_path)
    assert dry.returncode == 1
    assert dry.stdout.startswith(b"--- a/-\n+++ b/-\n")
    assert b"-:7:23: RGZ001" in dry.stdout
    check = regionalize("--check", "-", stdin=MODEL, cwd=tmp_path)
    assert (check.returncode, check.stdout.count(b"\n")) == (1, 1)
    clean = regionalize("--check", "-", stdin=b"import torch\n", cwd=tmp_path)
    assert (clean.returncode, clean.stdout) == (0, b"")


def test_input_that_cannot_be_rewritten_comes_back_unchanged(tmp_path: Path) -> None:
    """A pipe back into the file (`regionalize --apply - < f | sponge f`) loses nothing."""
    for bad, why in (
        (b"class (:\n  nn.ModuleList(\n", b"cannot parse"),
        (b"x = '\xff'\n", b"not valid utf-8"),
    ):
        done = regionalize("--apply", "-", stdin=bad, cwd=tmp_path)
        assert done.returncode == 2
        assert done.stdout == bad
        assert done.stderr.startswith(b"error: -: " + why)
    huge = b"x = 1\n" * (2 * 1024 * 1024)  # 12 MiB, past the 10 MiB limit: refused, and all of it back
    done = regionalize("--apply", "-", stdin=huge, cwd=tmp_path)
    assert (done.returncode, done.stdout == huge) == (2, True)
    assert done.stderr.startswith(b"error: -: file is larger than 10 MiB")
    same = regionalize("--apply", "-", stdin=b"import torch\n", cwd=tmp_path)
    assert (same.returncode, same.stdout) == (0, b"import torch\n")


def test_stdin_filename_places_the_text_in_its_package(tmp_path: Path) -> None:
    """Named as the file, judged with its package's declarations and factories, its settings read from
    the pyproject.toml above it: the site lines of a run on the file itself."""
    package = tmp_path / "declared_package"
    shutil.copytree(FIXTURES / "declared_package", package)
    (tmp_path / "pyproject.toml").write_text('[tool.regionalize]\nnever = ["make_attention"]\n')
    model = package / "transformer.in.py"
    on_file = regionalize("--check", str(model), stdin=b"", cwd=tmp_path)
    piped = regionalize(
        "--check", "--stdin-filename", str(model), "-", stdin=model.read_bytes(), cwd=tmp_path
    )
    assert piped.returncode == on_file.returncode
    assert piped.stdout == on_file.stdout
    assert b"RGZ111" in piped.stdout and b"RGZ112" in piped.stdout and b"RGZ105" in piped.stdout
    (tmp_path / "pyproject.toml").unlink()
    applied = regionalize(
        "--apply", "--stdin-filename", str(model), "-", stdin=model.read_bytes(), cwd=tmp_path
    )
    assert applied.returncode == 0, applied.stderr
    assert b"\nimport regionalize\n" in applied.stdout
    assert not (package / "_regionalize").exists()
    vendored = regionalize(
        "--apply", "--vendor", "--stdin-filename", str(model), "-", stdin=model.read_bytes(), cwd=tmp_path
    )
    assert vendored.returncode == 0, vendored.stderr
    # The code imports the package's runtime copy, written as --apply on the file writes it.
    assert b"from . import _regionalize as regionalize\n" in vendored.stdout
    assert (package / "_regionalize" / "__init__.py").read_text().startswith("# regionalize runtime")


def test_stdin_misuse_is_a_usage_error(tmp_path: Path) -> None:
    for args in (
        ["-", "other.py"],
        ["--stdin-filename", "a.py", "a.py"],
        ["--apply", "--format", "json", "-"],
    ):
        done = regionalize(*args, stdin=MODEL, cwd=tmp_path)
        assert done.returncode == 2, args
        assert done.stdout == b""


def test_force_exclude_prints_an_excluded_file_back_unchanged(tmp_path: Path) -> None:
    """As Ruff's --force-exclude with --stdin-filename: an editor's buffer of an excluded file is left as
    it is."""
    (tmp_path / "pyproject.toml").write_text('[tool.regionalize]\nexclude = ["legacy/*"]\n')
    args = ("--apply", "--stdin-filename", "legacy/model.py", "-")
    assert regionalize(*args, stdin=MODEL, cwd=tmp_path).stdout != MODEL
    done = regionalize("--force-exclude", *args, stdin=MODEL, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, MODEL)
