"""`regionalize verify`: each check on tiny models (eager backend: Dynamo's accounting without inductor's
compile time), the fresh-process timing once, and the pure helpers directly."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch_support import needs_reuse

from regionalize.bench import accounting, served
from regionalize.bench.accounting import GraphAccount, _fill, describe_reason
from regionalize.bench.loading import VerifyError, resolve_target
from regionalize.bench.manifest import SKIPPABLE
from regionalize.bench.session import BY_NAME
from regionalize.bench.timing import WorkerJob, options_to_json, run_worker
from regionalize.cli.verify_command import verify as verify_command
from regionalize.shared.options import Options
from regionalize.verify import render, run_verify
from regionalize.verify.checks import summarize
from regionalize.verify.compare import compare, tolerance

MODELS = Path(__file__).parent / "models"
EAGER = Options(vendor=True, backend="eager")  # a lone file: verify loads the copy beside it
REWRITTEN = MODELS / "stack_inplace.py"
REWRITTEN_IDX = MODELS / "layer_idx_inplace.py"
ROOT = Path(__file__).resolve().parents[1]


# The variants a test leaves out where it checks only the full compile and the rewrite's default: each
# variant run is fresh processes and compiles of its own.
OTHERS = ("dedup", "per-block", "bypass")
SKIP_OTHERS = [flag for name in OTHERS for flag in ("--skip", name)]


def verify(
    tmp_path: Path, model: str | Path | None, factory: str, rewritten: str | Path | None, **kwargs: Any
) -> tuple[int, dict[str, Any], str]:
    """run_verify with test defaults; (exit code, JSON result, printed table)."""
    out = tmp_path / "result.json"
    table = tmp_path / "table.txt"
    kwargs = {"options": EAGER, "repeats": 1, "cold_start": False, **kwargs}
    with table.open("w") as stream:
        code = run_verify(
            str(model) if model else None,
            factory,
            str(rewritten) if rewritten else None,
            json_out=str(out),
            out=stream,
            **kwargs,
        )
    return code, json.loads(out.read_text()), table.read_text()


# --- the checks, end to end ---------------------------------------------------------------------------


def test_equivalent_rewrite_passes_and_reports_every_key(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", REWRITTEN)
    assert code == 0 and result["exit_code"] == 0 and result["error"] is None
    assert result["equivalent"] is True and result["state_dict_compatible"] is True
    assert result["max_abs_diff"] == pytest.approx(0.0, abs=1e-5)
    assert result["forward"]["compared"] == 2  # the dict output's two tensors
    assert result["gradients"]["compared"] == 18  # every parameter
    assert result["graphs"] == {"full": 1, "full_dedup": 1, "regional": 1}
    assert result["recompiles"] == {"full": 0, "full_dedup": 0, "regional": 0}
    assert result["fell_back_to_eager"] is False
    assert set(result["steady_us"]) == {
        "eager",
        "full",
        "full_dedup",
        "regional",
        "per_block",
        "regional_bypass",
    }
    # The per-block and bypass variants need the codemod's output, which a --rewritten file does not give.
    assert result["steady_us"]["regional_bypass"] is None and result["bypass_equivalent"] is None
    assert result["steady_us"]["per_block"] is None and "codemod's output" in result["skipped"]["per_block"]
    assert all(
        us > 0 for name, us in result["steady_us"].items() if name not in ("regional_bypass", "per_block")
    )
    # Interleaved rounds: the median is reported with the spread it comes from.
    spread = result["steady_spread_us"]
    assert set(spread) == {"eager", "full", "full_dedup", "regional"}
    assert all(s["min"] <= s["median"] == result["steady_us"][n] <= s["max"] for n, s in spread.items())
    assert result["compile_s"] == dict.fromkeys(("full", "full_dedup", "regional", "per_block"))  # not timed
    assert result["compile_speedup"] is None
    # --device auto: CUDA where there is one, so the suite passes on GPU machines too.
    assert result["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert result["torch_version"] == torch.__version__
    # A plain factory: the workload keys are there, empty.
    assert result["workload"] is None and result["tokens_identical"] is None
    assert result["ttft_s"] is None and result["decode_ms_per_token"] is None
    assert "PASS: equivalent and checkpoint-compatible" in table


def test_rewrite_with_a_different_block_fails(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", MODELS / "stack_broken.py")
    assert code == 1
    assert result["equivalent"] is False
    assert result["state_dict_compatible"] is True  # same parameters, different computation
    assert result["max_abs_diff"] > 1e-3
    failing = {f["path"] for f in result["forward"]["failures"]}
    assert failing == {"output.hidden", "output.logits"}
    assert result["gradients"]["ok"] is False
    assert "FAIL: outputs or gradients differ" in table


def test_wrap_style_is_equivalent_but_breaks_checkpoints(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", MODELS / "stack_wrap.py")
    assert code == 1
    assert result["equivalent"] is True  # weights were remapped past `_orig_mod.` to compare
    assert result["state_dict_compatible"] is False
    assert "layers.0._orig_mod.linear1.weight" in result["state_dict"]["unexpected"]
    assert "layers.0.linear1.weight" in result["state_dict"]["missing"]
    assert "does not load strictly" in table


def test_per_layer_int_attribute_recompiles_every_block(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "layer_idx.py", "make_shallow", REWRITTEN_IDX)
    assert code == 0
    assert result["recompiles"]["regional"] == 3  # four blocks, one graph each
    assert result["graphs"]["regional"] == 4
    assert result["fell_back_to_eager"] is False
    reasons = result["accounting"]["regional"]["recompile_reasons"]
    assert reasons == {"self.layer_idx == N (layer_idx_inplace.py:17 in forward)": 3}


def test_blocks_past_the_recompile_limit_fall_back_to_eager(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "layer_idx.py", "make_deep", REWRITTEN_IDX)
    assert code == 0  # still equivalent: the remaining blocks run eagerly, correctly but slowly
    assert result["fell_back_to_eager"] is True
    assert result["recompiles"]["regional"] == 7  # recompile_limit 8 = the first graph + 7
    fallback = result["accounting"]["regional"]["fallback"]
    assert "hit recompile_limit (8)" in fallback and "self.layer_idx == 7" in fallback
    assert result["accounting"]["full"]["fell_back_to_eager"] is False
    assert "warning: blocks fell back to eager" in table


def test_fresh_process_compile_timing(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make", REWRITTEN, cold_start=True)
    assert code == 0
    # warm, cold, hot (the caches the cold process left) and from the artifacts it saved
    for key in ("compile_s", "compile_cold_s", "compile_hot_s", "compile_artifact_s"):
        assert set(result[key]) == {"full", "full_dedup", "regional", "per_block"}
        assert all(result[key][name] > 0 for name in ("full", "regional"))
    assert all(isinstance(result["artifact_bytes"][name], int) for name in ("full", "regional"))
    assert result["compile_runs"]["regional"]["cold"] and len(result["compile_runs"]["full"]["warm"]) == 1
    assert len(result["compile_runs"]["full"]["hot"]) == len(result["compile_runs"]["full"]["artifact"]) == 1
    seconds = result["compile_s"]
    assert result["compile_speedup"] == pytest.approx(seconds["full"] / seconds["regional"])


def test_quick_preset_shows_progress_on_stderr_and_times_warm_processes_once(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = [str(MODELS / "stack.py"), "--factory", "make", "--rewritten", str(REWRITTEN)]
    run = CliRunner().invoke(
        verify_command, [*args, *SKIP_OTHERS, "--backend", "eager", "--quick", "--json", str(out)]
    )
    assert run.exit_code == 0, run.output
    steps = [line for line in run.stderr.splitlines() if line.startswith("verify [")]
    assert steps[0].endswith(f"importing {MODELS / 'stack.py'}") and steps[-1].endswith("done")
    assert any("fresh warm process (1 of 1)" in line for line in steps)
    assert not any("cold process" in line for line in steps)
    assert "verify [" not in run.stdout and "PASS: equivalent" in run.stdout
    result = json.loads(out.read_text())
    assert all(len(result["compile_runs"][v]["warm"]) == 1 for v in ("full", "regional"))
    assert not any(result["compile_cold_s"].values()) and result["compile_s"]["full"] > 0


def test_quick_preset_takes_the_repeats_it_is_given(tmp_path: Path) -> None:
    """As scripts/bench_decode.py asks: warm processes only, a median of several."""
    out = tmp_path / "result.json"
    args = [str(MODELS / "stack.py"), "--factory", "make", "--rewritten", str(REWRITTEN), "--quick"]
    run = CliRunner().invoke(
        verify_command, [*args, *SKIP_OTHERS, "--backend", "eager", "--repeats", "2", "--json", str(out)]
    )
    assert run.exit_code == 0, run.output
    result = json.loads(out.read_text())
    assert all(len(result["compile_runs"][v]["warm"]) == 2 for v in ("full", "regional"))
    assert not any(result["compile_cold_s"].values())


def test_starts_time_the_processes_named_a_hot_one_after_the_cold_one_that_fills_its_caches(
    tmp_path: Path,
) -> None:
    out = tmp_path / "result.json"
    args = [str(MODELS / "stack.py"), "--factory", "make", "--rewritten", str(REWRITTEN), "--repeats", "1"]
    run = CliRunner().invoke(
        verify_command, [*args, *SKIP_OTHERS, "--backend", "eager", "--starts", "hot", "--json", str(out)]
    )
    assert run.exit_code == 0, run.output
    steps = [line.partition("] ")[2] for line in run.stderr.splitlines() if "fresh" in line]
    assert [step.split(" in a fresh ")[1] for step in steps if " of full " in step] == [
        "cold process (1 of 1)",
        "hot process (1 of 1)",
    ]
    result = json.loads(out.read_text())
    assert result["compile_hot_s"]["regional"] > 0 and result["compile_cold_s"]["regional"] > 0
    assert not any(result["compile_s"].values()) and not any(result["compile_artifact_s"].values())
    assert re.search(r"hot \(caches on disk\) +\d", run.stdout)

    wrong = CliRunner().invoke(verify_command, [*args, "--starts", "warm,lukewarm"])
    assert wrong.exit_code == 2 and "give some of cold, warm, hot, artifact" in wrong.output


def test_a_hot_first_generate_finds_the_caches_the_warm_one_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted service's first generate: the caches of a whole first generate (its decode step's
    compile among them) kept for a process after it; without hot starts, nothing kept."""
    from regionalize.bench import timing

    calls: list[tuple[str, bool, str | None, str]] = []

    def worker(job: WorkerJob, timeout_s: float, cache: str | None = None) -> dict[str, Any]:
        assert cache is None or Path(cache).is_dir()
        first = (job.workload or {}).get("first", "token")
        calls.append((job.variant, job.warm, cache, first))
        return {"first_call_s": float(len(calls))}

    monkeypatch.setattr(timing, "run_worker", worker)
    spec = {"kind": "generate", "tokens": 2, "cache": "static"}
    job = WorkerJob("m.py", "make", "", {}, {}, "cpu", False, [], workload=spec)
    runs = timing.cold_starts(job, ["full"], 1, 60, ("cold", "hot"))
    (cold, hot, warm_generate, hot_generate) = calls
    assert [c[3] for c in calls] == ["token", "token", "generate", "generate"]
    assert cold[2] == hot[2] and warm_generate[2] == hot_generate[2] and cold[2] != warm_generate[2]
    assert warm_generate[1] and not hot_generate[1]
    assert runs["full"]["generate"] == [3.0] and runs["full"]["generate_hot"] == [4.0]

    calls.clear()
    runs = timing.cold_starts(job, ["full"], 1, 60, ("warm",))
    assert [(warm, cache, first) for _, warm, cache, first in calls] == [
        (True, None, "token"),
        (True, None, "generate"),
    ]
    assert "generate_hot" not in runs["full"]


