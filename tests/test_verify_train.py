"""`regionalize verify --workload train`: training steps compared with the original's, and timed."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from regionalize.bench import memory
from regionalize.bench.memory import peak_memory
from regionalize.bench.session import Built
from regionalize.bench.workloads import TrainSpec, spec_fields, spec_from_fields
from regionalize.cli.verify_command import verify as verify_command
from regionalize.shared.options import Options
from regionalize.verify import run_verify, verifier

MODELS = Path(__file__).parent / "models"
EAGER = Options(vendor=True, backend="eager")
STACK, REWRITTEN = MODELS / "stack.py", MODELS / "stack_inplace.py"


def verify(tmp_path: Path, rewritten: Path, **kwargs: Any) -> tuple[int, dict[str, Any], str]:
    """run_verify of stack.py's `make` with `--workload train`; (exit code, JSON result, printed table)."""
    out, table = tmp_path / "result.json", tmp_path / "table.txt"
    settings = {"options": EAGER, "repeats": 1, "cold_start": False, "workload": "train", **kwargs}
    with table.open("w") as stream:
        code = run_verify(str(STACK), "make", str(rewritten), json_out=str(out), out=stream, **settings)
    return code, json.loads(out.read_text()), table.read_text()


def test_every_steps_loss_and_the_first_steps_gradients_are_compared(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, REWRITTEN, steps=3)
    assert code == 0 and result["equivalent"] is True and result["losses_equal"] is True
    assert result["workload"] == {"kind": "train", "steps": 3, "lr": 1e-4}
    assert result["forward"]["compared"] == 1 + 18  # the losses, and each parameter's gradient
    assert result["gradients"]["note"] == "compared in the workload's results"
    # Each variant's step is timed, and its peak memory measured.
    assert all(result["train_ms_per_step"][name] > 0 for name in ("eager", "full", "regional"))
    assert all(result["peak_step_bytes"][name] > 0 for name in ("eager", "full", "regional"))
    assert re.search(r"training losses +PASS +3 steps, equal", table)
    assert "Training step" in table and "Peak memory a step" in table


def test_a_rewrite_that_trains_otherwise_fails_though_inference_passes(tmp_path: Path) -> None:
    # A block that computes otherwise in training mode only: inference's checks cannot see it.
    broken = tmp_path / "stack_train_broken.py"
    source = REWRITTEN.read_text()
    forward = "        return self.relu2(self.linear2(self.relu1(self.linear1(x))))"
    assert forward in source
    broken.write_text(
        source.replace(forward, forward.replace("return ", "return (1.01 if self.training else 1) * "))
    )
    inference_code, _, _ = verify(tmp_path, broken, workload=None)
    assert inference_code == 0
    code, result, table = verify(tmp_path, broken, steps=2)
    assert code == 1 and result["equivalent"] is False and result["losses_equal"] is False
    failing = {failure["path"] for failure in result["forward"]["failures"]}
    # Gradients named as the original names its parameters, whichever variant computed them.
    assert "output.loss" in failing and "output.grad.layers.0.linear2.bias" in failing
    assert re.search(r"training losses +FAIL", table) and "FAIL: outputs or gradients differ" in table


def test_the_first_step_is_timed_in_fresh_processes(tmp_path: Path) -> None:
    code, result, table = verify(
        tmp_path,
        REWRITTEN,
        steps=2,
        cold_start=True,
        starts=("warm", "hot"),
        skip=("full_dedup", "per_block"),
    )
    assert code == 0
    for key in ("compile_s", "compile_hot_s"):
        assert all(result[key][name] > 0 for name in ("full", "regional")), result[key]
    assert "First training step" in table


