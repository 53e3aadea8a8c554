"""`regionalize verify --manifest`: the manifest's checks, and a small zoo run end to end, in which one
model passes, one fails, one cannot be built and one hangs past its timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from regionalize.bench import zoo_report
from regionalize.bench.manifest import ManifestError, load
from regionalize.bench.zoo import Row
from regionalize.cli.verify_command import verify
from regionalize.codemod.runtime_copy import VERSION

MODELS = Path(__file__).parent / "models"


def write(folder: Path, text: str) -> Path:
    path = folder / "zoo.toml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[model]]\nname = 'a'\n", "model 1 (a): factory is required"),
        ("[[model]]\nname = 'a'\nfactory = 'f'\nbatch = 2\n", "model 1 (a): unknown key 'batch'"),
        ("[[model]]\nname = 'a b'\nfactory = 'f'\n", "name may hold letters"),
        ("[[model]]\nname = 'a'\nfactory = 'f'\n[[model]]\nname = 'a'\nfactory = 'g'\n", "a second entry"),
        ("[defaults]\ntimeout = 0\n[[model]]\nname = 'a'\nfactory = 'f'\n", "[defaults]: timeout must be"),
        ("[[model]]\nname = 'a'\nfactory = 'f'\nregionalize = { style = 'x' }\n", "regionalize"),
        ("[[model]]\nname = 'a'\nfactory = 'f'\nregionalize = { jobs = 2 }\n", "sets jobs"),
        ("[defaults]\nquick = true\n", "no [[model]] entries"),
        ("[defaults]\nstarts = ['hot', 'lukewarm']\n", "starts must be a list of some of cold, warm"),
        ("[model]\nname = 'a'\n", "no [[model]] entries"),
        ("[zoo]\n", "unknown table 'zoo'"),
        ("[[model]\n", "cannot read"),
        ("[defaults]\nskip = ['full']\n", "skip must be a list of dedup, per-block, bypass"),
    ],
)
def test_a_bad_manifest_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load(write(tmp_path, text))
    assert message in str(caught.value) and str(tmp_path / "zoo.toml") in str(caught.value)


def test_entries_become_verify_arguments_relative_to_the_manifest(tmp_path: Path) -> None:
    manifest = write(
        tmp_path,
        """
        [defaults]
        quick = true
        device = "cpu"
        regionalize = { style = "wrap", fullgraph = false }

        [[model]]
        name = "llama"
        model = "transformers.models.llama.modeling_llama"
        factory = "factories.py:llama"
        workload = "generate"
        tokens = 4
        regionalize = { always = ["Block", "Layer"], containers = ["Stack"], dynamic = "auto" }

        [[model]]
        name = "local"
        model = "models/net.py"
        factory = "make"
        cold-start = false
        quick = false

        [[model]]
        name = "restarted"
        factory = "make"
        starts = ["warm", "hot"]
        skip = ["per-block", "dedup"]

        [[model]]
        name = "trained"
        factory = "make"
        workload = "train"
        steps = 2
        """,
    )
    llama, local, restarted, trained = load(manifest)
    assert llama.verify_args(Path("out.json")) == [
        "transformers.models.llama.modeling_llama",
        "--factory", f"{tmp_path.resolve()}/factories.py:llama",
        "--json", "out.json",
        "--quick",
        "--device", "cpu", "--workload", "generate", "--tokens", "4",
        # The entry's regionalize table goes over the defaults' one, key by key.
        "--style", "wrap", "--no-fullgraph", "--always", "Block", "--always", "Layer", "--container", "Stack",
    ]  # fmt: skip
    assert local.verify_args(Path("o.json")) == [
        str(tmp_path.resolve() / "models" / "net.py"),
        "--factory", "make", "--json", "o.json", "--no-cold-start",
        "--device", "cpu", "--style", "wrap", "--no-fullgraph",
    ]  # fmt: skip
    assert local.timeout == 1800 and local.with_settings({"timeout": 5}).timeout == 5
    assert restarted.verify_args(Path("r.json"))[4:] == [
        "--quick", "--starts", "warm,hot", "--device", "cpu", "--skip", "per-block", "--skip", "dedup",
        "--style", "wrap", "--no-fullgraph",
    ]  # fmt: skip
    assert trained.verify_args(Path("t.json"))[4:] == [
        "--quick", "--device", "cpu", "--workload", "train", "--steps", "2",
        "--style", "wrap", "--no-fullgraph",
    ]  # fmt: skip


HANG = """
import time


def make():
    time.sleep(600)
"""

# Nothing to rewrite: no repeated blocks.
PLAIN = """
import torch