def test_the_report_gives_the_hot_first_generate_beside_the_warm_one_only_where_timed() -> None:
    times = {"full": 20.0, "regional": 8.0}
    result: dict[str, Any] = {
        "compile_s": times,
        "compile_runs": {"full": {"warm": [1.0]}},
        "accounting": {},
        "ttft_s": times,
        "first_generate_s": {"full": 60.0, "regional": 20.0},
        "first_generate_hot_s": {"full": 12.0, "regional": 6.0},
    }
    lines = render._compile(result)
    assert any(re.fullmatch(r" +first generate \(warm\) +60\.00 s +20\.00 s +3\.00x", line) for line in lines)
    assert any(re.fullmatch(r" +first generate \(hot\) +12\.00 s +6\.00 s +2\.00x", line) for line in lines)
    result["first_generate_hot_s"] = dict.fromkeys(times)
    assert not any("first generate (hot)" in line for line in render._compile(result))


def test_codemod_output_is_verified_in_memory(tmp_path: Path) -> None:
    pytest.importorskip("regionalize.codemod", exc_type=ImportError)
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", None)
    assert code == 0 and result["rewritten"] is None
    assert result["equivalent"] and result["state_dict_compatible"]
    # The guard bypass, as a third variant: checked for equivalence and timed.
    assert result["bypass_equivalent"] is True
    assert result["steady_us"]["regional_bypass"] > 0 and "regional_bypass" in table
    assert re.search(r"guard bypass +PASS", table)


