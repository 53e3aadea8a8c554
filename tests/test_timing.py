"""Steady-state timing makes its calls at several depths of Python's stack, so that no one position of the
caller's stack (where CPython's data-stack chunks thrash, python/cpython issue 142183) decides a median."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from regionalize.bench.session import Built
from regionalize.bench.timing import STACK_DEPTHS, at_depth, decode_timing, steady_us
from regionalize.bench.workloads import Generate


def _depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class _Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.depths: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.depths.append(_depth())
        return x + 1


class _RecordedGenerate(Generate):
    """A generation that records where on the stack each run was made, and how many tokens it asked for."""

    def __init__(self) -> None:
        super().__init__(input_ids=torch.zeros(1, 2, dtype=torch.long), tokens=4)
        self.runs: list[tuple[int, int]] = []

    def run(self, model: torch.nn.Module, tokens: int | None = None) -> Any:
        self.runs.append((_depth(), tokens or self.tokens))
        return {}


def _relative(depths: list[int]) -> list[int]:
    return [d - depths[0] for d in depths]


def test_at_depth_calls_that_many_frames_deeper() -> None:
    assert _relative([at_depth(n, _depth) for n in (0, 1, 17, 119)]) == [0, 1, 17, 119]


def test_steady_calls_cycle_through_the_stack_depths() -> None:
    model = _Recorder()
    built = Built(model, (torch.zeros(2),), {})
    steady_us(built, "cpu", warmup=0, budget_s=0.0, min_calls=2 * len(STACK_DEPTHS))
    assert _relative(model.depths) == [d - STACK_DEPTHS[0] for d in STACK_DEPTHS * 2]


def test_decode_rounds_cycle_through_the_stack_depths_one_pair_a_depth() -> None:
    workload = _RecordedGenerate()
    built = Built(torch.nn.Identity(), (), {}, workload=workload)
    decode_timing(built, "cpu", warmup=0, budget_s=0.0, min_rounds=len(STACK_DEPTHS) + 1)
    depths = [depth for depth, _ in workload.runs]
    assert [tokens for _, tokens in workload.runs] == [1, 4] * (len(STACK_DEPTHS) + 1)
    assert depths[0::2] == depths[1::2]  # the round's two generations at one depth: their difference is fair
    assert _relative(depths[0::2]) == [*STACK_DEPTHS, STACK_DEPTHS[0]]


def test_rounds_of_one_call_sharing_their_depths_go_on_through_the_cycle() -> None:
    """verify's rounds are short (a call each for slow models): each takes the next depth, not the first."""
    model = _Recorder()
    built = Built(model, (torch.zeros(2),), {})
    depths = itertools.cycle(STACK_DEPTHS)
    for _ in range(len(STACK_DEPTHS) + 1):
        steady_us(built, "cpu", warmup=0, budget_s=0.0, min_calls=1, depths=depths)
    assert _relative(model.depths) == [*STACK_DEPTHS, STACK_DEPTHS[0]]
    workload = _RecordedGenerate()
    built = Built(torch.nn.Identity(), (), {}, workload=workload)
    for _ in range(3):
        decode_timing(built, "cpu", warmup=0, budget_s=0.0, min_rounds=1, depths=depths)
    assert _relative([depth for depth, _ in workload.runs[0::2]]) == [
        d - STACK_DEPTHS[1] for d in STACK_DEPTHS[1:4]
    ]


def test_the_depth_scan_refuses_a_step_of_zero_with_one_error_line() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "stack_depths.py"
    done = subprocess.run([sys.executable, str(script), "--step", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("error: --step must be at least 1, not 0")


def test_the_depth_scan_counts_the_faults_a_full_compile_took_too_against_neither(tmp_path: Path) -> None:
    """`--render` writes the page from its .json; a depth where both forms took faults (transformers'
    `generate` crossing a chunk's end) is not one where the default's blocks did."""

    def row(depth: int, full: tuple[float, int], default: tuple[float, int]) -> dict[str, Any]:
        return {
            "depth": depth,
            "full": {"ms": full[0], "faults": full[1]},
            "regional": {"ms": default[0], "faults": default[1]},
        }

    rows = [row(0, (8.0, 3), (10.0, 35)), row(2, (9.0, 300), (9.0, 310)), row(4, (8.0, 3), (8.4, 2))]
    run = {"python": "python", "model": "gpt-32", "versions": {"torch": "2.13.0"}, "rows": rows}
    sitting = {
        "measured": "2026-11-27",
        "machine": "x",
        "runtime": 19,
        "command": "c",
        "calls": 9,
        "runs": [run],
    }
    (tmp_path / "stack-depths.json").write_text(json.dumps(sitting), encoding="utf-8")
    script = Path(__file__).resolve().parents[1] / "scripts" / "stack_depths.py"
    done = subprocess.run([sys.executable, str(script), "--render", "--out", str(tmp_path)], check=False)
    assert done.returncode == 0
    page = (tmp_path / "stack-depths.md").read_text(encoding="utf-8")
    assert (
        "- [torch 2.13.0, gpt-32](stack-depths/2.13.0-gpt-32.md): a page fault a block more than a full "
        "compile at 1 of 3 depths (0): 1.25x to 1.25x a full compile's time; elsewhere a median of 1.02x; "
        "over every depth a median of 1.05x, at most 1.25x." in page
    )
    depths = (tmp_path / "stack-depths" / "2.13.0-gpt-32.md").read_text(encoding="utf-8")
    assert "| 2 | 9.00, 300 | 9.00, 310 | 1.00x |" in depths


def test_the_depth_scan_renders_no_page_from_a_missing_json_with_one_error_line(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "stack_depths.py"
    done = subprocess.run(
        [sys.executable, str(script), "--render", "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert f"error: {tmp_path / 'stack-depths.json'}: cannot render it" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "stack-depths.md").exists()
