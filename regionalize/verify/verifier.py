"""Run every check and measurement on one model and collect the results as one JSON-ready dict."""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from regionalize.bench.accounting import GraphAccount, note_owners, recording
from regionalize.bench.loading import Target, import_paths, user_traceback
from regionalize.bench.memory import peak_memory
from regionalize.bench.progress import QUIET, Progress
from regionalize.bench.session import (
    BY_NAME,
    VARIANTS,
    Built,
    Subject,
    Variant,
    VariantUnavailable,
    compile_cache,
    resolve_device,
)
from regionalize.bench.timing import (
    STACK_DEPTHS,
    call,
    decode_timing,
    options_to_json,
    steady_us,
)
from regionalize.bench.workloads import Generate, GenerateSpec, Spec, Train, TrainSpec
from regionalize.shared.options import Options
from regionalize.verify.checks import (
    RewriteRaised,
    check_equivalence,
    check_state_dict,
    copy_weights,
    summarize,
)
from regionalize.verify.compare import Difference
from regionalize.verify.fresh_starts import record_starts


def verify(
    target: Target,
    factory: str,
    rewritten: str | None,
    device: str,
    repeats: int,
    options: Options,
    cold_start: bool = True,
    spec: Spec | None = None,
    progress: Progress = QUIET,
    kinds: tuple[str, ...] = ("cold", "warm", "hot", "artifact"),
    skip: tuple[str, ...] = (),
) -> dict[str, Any]:
    """All checks; raises VerifyError when the user's code cannot be imported, built or run.

    `spec` verifies a built-in workload instead of one forward (`--workload generate` or `train`); `skip`
    names variants left out (`manifest.SKIPPABLE`'s values), reported as skipped.
    """
    device = resolve_device(device)
    compiled = [v.name for v in VARIANTS if v.compiled and v.time_compile]
    result = _empty_result(target, factory, rewritten, device, options, spec, compiled)
    with (
        tempfile.TemporaryDirectory(prefix="regionalize-verify-") as workdir,
        import_paths(target),
        compile_cache(workdir),
    ):
        sources = {"rewritten": str(Path(rewritten).resolve())} if rewritten else {}
        subject = Subject(
            target, options, device, Path(workdir), sources, transform=rewritten is None, spec=spec
        )
        with saved_owners_off():  # this process's accounting counts compiles, which a load would skip
            _correctness(subject, result, progress)
            if result["rewrite_error"]:
                # A rewrite that raises has nothing to time; the traceback is the finding.
                return result
            _performance(subject, result, progress, skip)
        if cold_start:
            runnable = [name for name in compiled if name not in result["skipped"]]
            record_starts(subject, factory, runnable, repeats, result, progress, kinds)
    progress("done")
    return result


def _empty_result(
    target: Target,
    factory: str,
    rewritten: str | None,
    device: str,
    options: Options,
    spec: Spec | None,
    compiled: list[str],
) -> dict[str, Any]:
    """The result with every key present, each measurement None or empty until taken, so the JSON's
    consumers need no special cases whatever step stops the run; `compiled` names the variants whose
    first call is timed."""
    generate = isinstance(spec, GenerateSpec)
    train = isinstance(spec, TrainSpec)
    return {
        "model": str(target.model_path),
        "factory": factory,
        "rewritten": rewritten,
        "device": device,
        "torch_version": torch.__version__,
        "options": options_to_json(options),
        "steady_us": dict.fromkeys(v.name for v in VARIANTS),
        "steady_spread_us": {},
        "skipped": {},
        "accounting": {},
        "graphs": {},
        "frames": {},
        "recompiles": {},
        "graph_breaks": {},
        "fell_back_to_eager": False,
        "compile_s": dict.fromkeys(compiled),
        "compile_cold_s": dict.fromkeys(compiled),
        # A restarted process: the caches a first process left on disk (hot), or only the portable
        # artifacts it saved (artifact), with their size in bytes.
        "compile_hot_s": dict.fromkeys(compiled),
        "compile_artifact_s": dict.fromkeys(compiled),
        "artifact_bytes": dict.fromkeys(compiled),
        "compile_speedup": None,
        "compile_cold_speedup": None,
        "compile_runs": {},
        "workload": spec.to_json() if spec else None,
        "tokens_identical": None,
        # Generation only (None otherwise): the first-call timings are then the time to first token.
        "ttft_s": dict.fromkeys(compiled) if generate else None,
        "ttft_cold_s": dict.fromkeys(compiled) if generate else None,
        # The whole first generate, every compile of its tokens included (a warm process of its own).
        "first_generate_s": dict.fromkeys(compiled) if generate else None,
        "first_generate_hot_s": dict.fromkeys(compiled) if generate else None,
        "decode_ms_per_token": (
            dict.fromkeys(v.name for v in VARIANTS if v.time_compile) if generate else None
        ),
        # Training only: whether every step's loss is the original's, the time of a step, and the most
        # memory a run of steps took above what was in use before it, the least over a few runs (`_peaks`).
        "losses_equal": None,
        "train_ms_per_step": dict.fromkeys(v.name for v in VARIANTS) if train else None,
        "peak_step_bytes": dict.fromkeys(v.name for v in VARIANTS) if train else None,
    }