@needs_reuse
def test_hierarchical_rewrite_reports_its_form_and_regions_beside_per_block(tmp_path: Path) -> None:
    options = Options(backend="aot_eager")
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", None, options=options)
    assert code == 0 and result["equivalent"]
    regional, per_block = result["accounting"]["regional"], result["accounting"]["per_block"]
    assert regional["forms"] == {"Stack": "whole"}
    assert (regional["regions_traced"], regional["regions_stamped"]) == (1, 3)  # 4 layers, 1 traced
    assert per_block["forms"] == {} and per_block["graphs"] == 1
    assert result["steady_us"]["per_block"] > 0
    assert "regional form: Stack compiled whole, blocks nested regions" in table


def test_an_owner_that_cannot_be_compiled_whole_is_named_in_the_verdict(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", None)  # the eager backend
    assert code == 0
    assert result["accounting"]["regional"]["forms"]["Stack"].startswith("per-block: the eager backend")
    assert "an owner could not be compiled whole" in table


def test_an_owner_of_one_block_is_named_without_a_fallback_warning() -> None:
    from regionalize.bench.zoo_report import form

    def result(*owners: tuple[str, str, bool]) -> dict[str, Any]:
        records = [{"owner": name, "form": kind, "fallback": fallback} for name, kind, fallback in owners]
        accounting = {"regional": {"owners": records}}
        base = {"equivalent": True, "state_dict_compatible": True, "fell_back_to_eager": False}
        return {**base, "accounting": accounting}

    alone = result(("Transformer2DModel", "alone", False))
    assert render.verdict(alone) == "PASS: equivalent and checkpoint-compatible"
    assert form(alone) == "per-block (one block per owner)"
    mixed = result(("Transformer2DModel", "alone", False), ("Encoder", "whole", False))
    assert form(mixed) == f"hierarchical (Transformer2DModel: {served.ALONE})"
    pieces = result(("Encoder", "whole, in pieces", True))  # a fallback, but still one frame a call
    assert render.verdict(pieces) == "PASS: equivalent and checkpoint-compatible"
    assert form(pieces) == "hierarchical"
    fallen = result(("Transformer2DModel", "alone", False), ("Encoder", "per block", True))
    assert "could not be compiled whole" in render.verdict(fallen)
    assert form(fallen) == "per-block (fell back: Encoder)"
    assert (
        form(result(("Encoder", "per block", False)))
        == "per-block (this torch does not reuse a traced region)"
    )
    # A zoo result kept by a release before owners were records names the forms in text only.
    kept = {
        "accounting": {"regional": {"forms": {"Block": served.ALONE, "Encoder": "per-block: Unsupported"}}}
    }
    assert form(kept) == "per-block (fell back: Encoder)"


# --- workloads: (model, run) factories and --workload generate -------------------------------------------


def test_run_workload_is_compared_accounted_and_timed_as_a_whole(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "cached.py", "make", MODELS / "cached_inplace.py")
    assert code == 0, result
    assert result["workload"] == {"kind": "run"} and result["equivalent"] is True
    # Both calls' outputs are compared, not just one forward.
    assert result["forward"]["compared"] == 2 and result["max_abs_diff_at"] in ("output[0]", "output[1]")
    assert result["gradients"]["compared"] == 0 and "without autograd" in result["gradients"]["note"]
    # The second call, with the cache filled, recompiles: one forward alone would show 1 graph, 0 recompiles.
    assert result["graphs"] == {"full": 2, "full_dedup": 2, "regional": 2}
    assert result["recompiles"] == {"full": 1, "full_dedup": 1, "regional": 1}
    assert result["accounting"]["regional"]["recompile_reasons"] == {
        "past is None (cached_inplace.py:17 in forward)": 1
    }
    assert all(result["steady_us"][name] > 0 for name in ("eager", "full", "regional"))
    assert result["tokens_identical"] is None and result["decode_ms_per_token"] is None
    assert "workload results" in table and "Steady state per run" in table


def test_run_workload_that_differs_fails(tmp_path: Path) -> None:
    broken = tmp_path / "cached_broken.py"
    # Only the second call reads the cache: a rewrite that reads it wrongly differs there alone.
    broken.write_text((MODELS / "cached_inplace.py").read_text().replace("past.mean(0)", "past.mean(0) * 2"))
    code, result, _ = verify(tmp_path, MODELS / "cached.py", "make", broken)
    assert code == 1 and result["equivalent"] is False
    assert [f["path"] for f in result["forward"]["failures"]] == ["output[1]"]


def test_run_workload_first_call_in_a_fresh_process(tmp_path: Path) -> None:
    code, result, _ = verify(
        tmp_path,
        MODELS / "cached.py",
        "make",
        MODELS / "cached_inplace.py",
        cold_start=True,
        starts=("warm",),
        skip=OTHERS,
    )
    assert code == 0
    assert all(result["compile_s"][name] > 0 for name in ("full", "regional"))
    assert result["ttft_s"] is None  # not generation


HF_LLAMA = MODELS / "hf_llama.py"


def llama_file() -> Path:
    """transformers' own modeling_llama.py, verified unchanged; HF_LLAMA's factories build a tiny model."""
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    return Path(modeling_llama.__file__)


def test_generate_workload_on_a_tiny_llama(tmp_path: Path) -> None:
    pytest.importorskip("regionalize.codemod", exc_type=ImportError)  # the rewrite is made in memory
    out = tmp_path / "r.json"
    args = [str(llama_file()), "--factory", f"{HF_LLAMA}:make", "--workload", "generate", "--tokens", "3"]
    args += ["--no-cold-start", "--backend", "eager", "--json", str(out)]
    run = CliRunner().invoke(verify_command, args)
    result = json.loads(out.read_text())
    assert run.exit_code == 0, run.output
    assert result["equivalent"] is True and result["tokens_identical"] is True
    # The factory's prompt, and transformers' default cache.
    assert result["workload"] == {"kind": "generate", "tokens": 3, "prompt_len": 5, "cache": "dynamic"}
    assert result["forward"]["compared"] == 2 and result["max_abs_diff"] < 1e-4  # tokens and logits
    # The accounting covers the whole generation: the decode steps recompile after the prefill's graph.
    assert result["graphs"]["full"] >= 2 and result["recompiles"]["full"] >= 1
    assert result["graphs"]["regional"] >= 2
    assert set(result["decode_ms_per_token"]) == {"eager", "full", "full_dedup", "regional", "per_block"}
    assert all(ms > 0 for ms in result["decode_ms_per_token"].values())
    assert all(result["steady_us"][name] > 0 for name in ("eager", "full", "regional"))
    assert not any(result["ttft_s"].values())  # --no-cold-start
    assert "KV cache" in result["skipped"]["regional_bypass"] and result["bypass_equivalent"] is None
    assert re.search(r"generated tokens +PASS +3 new", run.output) and "Decode per token" in run.output


@needs_reuse
def test_generate_workload_with_a_static_cache(tmp_path: Path) -> None:
    """`--cache static`: generate makes transformers' fixed-size cache, the rewrite's layers stand in for it
    in one traced region, and the tokens are the original's."""
    out = tmp_path / "r.json"
    args = [str(llama_file()), "--factory", f"{HF_LLAMA}:make", "--workload", "generate", "--tokens", "3"]
    args += ["--cache", "static", "--no-cold-start", "--backend", "aot_eager", "--json", str(out)]
    # A process of its own, as users run it: the traces counted are the process's first of the runtime's
    # frames, which earlier tests' decoders in this one would have taught Dynamo about.
    run = subprocess.run(
        [sys.executable, "-m", "regionalize", "verify", *args], capture_output=True, text=True
    )
    result = json.loads(out.read_text())
    assert run.returncode == 0, run.stdout + run.stderr
    assert result["workload"]["cache"] == "static" and result["tokens_identical"] is True
    assert result["fell_back_to_eager"] is False
    regional = result["accounting"]["regional"]
    assert regional["regions_traced"] == 2 and regional["forms"] == {"LlamaModel": "whole"}, regional


def test_generate_workload_with_other_tokens_fails(tmp_path: Path) -> None:
    # The factory gives only the model: the prompt is made from its config (--prompt-len, default 8).
    wrong = MODELS / "hf_llama_wrong.py"
    code, result, table = verify(
        tmp_path,
        llama_file(),
        f"{HF_LLAMA}:make_model_only",
        wrong,
        workload="generate",
        tokens=3,
        skip=OTHERS,
    )
    assert code == 1 and result["error"] is None
    assert result["equivalent"] is False and result["tokens_identical"] is False
    assert result["workload"]["prompt_len"] == 8
    assert {f["path"] for f in result["forward"]["failures"]} == {"output.tokens", "output.logits"}
    assert re.search(r"generated tokens +FAIL", table) and "FAIL: outputs or gradients differ" in table


def test_generate_worker_times_the_first_token(tmp_path: Path) -> None:
    # A bare model is a factory error unless the worker builds the generate workload from the job.
    job = WorkerJob(
        model_path=str(llama_file()),
        factory=f"{HF_LLAMA}:make_model_only",
        variant="full",
        sources={},
        options=options_to_json(EAGER),
        device="cuda" if torch.cuda.is_available() else "cpu",
        warm=False,
        sys_path=[p for p in sys.path if p],
        workload={"kind": "generate", "tokens": 3, "prompt_len": 4},
    )
    assert run_worker(job, timeout_s=300)["first_call_s"] > 0


@pytest.mark.parametrize(("first", "tokens"), [("token", [1]), ("generate", [3])])
def test_the_first_call_of_a_generation_is_its_first_token_or_the_whole_generate(
    first: str, tokens: list[int]
) -> None:
    """What the fresh-process first-call timing times: the first token (TTFT), or the whole first generate,
    in a process of its own (a second generate would compile again for a static cache's new addresses)."""
    from regionalize.bench.workloads import GenerateSpec, make_generate

    asked: list[int] = []

    class Model(torch.nn.Module):
        config = SimpleNamespace(vocab_size=16)

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))  # where the prompt goes

        def generate(self, ids: Any, max_new_tokens: int, **kwargs: Any) -> Any:
            asked.append(max_new_tokens)
            return SimpleNamespace(sequences=ids, logits=[torch.zeros(1)])

    workload = make_generate(GenerateSpec(3, 4, cache="static", first=first), Model(), (), {}, seed=0)
    workload.first(Model())
    assert asked == tokens