def test_a_model_given_labels_trains_on_its_own_loss(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("regionalize.codemod", exc_type=ImportError)  # the rewrite is made in memory
    from transformers.models.llama import modeling_llama

    out = tmp_path / "r.json"
    args = [modeling_llama.__file__, "--factory", f"{MODELS / 'hf_llama.py'}:make_labelled"]
    args += ["--workload", "train", "--steps", "2", "--no-cold-start", "--backend", "eager"]
    run = CliRunner().invoke(verify_command, [*args, "--skip", "dedup", "--json", str(out)])
    result = json.loads(out.read_text())
    assert run.exit_code == 0, run.output
    assert result["equivalent"] is True and result["losses_equal"] is True
    assert result["fell_back_to_eager"] is False
    assert result["max_abs_diff"] < 1e-4


def test_an_unknown_workload_or_no_steps_is_a_workload_error(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, REWRITTEN, steps=0)
    assert code == 2 and result["error"]["stage"] == "workload"


def test_a_worker_rebuilds_the_spec_it_is_given() -> None:
    spec = TrainSpec(3, 1e-3)
    assert spec_from_fields(json.loads(json.dumps(spec_fields(spec)))) == spec


def test_a_cpus_peak_memory_is_the_most_its_tensors_held_at_once() -> None:
    peaks: dict[str, int] = {}
    mib = 2**20
    with peak_memory("cpu", peaks, "large"):
        large = torch.ones(25 * mib // 4)  # 25 MiB in one tensor
        del large
    with peak_memory("cpu", peaks, "small"):
        small = [torch.ones(16 * 1024 // 4) for _ in range(1600)]  # 25 MiB of 16 KiB tensors
        del small
    with peak_memory("cpu", peaks, "small"):  # a second block keeps the larger peak
        pass
    with peak_memory("cpu", peaks, "unwanted", wanted=False):
        torch.ones(mib)
    assert peaks == {"large": 25 * mib, "small": 25 * mib}


def test_a_cpus_peak_memory_is_the_same_each_time_whatever_the_heap_kept() -> None:
    mib = 2**20
    measured = []
    for _ in range(4):
        # A tensor of 30 MiB between blocks leaves glibc's heap holes that the blocks' tensors could reuse;
        # the resident peak of the block below grew from 15 MiB to 92 MiB over four rounds.
        torch.ones(30 * mib // 4)
        peaks: dict[str, int] = {}
        pins = []
        with peak_memory("cpu", peaks, "growing"):
            for size in range(8, 16):
                tensor = torch.ones(size * mib // 4)
                pins.append(torch.ones(1024))
                del tensor
        measured.append(peaks["growing"])
    assert measured == [15 * mib + 8 * 4096] * 4


def test_a_torch_whose_profiler_keeps_no_allocation_events_records_no_peak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @contextlib.contextmanager
    def without_kineto(**_: Any) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(profiler=None)  # what a torch built without Kineto leaves to read

    monkeypatch.setattr(memory, "profile", without_kineto)
    peaks: dict[str, int] = {}
    with peak_memory("cpu", peaks, "unknown"):
        torch.ones(1024)
    assert peaks == {}


def test_measuring_a_cpus_peak_memory_writes_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    allocated_before = torch.ones(1024)
    with peak_memory("cpu", {}, "quiet"):
        del allocated_before  # the profiler warns of a free it never saw allocated
    assert capfd.readouterr().err == ""


def test_a_model_with_nothing_to_train_is_one_workload_error(tmp_path: Path) -> None:
    frozen = tmp_path / "frozen.py"
    frozen.write_text(
        STACK.read_text() + "\n\ndef make_frozen():\n    model, args = make()\n"
        "    return model.requires_grad_(False), args\n"
    )
    out = tmp_path / "r.json"
    with (tmp_path / "table.txt").open("w") as stream:
        code = run_verify(
            str(frozen), "make_frozen", None, json_out=str(out), out=stream, options=EAGER, cold_start=False,
            workload="train",
        )  # fmt: skip
    error = json.loads(out.read_text())["error"]
    assert code == 2 and error["stage"] == "workload" and "no trainable parameters" in error["message"]


class OneSpike:
    """A training workload whose first run allocates more than its later runs, as a one-time cost does."""

    grad = True

    def __init__(self) -> None:
        self.runs = 0

    def run(self, model: torch.nn.Module) -> None:
        self.runs += 1
        torch.ones((40 if self.runs == 1 else 10) * 2**20 // 4)


class Failing:
    grad = True

    def run(self, model: torch.nn.Module) -> None:
        raise RuntimeError("the step failed")


def test_verify_keeps_the_least_peak_of_its_runs_and_skips_a_variant_that_fails() -> None:
    ready = {
        name: Built(torch.nn.Linear(1, 1), (), {}, workload)  # type: ignore[arg-type]  # a workload's shape
        for name, workload in (("spiky", OneSpike()), ("failing", Failing()))
    }
    skipped: dict[str, str] = {}
    peaks = verifier._peaks(SimpleNamespace(device="cpu"), ready, skipped)  # type: ignore[arg-type]
    assert peaks["spiky"] == 10 * 2**20
    assert "failing" not in peaks and "failing" not in ready and "the step failed" in skipped["failing"]
