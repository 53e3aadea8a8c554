"""The import form, what a rewrite writes by default: one `import regionalize` a file and a call or two a
site, nothing else in the user's tree; a package rewritten with a vendored copy moves to it (RGZ005) and
back with `--vendor`, losing nothing. Run as users run it: the command over a package on disk, then the
package imported and run in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_runtime_copy import MODEL
from torch_support import needs_reuse

from regionalize.cli import main
from regionalize.codemod import legacy_calls, transform_source

# The model built, run and compared with its twin from the original text, in a process where libcst
# and click cannot be imported: running a rewritten model needs torch and regionalize's runtime alone.
RUN = """
import json, sys
sys.modules["libcst"] = sys.modules["click"] = None
import torch
original = {{}}
exec(compile({model!r}, "original", "exec"), original)
import zoo.models.net as net
torch.manual_seed(0)
model = net.Net().eval()
twin = original["Net"]().eval()
twin.load_state_dict(model.state_dict())
x = torch.randn(3, 8)
with torch.no_grad():
    torch.testing.assert_close(model(x), twin(x))
    torch.testing.assert_close(model(x), twin(x))
state = model.__dict__["_regionalize_owner"]
loaded = sorted(m for m in ("libcst", "click") if sys.modules[m])
why = None if state.report.plan.form.name != "per block" else state.report.plan.reason
print(json.dumps({{"why": why, "loaded": loaded}}))
"""


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """zoo/ with zoo/models/net.py and zoo/other.py."""
    models = tmp_path / "zoo" / "models"
    models.mkdir(parents=True)
    (tmp_path / "zoo" / "__init__.py").write_text("")
    (models / "__init__.py").write_text("")
    (models / "net.py").write_text(MODEL)
    (tmp_path / "zoo" / "other.py").write_text(MODEL)
    return tmp_path / "zoo"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def files(package: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(package.rglob("*.py"))}


def added_lines(before: str, after: str) -> int:
    return len(after.splitlines()) - len(before.splitlines())


def test_apply_adds_one_import_and_a_call_a_site_and_no_file(package: Path) -> None:
    code, out = invoke(str(package), "--apply", "-q")
    assert code == 0, out
    assert not (package / "_regionalize.py").exists()
    for path in (package / "models" / "net.py", package / "other.py"):
        text = path.read_text()
        assert added_lines(MODEL, text) == 2  # the import, and a call that takes the container's blocks
        assert text.startswith("import regionalize\nimport torch.nn as nn\n")
        assert "        regionalize.compile_region(*self.layers, owner=self)\n" in text
        assert "_regionalize_" not in text
    before = files(package)
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert files(package) == before  # a second run changes nothing
    assert invoke(str(package), "--check")[0] == 0


def test_the_dry_run_diff_is_the_sites_alone(package: Path) -> None:
    code, out = invoke(str(package))
    assert code == 1
    assert out.count("\n+import regionalize\n") == 2 and "_regionalize.py" not in out
    assert len(out.splitlines()) < 60


@needs_reuse
def test_the_rewritten_package_runs_without_the_codemods_dependencies(package: Path) -> None:
    invoke(str(package), "--apply", "-q")
    found = _run(package)
    assert found == {"why": None, "loaded": []}


def _run(package: Path) -> dict:
    root = Path(__file__).resolve().parent.parent  # this checkout's regionalize, as pip -e installs it
    env_path = f"{package.parent}:{root}"
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(model=MODEL)],
        capture_output=True,
        text=True,
        # The session's torch cache (conftest.py), not the default one every process of the user shares.
        env={
            "PYTHONPATH": env_path,
            "PATH": "/usr/bin:/bin",
            "TORCHINDUCTOR_CACHE_DIR": os.environ["TORCHINDUCTOR_CACHE_DIR"],
        },
        cwd=package.parent,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_vendored_package_moves_to_the_import_form_and_keeps_its_copy(package: Path) -> None:
    assert invoke(str(package), "--apply", "--vendor", "-q")[0] == 0
    copy = files(package / "_regionalize")
    code, out = invoke(str(package), "--check")
    assert code == 1
    moved = [line for line in out.splitlines() if " RGZ005 " in line]
    assert len(moved) == 2 and all("zoo/_regionalize`" in line and "left as it is" in line for line in moved)
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert files(package / "_regionalize") == copy  # the user deletes it, not the run
    for path in (package / "models" / "net.py", package / "other.py"):
        text = path.read_text()
        assert "import regionalize\n" in text and "_regionalize" not in text.replace("regionalize.", "")
    before = files(package)
    assert invoke(str(package), "--check")[0] == 0
    assert files(package) == before
    # --vendor takes it back: the calls and the copy's import as that run wrote them.
    assert invoke(str(package), "--apply", "--vendor", "-q")[0] == 0
    assert "from .. import _regionalize as regionalize\n" in (package / "models" / "net.py").read_text()
    assert "import regionalize" not in (package / "models" / "net.py").read_text()
    assert invoke(str(package), "--check", "--vendor")[0] == 0


@needs_reuse
def test_a_moved_package_runs(package: Path) -> None:
    invoke(str(package), "--apply", "--vendor", "-q")
    invoke(str(package), "--apply", "-q")
    assert _run(package) == {"why": None, "loaded": []}


def test_vendor_is_a_pyproject_key(package: Path) -> None:
    (package.parent / "pyproject.toml").write_text("[tool.regionalize]\nvendor = true\n")
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert (package / "_regionalize" / "__init__.py").exists()
    assert invoke(str(package), "--check", "--no-vendor")[0] == 1  # the flag wins over the file


@pytest.mark.parametrize(
    "taken",
    [
        "    def forward(self, x, regionalize=None):",  # a parameter of any method
        "    def helper(self):\n        regionalize = 1\n        return regionalize\n\n"
        "    def forward(self, x):",
        "    def forward(self, x):\n        from json import dumps as regionalize",
    ],
)
def test_a_name_regionalize_of_the_users_anywhere_skips_the_file(taken: str) -> None:
    source = MODEL.replace("    def forward(self, x):", taken, 1)
    result = transform_source(source, path=None)
    assert result.code == source
    assert [s.code for s in result.sites] == ["RGZ113"]
    assert "`regionalize` is already bound" in result.sites[0].reason


def test_an_earlier_releases_calls_read_as_the_public_ones_on_their_lines() -> None:
    internal = (
        "@_regionalize_symbolic_ints\ndef f(x):\n"
        "    _regionalize_blocks(b, self, cache_index='layer_idx')  # why\n"
        "    m.compile(options={'guard_filter_fn': _regionalize_guard_filter})\n"
        "    _regionalize_dispatch(m, mode='max-autotune')\n"
        "    return _regionalize_eager(lambda: x) + other._regionalize_eager(x)\n"
    )
    public = (
        "@regionalize.symbolic_ints\ndef f(x):\n"
        "    regionalize.compile_region(b, owner=self, cache_index='layer_idx')  # why\n"
        "    m.compile(options={'guard_filter_fn': regionalize.guard_filter})\n"
        "    regionalize.compile_direct(m, mode='max-autotune')\n"
        "    return regionalize.eager(lambda: x) + other._regionalize_eager(x)\n"
    )
    assert legacy_calls.holds(internal) and not legacy_calls.holds(public.replace("other._", "other."))
    assert legacy_calls.to_public(internal) == public
    # Names bound stay, for the collision check to find: a definition, a target, a parameter, an import.
    bound = (
        "from ._regionalize import _regionalize_blocks\n\n\ndef _regionalize_eager(_regionalize_blocks):\n"
        "    _regionalize_dispatch = 1\n"
    )
    assert legacy_calls.to_public(bound) == bound


def test_an_earlier_releases_loop_over_blocks_becomes_one_call_once_rewritten() -> None:
    loop = "        for block in self.layers:\n            _regionalize_blocks(block, self, nested=False)\n"
    read = legacy_calls.to_public(f"class M:\n    def __init__(self):\n{loop}        self.x = 1\n")
    assert "            regionalize.compile_region(block, owner=self, nested=False)\n" in read
    call = "        regionalize.compile_region(*self.layers, owner=self, nested=False)\n"
    assert legacy_calls.collapse(read) == f"class M:\n    def __init__(self):\n{call}        self.x = 1\n"
    # An iterable other than a name, attribute, item or call is parenthesized.
    conditional = legacy_calls.to_public(
        textwrap.dedent(loop).replace("self.layers", "self.a if c else self.b")
    )
    assert "compile_region(*(self.a if c else self.b), owner=self" in legacy_calls.collapse(conditional)


@pytest.mark.parametrize(
    "loop",
    [
        "for block in self.layers:\n    # why\n    _regionalize_blocks(block, self)\n",  # a comment it holds
        "for block in self.layers:\n    _regionalize_blocks(block, self, x=block.x)\n",  # reads the block
        "for block in self.layers:\n    _regionalize_blocks(block, self)\nelse:\n    pass\n",
        "for block in self.layers:\n    _regionalize_blocks(block, self)\n    other(block)\n",
        "for i, block in enumerate(self.layers):\n    _regionalize_blocks(block, self)\n",
    ],
)
def test_a_loop_that_is_more_than_the_call_stays_a_loop(loop: str) -> None:
    public = legacy_calls.collapse(legacy_calls.to_public(loop))
    assert public.startswith("for ") and "regionalize.compile_region(block, owner=self" in public


def test_the_passes_write_one_call_for_a_containers_blocks_and_read_it_back() -> None:
    once = transform_source(MODEL).code
    assert "        regionalize.compile_region(*self.layers, owner=self)\n" in once
    again = transform_source(once)
    assert again.code == once and [s.code for s in again.sites] == ["RGZ002"]
    # Written over lines (as a formatter may), the call is still read as compiling the blocks.
    wrapped = once.replace(
        "regionalize.compile_region(*self.layers, owner=self)",
        "regionalize.compile_region(\n            *self.layers,\n            owner=self,\n        )",
    )
    assert [s.code for s in transform_source(wrapped).sites] == ["RGZ002"]