def test_generate_workload_gives_an_encoder_decoder_the_cache_generate_would() -> None:
    """An `EncoderDecoderCache` of two `DynamicCache`s, as generate makes for BART: handed one
    `DynamicCache`, its cross-attention keys went into the self-attention cache, and a compiled decoder
    failed on the second token (the mask one key short)."""
    transformers = pytest.importorskip("transformers")
    from regionalize.bench.workloads import Generate

    config = transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, forced_eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    workload = Generate(torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(0)), 3)
    expected = workload.run(model)
    torch._dynamo.reset()
    model.compile(backend="eager", fullgraph=True)
    actual = workload.run(model)
    assert actual["tokens"].tolist() == expected["tokens"].tolist()
    torch.testing.assert_close(actual["logits"], expected["logits"])


def test_an_unknown_cache_is_a_workload_error(tmp_path: Path) -> None:
    code, result, _ = verify(
        tmp_path, llama_file(), f"{HF_LLAMA}:make", None, workload="generate", cache="paged"
    )
    assert code == 2 and result["error"]["stage"] == "workload"
    assert "unknown cache 'paged'" in result["error"]["message"]


def test_generate_workload_needs_a_generating_model(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make", REWRITTEN, workload="generate")
    assert code == 2 and result["error"]["stage"] == "workload"
    assert "needs a model with .generate" in result["error"]["message"]


# --- where the model and the factory live --------------------------------------------------------------

RELATIVE_MODEL = """
    import torch
    import torch.nn as nn

    from ..common import Block


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(4) for _ in range(3)]){compile}

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x


    def make():
        return Net(), (torch.randn(2, 4),)
"""
COMPILE_LOOP = """
            for block in self.blocks:
                block.compile(backend="eager")"""


def make_package(root: Path, name: str) -> Path:
    """root/name/{__init__,common}.py and root/name/sub/model.py, which imports `..common` relatively."""
    (root / name / "sub").mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "sub" / "__init__.py").write_text("")
    (root / name / "common.py").write_text(
        textwrap.dedent("""
        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.linear = nn.Linear(width, width)

            def forward(self, x):
                return self.linear(x).tanh()
    """)
    )
    model = root / name / "sub" / "model.py"
    model.write_text(textwrap.dedent(RELATIVE_MODEL.format(compile="")))
    return model