@contextlib.contextmanager
def saved_owners_off() -> Iterator[None]:
    """Saved owners off in this process (`REGIONALIZE_SAVED_OWNERS=0`), where a model is built twice in one
    cache: the second would load what the first saved, and its graphs and recompiles would go uncounted.
    The starts, each a process of its own, keep them on (unless the caller's environment turned them off)."""
    before = os.environ.get("REGIONALIZE_SAVED_OWNERS")
    os.environ["REGIONALIZE_SAVED_OWNERS"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["REGIONALIZE_SAVED_OWNERS"]
        else:
            os.environ["REGIONALIZE_SAVED_OWNERS"] = before


def _correctness(subject: Subject, result: dict[str, Any], progress: Progress) -> None:
    progress("building the original model")
    original = subject.build(BY_NAME["eager"])
    if original.workload is not None:
        result["workload"] = original.workload.to_json()
    progress("rewriting and building the regional model")
    rewritten = subject.build(BY_NAME["regional"]).model
    state = check_state_dict(original.model, rewritten)
    result["state_dict_compatible"] = state.compatible
    result["state_dict"] = state.to_json()
    result["rewrite_error"] = None
    mismatch = "" if state.compatible else copy_weights(original.model, rewritten)
    forward: list[Difference]
    gradients: list[Difference] = []
    note = ""
    if mismatch:
        forward = [Difference("state_dict", False, None, mismatch)]
        note = "not compared: the weights could not be copied"
    else:
        try:
            progress("comparing outputs and gradients with the original")
            equivalence = check_equivalence(original, rewritten)
            forward, gradients, note = equivalence.forward, equivalence.gradients, equivalence.backward_note
        except RewriteRaised as exc:
            forward = [Difference("output", False, None, f"the rewritten model raised {exc}")]
            note = "not compared: the rewritten model raised"
            assert exc.__cause__ is not None
            result["rewrite_error"] = user_traceback(exc.__cause__)
    result["forward"] = summarize(forward)
    result["gradients"] = summarize(gradients) if gradients else {"ok": True, "compared": 0, "note": note}
    everything = [d for d in forward + gradients if d.max_abs is not None]
    top = max(everything, key=lambda d: d.max_abs or 0.0, default=None)
    result["equivalent"] = result["forward"]["ok"] and result["gradients"]["ok"]
    result["max_abs_diff"] = top.max_abs if top else None
    result["max_abs_diff_at"] = top.path if top else None
    if isinstance(original.workload, Generate):
        tokens = [d for d in forward if d.path == "output.tokens"]
        result["tokens_identical"] = bool(tokens) and all(d.ok for d in tokens)
    if isinstance(original.workload, Train):
        losses = [d for d in forward if d.path == "output.loss"]
        result["losses_equal"] = bool(losses) and all(d.ok for d in losses)
    if not mismatch:
        progress("comparing the guard-bypass variant")
    result["bypass_equivalent"] = None if mismatch else _bypass_equivalent(subject, original)


def _bypass_equivalent(subject: Subject, original: Built) -> bool | None:
    """Does the guard-bypass variant compute what the original does? None when it cannot be built."""
    if isinstance(original.workload, Generate):
        return None  # not run for generation, see _performance
    try:
        bypass = subject.build(BY_NAME["regional_bypass"]).model
        copy_weights(original.model, bypass)
        equivalence = check_equivalence(original, bypass)
    except (VariantUnavailable, RewriteRaised):
        return None
    return all(d.ok for d in equivalence.forward + equivalence.gradients)


# Many short rounds rather than a few long ones: the 2-core CPU box's speed drifts over seconds, and with
# three rounds of 0.2 s a forward's ratio to a full compile read 0.87x in one process and 1.09x in the next
# (ViT, 24 layers); with fifteen of 0.04 s, 1.04x to 1.05x in three processes. A round holds one call
# or generation at least, so a slow model takes fifteen of each, its depths going on from round to round.
STEADY_ROUNDS = 15
# Runs of a training workload (its steps) whose peak memory is measured, per variant, after the timed rounds.
PEAK_ROUNDS = 3


def _performance(subject: Subject, result: dict[str, Any], progress: Progress, skip: tuple[str, ...]) -> None:
    """Per variant in this process: Dynamo's accounting of the first call; then steady-state latency in
    interleaved rounds (one round of each variant in turn), so that drift of the machine (clock, other
    load) falls on every variant alike; the spread over the rounds is reported with the median."""
    skipped: dict[str, str] = {}
    accounts, ready = _first_calls(subject, progress, skip, skipped)
    rounds: dict[str, list[float]] = {name: [] for name in ready}
    depths = {name: itertools.cycle(STACK_DEPTHS) for name in ready}
    per_token: dict[str, list[float]] = {name: [] for name in ready}
    # The rounds stay in this function: a helper's frame would move every timed call one frame deeper.
    for number in range(STEADY_ROUNDS):
        progress(f"steady state, round {number + 1} of {STEADY_ROUNDS}: {', '.join(ready)}")
        # The first round's warm-up compiles what the calls take (a decode step, its dynamic variant); later
        # rounds need one call only, to bring the variant back into the caches after the others.
        warmup = {} if number == 0 else {"warmup": 1}
        for name, built in list(ready.items()):
            try:
                if isinstance(built.workload, Generate):
                    whole, token_ms = decode_timing(
                        built, subject.device, min_rounds=1, budget_s=0.15, depths=depths[name], **warmup
                    )
                    rounds[name].append(whole)
                    per_token[name] += [] if token_ms is None else [token_ms]
                else:
                    us = steady_us(
                        built, subject.device, budget_s=0.04, min_calls=1, depths=depths[name], **warmup
                    )
                    rounds[name].append(us)
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"
                del ready[name]
    _record_steady(result, list(ready), rounds, per_token)
    if result["train_ms_per_step"] is not None:
        _record_training(result, list(ready), _peaks(subject, ready, skipped))
    result["skipped"] = skipped
    _record_accounting(result, accounts)


def _first_calls(
    subject: Subject, progress: Progress, skip: tuple[str, ...], skipped: dict[str, str]
) -> tuple[dict[str, GraphAccount], dict[str, Built]]:
    """Builds each variant not skipped and makes its first call, recording a compiled one's accounting;
    returns the accounts and the built variants, and adds to `skipped` why each other variant is not run."""
    accounts: dict[str, GraphAccount] = {}
    ready: dict[str, Built] = {}
    for variant in VARIANTS:
        reason = _skip_reason(subject, variant, skip)
        if reason is not None:
            skipped[variant.name] = reason
            continue
        try:
            progress(f"first call of {variant.name} (graphs, recompiles, fallbacks)")
            built = subject.build(variant)
            if variant.compiled:
                accounts[variant.name] = _first_call_account(built)
            ready[variant.name] = built
        except VariantUnavailable as exc:
            skipped[variant.name] = str(exc)
        except Exception as exc:  # one variant failing to run must not hide the others' figures
            skipped[variant.name] = f"{type(exc).__name__}: {exc}"
    return accounts, ready


def _skip_reason(subject: Subject, variant: Variant, skip: tuple[str, ...]) -> str | None:
    """Returns why this run leaves the variant out, or None where it runs."""
    if variant.name in skip:
        return "left out of this run by --skip"
    if variant.name == "per_block" and not subject.options.hierarchical:
        return "the rewrite verified is the per-block form"
    if variant.name == "regional_bypass" and isinstance(subject.spec, GenerateSpec):
        # The decoder layers take the KV cache, an argument the dispatcher never keys on, so every
        # call takes the guarded path: the variant would time "regional" a second time.
        return "not run with --workload generate: the KV cache is never bypassed"
    return None


def _first_call_account(built: Built) -> GraphAccount:
    """Makes the first call of a compiled variant and returns Dynamo's accounting of it."""
    # The whole run, workloads included: a second call with a filled cache can recompile.
    with recording() as account:
        call(built)
    note_owners(account, built.model)
    return account


def _record_steady(
    result: dict[str, Any],
    ready: list[str],
    rounds: dict[str, list[float]],
    per_token: dict[str, list[float]],
) -> None:
    """Records the median of each variant's steady rounds, their spread and the median time per token."""
    steady: dict[str, float | None] = dict.fromkeys(v.name for v in VARIANTS)
    for name in ready:
        steady[name] = statistics.median(rounds[name])
        result["steady_spread_us"][name] = {
            "min": min(rounds[name]),
            "median": steady[name],
            "max": max(rounds[name]),
        }
        if per_token[name]:
            result["decode_ms_per_token"][name] = statistics.median(per_token[name])
    result["steady_us"] = steady


def _peaks(subject: Subject, ready: dict[str, Built], skipped: dict[str, str]) -> dict[str, int]:
    """Runs each variant's training workload `PEAK_ROUNDS` times more, in turn and untimed, and returns the
    least memory a run took above what was in use before it; a variant that fails goes to `skipped`.

    Every run computes the same, so what one run takes above the least is a one-time cost, not the steps'.
    The timed rounds are over: a CPU's measure profiles the run (`memory.peak_memory`)."""
    runs: dict[str, list[int]] = {}
    for _ in range(PEAK_ROUNDS):
        for name, built in list(ready.items()):
            peak: dict[str, int] = {}
            try:
                with peak_memory(subject.device, peak, name):
                    call(built)
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"
                del ready[name]
            runs.setdefault(name, []).extend(peak.values())
    return {name: min(values) for name, values in runs.items() if name in ready and values}


def _record_training(result: dict[str, Any], ready: list[str], peaks: dict[str, int]) -> None:
    """Records each variant's time a training step, from its steady time of a run, and its peak memory."""
    steps = result["workload"]["steps"]
    for name in ready:
        result["train_ms_per_step"][name] = result["steady_us"][name] / steps / 1000
    result["peak_step_bytes"].update(peaks)


def _record_accounting(result: dict[str, Any], accounts: dict[str, GraphAccount]) -> None:
    """Records each compiled variant's accounting, its counts one key each, and whether a rewrite fell
    back to eager."""
    result["accounting"] = {name: account.to_json() for name, account in accounts.items()}
    for key, attribute in (
        ("graphs", "graphs"),
        ("frames", "frames"),
        ("recompiles", "recompiles"),
        ("graph_breaks", "graph_breaks"),
    ):
        result[key] = {name: getattr(account, attribute) for name, account in accounts.items()}
    regional = [accounts[v.name] for v in VARIANTS if v.rewrite is not None and v.name in accounts]
    result["fell_back_to_eager"] = any(account.fell_back_to_eager for account in regional)