def make():
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
"""


def test_a_zoo_runs_every_entry_isolated_and_writes_its_table(tmp_path: Path) -> None:
    folder = tmp_path / "zoo"
    folder.mkdir()
    (folder / "hang.py").write_text(HANG)
    (folder / "plain.py").write_text(PLAIN)
    write(
        folder,
        f"""
        [defaults]
        cold-start = false
        regionalize = {{ backend = "eager" }}

        [[model]]
        name = "stack"
        model = "{MODELS / "stack.py"}"
        factory = "make"

        [[model]]
        name = "broken"
        model = "{MODELS / "stack.py"}"
        factory = "make"
        rewritten = "{MODELS / "stack_broken.py"}"

        [[model]]
        name = "missing"
        model = "{MODELS / "stack.py"}"
        factory = "nowhere"

        [[model]]
        name = "hangs"
        model = "hang.py"
        factory = "make"
        timeout = 8

        [[model]]
        name = "plain"
        model = "plain.py"
        factory = "make"
        """,
    )
    out = tmp_path / "results"
    done = subprocess.run(  # relative paths, as a user types them: the entries run elsewhere
        [sys.executable, "-m", "regionalize", "verify", "--manifest", "zoo/zoo.toml", "--out", "results"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr  # the worst row: an entry that could not run
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["stack", "pass"]
    assert lines[1].split()[:4] == ["broken", "fail", "outputs", "differ"]
    assert lines[2].split()[:2] == ["missing", "error"] and "defines no function nowhere" in lines[2]
    assert lines[3].split() == ["hangs", "timeout", "killed", "after", "8", "s"]
    # Nothing to rewrite is no error of the zoo's: the model is one its migration leaves alone.
    assert lines[4].split()[:2] == ["plain", "unchanged"] and "leaves plain.py unchanged" in lines[4]
    # Progress names each entry as it goes, with the child's own steps.
    assert "zoo [" in done.stderr and "[1/5 stack] " in done.stderr
    assert "[2/5 broken]" in done.stderr and "comparing outputs" in done.stderr

    data = json.loads((out / "zoo.json").read_text())
    assert data["counts"] == {"pass": 1, "fail": 1, "error": 1, "timeout": 1, "unchanged": 1}
    stack = data["models"][0]
    assert stack["result"]["equivalent"] and stack["result"]["graphs"]["regional"] == 1
    assert data["models"][1]["result"]["equivalent"] is False
    assert data["models"][3]["result"] is None
    table = (out / "zoo.md").read_text()
    assert f"regionalize runtime {VERSION};" in table.splitlines()[2]  # which runtime measured it
    assert "| [stack](zoo-reports/stack.txt) | equivalent |" in table
    assert "| [broken](zoo-reports/broken.txt) | **FAIL** |" in table
    assert "- **hangs**: timeout: killed after 8 s" in table
    assert "PASS: equivalent" in (out / "zoo-reports" / "stack.txt").read_text()
    assert not (out / "zoo.png").exists() and "zoo.png" not in table  # no first call timed: no chart
    # The hanging factory's process was killed with its group, not left behind.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(folder / "hang.py") not in ps


def test_manifest_refuses_per_model_flags(tmp_path: Path) -> None:
    manifest = write(tmp_path, "[[model]]\nname = 'a'\nfactory = 'f'\n")
    result = CliRunner().invoke(verify, ["--manifest", str(manifest), "--style", "wrap"])
    assert result.exit_code == 2 and "style is set per model in the manifest" in result.output
    result = CliRunner().invoke(verify, [str(MODELS / "stack.py"), "--factory", "make", "--timeout", "3"])
    assert result.exit_code == 2 and "--timeout, --ray and --resume go with --manifest" in result.output


def test_a_bad_manifest_exits_2_with_one_error_line(tmp_path: Path) -> None:
    manifest = write(tmp_path, "[[model]]\nname = 'a'\n")
    done = subprocess.run(
        [sys.executable, "-m", "regionalize", "verify", "--manifest", str(manifest)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {manifest}: model 1 (a): factory is required"]


def test_the_chart_draws_first_call_speedups_only_where_they_were_timed(tmp_path: Path) -> None:
    timed = {"equivalent": True, "state_dict_compatible": True, "compile_speedup": 2.5, "device": "cpu"}
    rows = [Row("a", "pass", "", 1.0, timed, "r/a.txt"), Row("b", "error", "x", 1.0, None, "r/b.txt")]
    written = zoo_report.write(rows, tmp_path / "zoo.toml", tmp_path, "zoo")
    assert (tmp_path / "zoo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and tmp_path / "zoo.png" in written
    assert "![compile speedup per model](zoo.png)" in (tmp_path / "zoo.md").read_text()

    untimed = [Row("a", "pass", "", 1.0, {**timed, "compile_speedup": None}, "r/a.txt")]
    (tmp_path / "zoo.png").unlink()
    written = zoo_report.write(untimed, tmp_path / "zoo.toml", tmp_path, "zoo")
    assert not (tmp_path / "zoo.png").exists() and "zoo.png" not in (tmp_path / "zoo.md").read_text()


def test_the_table_sets_cold_and_hot_first_calls_beside_the_warm_ones_where_measured(tmp_path: Path) -> None:
    """A restarted service finds the caches on disk: where the zoo timed such (hot) processes, each row
    gives full's and the rewrite's hot first call side by side, with the ratio."""
    timed = {"equivalent": True, "state_dict_compatible": True, "compile_speedup": 2.0, "device": "cpu"}
    timed |= {"compile_s": {"full": 8.0, "regional": 4.0}, "compile_hot_s": {"full": 3.0, "regional": 2.0}}
    rows = [Row("a", "pass", "", 1.0, timed, "r/a.txt"), Row("b", "error", "x", 1.0, None, "r/b.txt")]
    zoo_report.write(rows, tmp_path / "zoo.toml", tmp_path, "zoo")
    table = [line for line in (tmp_path / "zoo.md").read_text().splitlines() if line.startswith("|")]
    assert "| hot first call full / hierarchical |" in table[0] and "cold first call" not in table[0]
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "| 3.0 s / 2.0 s (1.50x) |" in table[2]

    unmeasured = [Row("a", "pass", "", 1.0, {**timed, "compile_hot_s": {"full": None}}, "r/a.txt")]
    zoo_report.write(unmeasured, tmp_path / "zoo.toml", tmp_path, "zoo")
    assert "hot first call" not in (tmp_path / "zoo.md").read_text()