def test_rewrite_inside_a_package_resolves_relative_imports(tmp_path: Path) -> None:
    model = make_package(tmp_path / "lib", "rgz_relpkg")
    # The rewrite lives elsewhere, as the in-memory one does, yet `from ..common` must still resolve.
    rewritten = tmp_path / "out" / "model.py"
    rewritten.parent.mkdir()
    rewritten.write_text(textwrap.dedent(RELATIVE_MODEL.format(compile=COMPILE_LOOP)))
    code, result, _ = verify(tmp_path, model, "make", rewritten)
    assert code == 0, result
    assert result["equivalent"] and result["graphs"]["regional"] == 1
    assert "rgz_relpkg.sub.model__regionalized" in sys.modules


def test_factory_named_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_package(tmp_path / "lib", "rgz_modpkg")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    rewritten = tmp_path / "model_rewritten.py"
    rewritten.write_text(textwrap.dedent(RELATIVE_MODEL.format(compile=COMPILE_LOOP)))
    code, result, _ = verify(tmp_path, None, "rgz_modpkg.sub.model:make", rewritten)
    assert code == 0, result
    assert result["model"] == str(model.resolve())


def test_factory_in_another_file_builds_from_the_module_it_is_given(tmp_path: Path) -> None:
    factory = tmp_path / "factories.py"
    factory.write_text(
        textwrap.dedent("""
        import torch

        def make(module, depth=3):
            return module.Stack(depth, module.WIDTH), (torch.randn(2, module.WIDTH),)

        def make_without_module():
            raise AssertionError("never called")

        def make_with_two(module, depth):
            raise AssertionError("never called")
    """)
    )
    code, result, _ = verify(tmp_path, MODELS / "stack.py", f"{factory}:make", REWRITTEN)
    assert code == 0, result
    assert result["gradients"]["compared"] == 14  # three blocks and the head: the factory's depth
    for unfit in ("make_without_module", "make_with_two"):
        code, result, _ = verify(tmp_path, MODELS / "stack.py", f"{factory}:{unfit}", REWRITTEN)
        assert code == 2 and "must take one argument" in result["error"]["message"], unfit


