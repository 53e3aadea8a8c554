"""scripts/bench_serving.py: a run's order and token check, with its processes stood in for, and its runs in
parts (`--add`): what an earlier run's file keeps."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_serving
from serving import report
from serving.settings import CHECK, DEFAULT_VARIANTS, LLAMA3_8B


def meta(
    command: str, commit: str = "abc1234", device: str = "NVIDIA H200", date: str = "2026-11-26"
) -> dict[str, Any]:
    settings = {"device": "cuda", "smoke": False, "dtype": "bfloat16", "model": {"layers": 32}}
    settings |= {"prompt_len": 128, "tokens": 32, "rounds": 5, "commands": [command], "date": date}
    bandwidth = {"device_name": device, "versions": {"torch": "2.11.0"}}
    prepared = {"regionalize_commit": commit, "runtime": 14}
    return {**settings, "bandwidth": bandwidth, "prepared": prepared}


def earlier(tmp_path: Path) -> Path:
    then = meta("first")
    then["wall_s"], then["earlier_wall_s"] = 100.0, 50.0
    results = {"full": {"first_generate_s": 90.0}, "rewrite": {"first_generate_s": 9.0}}
    checks = {"full": {"verdict": "identical"}, "rewrite": {"verdict": "identical"}}
    body = {"meta": then, "results": results, "token_check": checks}
    (tmp_path / "serving.json").write_text(json.dumps(body))
    return tmp_path


@pytest.mark.parametrize(
    ("checking", "commit", "rewrite_check_kept"),
    [(False, "abc1234", True), (True, "abc1234", False), (False, "def5678", False)],
)
def test_a_run_in_parts_keeps_rows_it_does_not_measure_and_checks_it_does_not_redo(
    tmp_path: Path, checking: bool, commit: str, rewrite_check_kept: bool
) -> None:
    now = meta("second", commit)
    rows, check = report.kept(earlier(tmp_path), now, ["rewrite"], checking)
    # The variant measured again is the new run's; a row kept says when it was measured, on no rewrite.
    assert rows == {"full": {"first_generate_s": 90.0, "date": "2026-11-26", "rewrites": None}}
    assert "full" in check and ("rewrite" in check) == rewrite_check_kept
    assert now["commands"] == ["first", "second"] and now["earlier_wall_s"] == 150.0


def test_a_run_on_another_machine_is_not_added_to(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="another machine"):
        report.kept(earlier(tmp_path), meta("second", device="NVIDIA H100"), ["rewrite"], False)


def test_the_table_says_which_command_each_row_is_from_only_where_there_are_several() -> None:
    one = meta("first") | {"date": "2026-11-26", "wall_s": 60.0, "check_model": {}}
    one["model"] = dict(LLAMA3_8B)
    one["check_model"] = dict(CHECK)
    assert "last of these commands" not in report.markdown(one, {}, {})
    several = one | {"commands": ["first", "second"], "earlier_wall_s": 60.0}
    text = report.markdown(several, {}, {})
    assert "Each row is from the last of these commands that names its variant (*run*)" in text
    assert "(1) `first` and (2) `second`" in text and "2.0 minutes in all" in text


def test_each_row_names_the_last_run_that_measured_its_variant() -> None:
    commands = [
        "python scripts/bench_serving.py --hot",
        "python scripts/bench_serving.py --variants full rewrite --add --no-token-check",
        "python scripts/bench_serving.py --add --variants rewrite",
    ]
    found = report.runs(commands)
    assert found["eager"] == 1 and found["full"] == 2 and found["rewrite"] == 3
    settings = meta("x") | {"commands": commands, "wall_s": 60.0, "earlier_wall_s": 0.0}
    settings |= {"model": dict(LLAMA3_8B), "check_model": dict(CHECK)}
    row = {"first_generate_s": 9.0, "decode_ms_per_token": 10.0, "peak_memory_gib": 1.0, "forms": {}}
    text = report.markdown(settings, {"full": row, "rewrite": row | {"first_generate_s": 3.0}}, {})
    assert "| full | (2) | 9.0 | 1.00x |" in text and "| rewrite | (3) | 3.0 | 3.00x |" in text


def test_render_writes_the_table_again_from_its_json(tmp_path: Path) -> None:
    settings = meta("first") | {"wall_s": 60.0, "model": dict(LLAMA3_8B), "check_model": dict(CHECK)}
    row = {"first_generate_s": 9.0, "decode_ms_per_token": 10.0, "peak_memory_gib": 1.0, "forms": {}}
    report.write(tmp_path, settings, {"full": row}, {})
    written = (tmp_path / "serving.md").read_text()
    (tmp_path / "serving.md").write_text("stale")
    report.render(tmp_path)
    assert (tmp_path / "serving.md").read_text() == written


def test_rows_measured_on_other_rewrites_or_days_are_named_in_the_table(tmp_path: Path) -> None:
    now = meta("second", "def5678", date="2026-11-27")
    rows, _ = report.kept(earlier(tmp_path), now, ["full"], False)
    now |= {"wall_s": 60.0, "model": dict(LLAMA3_8B), "check_model": dict(CHECK)}
    rows = {"rewrite": rows["rewrite"] | {"error": "cut short"}}
    text = report.markdown(now, rows, {})
    assert "on 2026-11-26 and 2026-11-27" in text
    assert "Rows rewrite: rewrites of runtime 14, regionalize abc1234." in text
    rows["rewrite"] |= {"date": "2026-11-27", "rewrites": report.rewrites_of(now, "rewrite")}
    text = report.markdown(now, rows, {})
    assert "rewrites of runtime" not in text and "on 2026-11-27:" in text


def test_a_run_without_variants_names_the_default_ones() -> None:
    found = report.runs(["python scripts/bench_serving.py --hot"])
    assert list(found) == DEFAULT_VARIANTS and "rewrite_static_cuda_graphs" not in found


def test_the_header_says_where_the_last_commands_time_went() -> None:
    settings = meta("first") | {"wall_s": 120.0, "model": dict(LLAMA3_8B), "check_model": dict(CHECK)}
    settings["stages"] = {"bandwidth_s": 15.2, "token_check_s": 24.6, "first_processes_s": 70.0}
    text = report.markdown(settings, {}, {})
    stages = "the bandwidth 15 s, the token check 25 s, the variants' first processes 70 s"
    assert f"2.0 minutes in all ({stages})." in text
    text = report.markdown(settings | {"earlier_wall_s": 60.0}, {}, {})
    assert f"3.0 minutes in all (the last command's 2.0: {stages})." in text
    assert "minutes in all. " in report.markdown(settings | {"stages": {}}, {}, {})


def fake_processes(monkeypatch: pytest.MonkeyPatch, tokens: dict[str, Any]) -> list[tuple[str, str]]:
    """bench_serving's fresh processes stood in for: what each would have run, in order; a variant's fp32
    tokens from `tokens` (a string: the process's error)."""
    ran = []

    def run_fresh(job: dict[str, Any], timeout: float, kept: Any = None, threads: Any = None) -> dict:
        ran.append((job["kind"], job.get("variant", "")))
        if job["kind"] == "tokens":
            got = tokens[job["variant"]]
            return {"error": got} if isinstance(got, str) else {"tokens": got}
        if job["kind"] == "bandwidth":
            return {"device_name": "cpu", "versions": {}, "wall_s": 1.0}
        row = {"first_generate_s": 2.0, "decode_ms_per_token": 1.0, "peak_memory_gib": None, "forms": None}
        return {**row, "variant": job.get("variant"), "wall_s": 3.0}

    monkeypatch.setattr(bench_serving, "run_fresh", run_fresh)
    return ran


def test_the_token_check_compares_each_variants_tokens_with_eagers(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = {"eager": [5, 6, 7], "full": [5, 6, 7], "rewrite": [5, 9, 7], "per_block": [5, 6]}
    tokens["rewrite_static"] = "RuntimeError: boom"
    ran = fake_processes(monkeypatch, tokens)
    check = bench_serving.token_check({}, ["full", "rewrite", "per_block", "rewrite_static"], 10.0)
    assert sorted(ran) == sorted(("tokens", v) for v in tokens)  # eager's too, not reported
    assert check["full"]["verdict"] == "identical"
    assert (check["rewrite"]["verdict"], check["rewrite"]["first_differ"]) == ("differ", 1)
    assert (check["per_block"]["verdict"], check["per_block"]["first_differ"]) == ("differ", 2)
    assert check["rewrite_static"] == {"verdict": "error", "error": "RuntimeError: boom"}
    ran = fake_processes(monkeypatch, tokens | {"eager": "OSError: no"})
    assert bench_serving.token_check({}, ["full"], 10.0)["full"]["error"] == "eager: OSError: no"


def test_restarts_come_after_every_first_process_and_only_for_the_serving_paths_and_full(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = ["eager", "full", "transformers_static"]
    ran = fake_processes(monkeypatch, {v: [1, 2] for v in variants})
    argv = ["bench_serving.py", "--device", "cpu", "--smoke", "--hot", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--variants", *variants])
    monkeypatch.setattr(bench_serving.signal, "signal", lambda *_: None)  # pytest's handlers kept
    bench_serving.main()
    assert ran[0] == ("bandwidth", "") and sorted(ran[1:4]) == sorted(("tokens", v) for v in variants)
    assert ran[4:] == [
        *(("variant", v) for v in variants),
        ("restart", "full"),
        ("restart", "transformers_static"),
    ]
    found = json.loads((tmp_path / "serving.json").read_text())
    assert found["results"]["full"]["restart_first_generate_s"] == 2.0
    assert "restart_first_generate_s" not in found["results"]["eager"]
    assert set(found["meta"]["stages"]) == {"bandwidth_s", "token_check_s", "first_processes_s", "restarts_s"}
    assert "== full restart (3 s): first generate 2.00 s" in capsys.readouterr().out


def test_render_without_a_json_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_serving.py", "--render", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"error: .*serving\.json: no such file to render"):
        bench_serving.main()