def test_resolve_target_forms(tmp_path: Path) -> None:
    target = resolve_target(str(MODELS / "stack.py"), "make")
    assert target.factory_home is None and target.package == ""
    assert target.module_name == "_regionalize_script_stack"
    with pytest.raises(VerifyError, match=r"give MODEL\.py"):
        resolve_target(None, "make")
    with pytest.raises(VerifyError, match="is not NAME"):
        resolve_target(str(MODELS / "stack.py"), "make-model")
    with pytest.raises(VerifyError, match="cannot find the Python module"):
        resolve_target(None, "rgz_no_such_module:make")
    # Naming the model file itself as the factory's home is the same as a bare NAME.
    assert resolve_target(str(MODELS / "stack.py"), f"{MODELS / 'stack.py'}:make").factory_home is None


# --- errors in the user's code: exit 2, saying which step and why -------------------------------------


def test_factory_that_raises_exits_2_with_the_users_traceback(tmp_path: Path) -> None:
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make_raising", REWRITTEN)
    assert code == 2
    assert result["error"]["stage"] == "factory"
    assert result["error"]["message"] == "ValueError: the factory cannot build this model"
    trace = result["error"]["traceback"]
    assert 'stack.py", line' in trace and "in make_raising" in trace
    assert "regionalize/verify" not in trace and "regionalize/bench" not in trace  # only the user's frames
    assert "ERROR (factory)" in table


def test_factory_returning_the_wrong_shape_exits_2(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make_not_a_model", REWRITTEN)
    assert code == 2 and "not an nn.Module" in result["error"]["message"]
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "no_such_factory", REWRITTEN)
    assert code == 2 and "defines no function no_such_factory" in result["error"]["message"]


def test_model_or_rewrite_that_does_not_import_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('module-level failure')\n")
    code, result, _ = verify(tmp_path, broken, "make", REWRITTEN)
    assert code == 2 and result["error"]["stage"] == "import original"
    assert "module-level failure" in result["error"]["message"]
    assert "broken.py" in result["error"]["traceback"]
    unparsable = tmp_path / "unparsable.py"
    unparsable.write_text("def oops(:\n")
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make", unparsable)
    assert code == 2 and result["error"]["stage"] == "import rewritten"
    assert "SyntaxError" in result["error"]["message"]


def test_rewrite_that_raises_when_called_is_a_failed_check(tmp_path: Path) -> None:
    source = (REWRITTEN).read_text()
    rewritten = tmp_path / "raises.py"
    rewritten.write_text(source.replace("return self.relu2(", "return undefined_name + self.relu2("))
    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", rewritten)
    assert code == 1 and result["error"] is None
    assert result["equivalent"] is False
    assert "NameError" in result["rewrite_error"] and "raises.py" in result["rewrite_error"]
    assert "The rewritten model raised" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is missing")
def test_cuda_requested_without_a_gpu_exits_2(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make", REWRITTEN, device="cuda")
    assert code == 2 and result["error"]["stage"] == "device"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda(tmp_path: Path) -> None:
    code, result, _ = verify(tmp_path, MODELS / "stack.py", "make", REWRITTEN, device="auto")
    assert code == 0 and result["device"] == "cuda"
    # The per-block and bypass variants need the codemod's output, which a --rewritten file does not give.
    measured = {name for name, us in result["steady_us"].items() if us is not None}
    assert measured == {"eager", "full", "full_dedup", "regional"}
    assert all(result["steady_us"][name] > 0 for name in measured)


# --- the command ---------------------------------------------------------------------------------------


def test_click_command(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = [
        str(MODELS / "stack.py"),
        "--factory",
        "make",
        "--rewritten",
        str(MODELS / "stack_broken.py"),
        "--backend",
        "eager",
        "--no-cold-start",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(verify_command, [*args, "-q"])
    assert result.exit_code == 1, result.output
    assert "FAIL: outputs or gradients differ" in result.output
    assert result.stderr == ""  # -q: the report alone
    assert json.loads(out.read_text())["options"]["backend"] == "eager"


def test_skip_leaves_variants_out_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = [str(MODELS / "stack.py"), "--factory", "make", "--backend", "eager", "--no-cold-start"]
    args += ["--skip", "per-block", "--skip", "dedup", "--json", str(out), "-q"]
    result = CliRunner().invoke(verify_command, args)
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    left_out = "left out of this run by --skip"
    assert found["skipped"]["per_block"] == found["skipped"]["full_dedup"] == left_out
    assert found["steady_us"]["per_block"] is None and found["steady_us"]["full_dedup"] is None
    assert found["steady_us"]["regional"] > 0 and found["steady_us"]["full"] > 0
    assert "per_block" not in found["accounting"] and "regional" in found["accounting"]
    refused = CliRunner().invoke(verify_command, [*args[:3], "--skip", "full"])
    assert refused.exit_code == 2 and "'full' is not one of" in refused.output


def test_every_skippable_name_is_a_variant_verify_runs_and_none_is_a_ratios_base() -> None:
    assert set(SKIPPABLE.values()) <= set(BY_NAME)
    assert not {"eager", "full", "regional"} & set(SKIPPABLE.values())


def test_the_command_imports_no_torch() -> None:
    code = "import sys, regionalize.verify, regionalize.cli.verify_command; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


def test_table_for_an_error() -> None:
    result = {
        "model": "m.py",
        "factory": "make",
        "rewritten": None,
        "options": {"style": "inplace", "backend": "x"},
        "error": {"stage": "factory", "message": "ValueError: no", "traceback": "Traceback ...\n"},
    }
    text = render.table(result)
    assert "ERROR (factory): ValueError: no" in text and "Traceback ..." in text


# --- comparing outputs ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    extra: tuple[torch.Tensor, ...]


class ModelOutputLike(collections.OrderedDict):
    """Hugging Face's ModelOutput: a dataclass-like OrderedDict whose unset fields are absent."""


def test_compare_walks_nested_outputs() -> None:
    a = torch.randn(2, 3)
    expected = {"out": Output(a, (a, a)), "hf": ModelOutputLike(loss=a.sum()), "n": 3, "none": None}
    same = compare(
        expected,
        {"out": Output(a.clone(), (a, a)), "hf": ModelOutputLike(loss=a.sum()), "n": 3, "none": None},
    )
    assert {d.path for d in same} == {
        "output.out.logits",
        "output.out.extra[0]",
        "output.out.extra[1]",
        "output.hf.loss",
        "output.n",
        "output.none",
    }
    assert all(d.ok for d in same)
    shifted = compare(expected, {"out": Output(a + 1, (a, a)), "hf": ModelOutputLike(), "n": 4, "none": None})
    bad = {d.path: d for d in shifted if not d.ok}
    assert set(bad) == {"output.out.logits", "output.hf.loss", "output.n"}
    assert bad["output.out.logits"].max_abs == pytest.approx(1.0)
    assert "missing" in bad["output.hf.loss"].detail
    summary = summarize(shifted)
    assert summary["max_abs_diff"] == pytest.approx(1.0) and summary["max_abs_diff_at"] == "output.out.logits"
    assert [f["path"] for f in summary["failures"]] == ["output.out.logits", "output.n", "output.hf.loss"]


def test_compare_tolerances_by_dtype() -> None:
    x = torch.randn(64, dtype=torch.float64) * 10
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rtol, _ = tolerance(dtype)
        close = (x * (1 + rtol / 4)).to(dtype)
        assert compare(x.to(dtype), close)[0].ok, dtype
        assert not compare(x.to(dtype), (x * 1.3).to(dtype))[0].ok, dtype
    assert not compare(torch.arange(4), torch.arange(4) + torch.tensor([0, 0, 0, 1]))[0].ok  # ints: exact
    assert compare(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))[0].ok
    assert not compare(torch.tensor([math.nan]), torch.tensor([0.0]))[0].ok
    assert "shape" in compare(torch.zeros(2), torch.zeros(3))[0].detail
    assert "dtype" in compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64))[0].detail
    # atol grows with the tensor's magnitude: reordered float32 sums of large activations stay within it.
    big = torch.full((4,), 1e4)
    assert compare(big, big + 0.05)[0].ok and not compare(big, big + 5)[0].ok


# --- reading Dynamo's records --------------------------------------------------------------------------


def test_describe_reason() -> None:
    raw = (
        "0/6: self.layer_idx == 6          # return x * self.layer_idx  # ork/main/m.py:8 in forward "
        "(HINT: torch.compile considers integer attributes ...)\nUser stack trace: ..."
    )
    assert describe_reason(raw) == ("self.layer_idx == 6", "m.py:8 in forward")
    plain = "tensor 'x' requires_grad mismatch"
    assert describe_reason(f"0/1: {plain}") == (plain, "")


def test_fill_groups_recompiles_and_finds_the_limit_hit() -> None:
    def record(reason: str | None, fail: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(recompile_reason=reason, fail_reason=fail)

    metrics = [record(None)] + [record(f"0/{i}: self.k == {i}  # y  # a/b.py:3 in forward") for i in range(3)]
    limit_hit = "Dynamo recompile limit exceeded\n Limit type: recompile_limit"
    metrics += [
        record("0/3: x.size()[0] == 2"),
        record("0/4: self.k == 4  # y  # a/b.py:3 in forward", limit_hit),
    ]
    counters = {"frames": {"ok": 4}, "stats": {"unique_graphs": 4}, "graph_break": {"print\n more": 2}}
    account = GraphAccount()
    _fill(account, collections.defaultdict(collections.Counter, counters), metrics)
    assert account.recompiles == 4
    assert account.recompile_reasons == {"self.k == N (b.py:3 in forward)": 3, "x.size()[0] == 2": 1}
    assert account.graph_breaks == 2 and account.graph_break_reasons == {"print": 2}
    assert account.fell_back_to_eager
    assert account.fallback == (
        "b.py:3 in forward hit recompile_limit (8); last guard that failed: self.k == 4"
    )


def test_model_named_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_package(tmp_path / "lib", "rgz_dotpkg")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    target = resolve_target("rgz_dotpkg.sub.model", "make")
    assert target.model_path == model.resolve()
    assert target.module_name == "rgz_dotpkg.sub.model" and target.factory_home is None
    with pytest.raises(VerifyError, match=re.escape("cannot find the Python module 'rgz_dotpkg.nothing'")):
        resolve_target("rgz_dotpkg.nothing", "make")
    with pytest.raises(VerifyError, match=re.escape("no such file: missing.py")):
        resolve_target("missing.py", "make")


@pytest.mark.parametrize("counted", [pytest.param(True, marks=needs_reuse), False])
def test_regions_are_reported_as_not_counted_where_torch_does_not_count_them(
    counted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regionalize.bench import accounting

    if not counted:  # as in torch 2.11, which traces every region and has no such module
        real = accounting.importlib.util.find_spec
        monkeypatch.setattr(
            accounting.importlib.util,
            "find_spec",
            lambda name, *a: None if name.endswith(".invoke_subgraph") else real(name, *a),
        )
    region = torch.compiler.nested_compile_region(lambda x: x.sin() + 1)
    with accounting.recording() as account:
        torch.compile(lambda x: region(region(x)), backend="eager", fullgraph=True)(torch.randn(4))
    text = served.regions_text(account.to_json())
    assert text == ("1 / 1" if counted else "not counted by this torch")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("ours", [True, False])
def test_the_compile_cache_goes_with_its_folder_after_an_error(tmp_path: Path, ours: bool) -> None:
    """verify and tune compile in a fresh inductor cache inside their work folder. After an error torch
    keeps its own folder and logs where: a line that would name a folder about to be removed. Torch's
    loggers do not propagate to pytest's, so a handler of its own records what the logger lets out; the
    plain `fresh_cache` shows the line is there to leave out."""
    from torch._inductor.utils import fresh_cache

    from regionalize.bench.session import compile_cache

    logger, records = logging.getLogger("torch._inductor.utils"), _Records()
    logger.addHandler(records)
    try:
        cache = compile_cache(str(tmp_path)) if ours else fresh_cache(dir=str(tmp_path))
        with pytest.raises(RuntimeError, match="the user's error"), cache:
            raise RuntimeError("the user's error")
    finally:
        logger.removeHandler(records)
    assert any("kept" in m for m in records.messages) is not ours
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1  # torch's folder, inside the work folder


def test_a_json_file_that_cannot_be_written_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    target = tmp_path / "result.json"
    code = run_verify(str(tmp_path / "missing.py"), "f", json_out=str(target), cold_start=False)
    assert code == 2
    assert f"error: {target}: cannot write the JSON: No space left on device" in capsys.readouterr().err


def test_cuda_graphs_are_counted_captured_and_replayed_and_torchs_methods_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count wraps the CUDA-graph trees' manager for the body only; where no CUDA device is it is None
    (nothing is captured). The trees need a GPU, so here their two methods are stood in for."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.CUDAGraphTreeManager
    monkeypatch.setattr(manager, "record_function", lambda self, inputs, function_id: ("recorded", inputs))
    monkeypatch.setattr(manager, "execute_node", lambda self, node, inputs: ("replayed", inputs))
    own = manager.record_function, manager.execute_node
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with accounting.recording() as account:
        assert manager.record_function(None, [1], 0) == ("recorded", [1])
        for _ in range(3):
            assert manager.execute_node(None, "node", [2]) == ("replayed", [2])
    assert (manager.record_function, manager.execute_node) == own
    found = account.to_json()
    assert (found["cuda_graphs_captured"], found["cuda_graphs_replayed"]) == (1, 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with accounting.recording() as account:
        pass
    assert account.to_json()["cuda_graphs_captured"] is None


def test_the_table_counts_cuda_graphs_only_where_a_device_counted_them() -> None:
    base: dict[str, Any] = {"frames": 1, "graphs": 1, "recompiles": 0, "graph_breaks": 0}
    base |= {"fell_back_to_eager": False, "recompile_reasons": {}, "graph_break_reasons": {}, "fallback": ""}
    result: dict[str, Any] = {"compile_s": {"full": 2.0, "regional": 1.0}, "compile_runs": {}}
    result["accounting"] = {"full": {**base, "cuda_graphs_captured": None}, "regional": dict(base)}
    assert not any("CUDA graphs" in line for line in render._compile(result))
    result["accounting"]["regional"] |= {"cuda_graphs_captured": 2, "cuda_graphs_replayed": 62}
    (line,) = [line for line in render._compile(result) if "CUDA graphs" in line]
    assert re.fullmatch(r" +CUDA graphs captured / replayed +- +2 / 62", line)


def test_an_owner_of_an_older_vendored_runtime_keeps_its_state_in_a_dict_and_is_still_named() -> None:
    """A package rewritten by an earlier release keeps its copy, whose owners hold a dict of string keys."""

    class Fallen(torch.nn.Module):
        pass

    class Alone(torch.nn.Module):
        pass

    fallen, alone = Fallen(), Alone()
    fallen.__dict__["_regionalize_owner"] = {"blocks": [], "kwargs": {}, "why": "x", "unreused": True}
    alone.__dict__["_regionalize_owner"] = {"blocks": [], "kwargs": {}, "alone": True, "gone": 1}
    forms = accounting.served_forms(torch.nn.Sequential(fallen, alone))
    assert forms == {"Fallen": "per block, x", "Alone": served.ALONE}
