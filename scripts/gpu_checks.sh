#!/usr/bin/env bash
# What a session lent a GPU runs first: issue 37's benchmark, its seven variants in one sitting, then the
# tests that need CUDA. Run on the GPU machine (Python 3.12, the torch and transformers of its image, no libcst),
# one part a device call, so that a part cut short still returns what the other measured:
#
#   bash scripts/gpu_checks.sh bench   # carry [".whl", ".bench"], timeout_s 600; docs/results/serving/README.md
#   bash scripts/gpu_checks.sh bench --variants rewrite rewrite_static --add   # what a change touched
#   bash scripts/gpu_checks.sh tests   # carry [".whl"], timeout_s 300
#   bash scripts/gpu_checks.sh train   # carry [".whl"], timeout_s 600; issue 84's Llama-8B training shape
#
# Made here first: the libcst wheel in .whl/ (the device README's `pip download`, cp312) and the rewrites
# in .bench/serving (`python scripts/bench_serving.py --prepare ...`, its docstring). What each part
# writes under $OUT comes back: serving.md and serving.json (copy them into docs/results/serving/ unchanged),
# the tests' log, and train's verify report and JSON (into docs/results/train/ as gpu-llama-8b.txt and .json).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-}"
if [[ "$part" != bench && "$part" != tests && "$part" != train ]]; then
  echo "usage: bash scripts/gpu_checks.sh bench|tests|train" >&2
  exit 2
fi
out="${OUT:-/tmp/gpu-checks}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
case "$part" in
  bench)
    # Arguments after the part go to the benchmark; without any it runs the default variants, with --hot.
    (($# > 1)) || set -- bench --hot
    # The benchmark's own timeout leaves time for the copy, which runs even where it cut the run short.
    timeout "${BENCH_S:-560}" python3 scripts/bench_serving.py --rewritten-dir .bench/serving "${@:2}" 2>&1 \
      | grep -E "^==|^error|Error|Traceback" | cut -c1-1500
    status=${PIPESTATUS[0]}
    cp docs/results/serving/serving.md docs/results/serving/serving.json "$out"/
    exit "$status"
    ;;
  tests)
    # Every test that runs on CUDA where there is one (the parametrisations and names that say so).
    timeout "${TESTS_S:-270}" python3 -m pytest -q -p no:cacheprovider -n 6 -k cuda tests 2>&1 \
      | tee "$out/cuda-tests.txt" | grep -E "passed|failed|FAILED|^E " | head -40
    exit "${PIPESTATUS[0]}"
    ;;
  train)
    # Training steps of Llama-3-8B's layer shape in bf16 (scripts/train_factories.py): the first step in a
    # warm and a hot process, a step's time and peak memory, full compile against the rewrite. Arguments
    # after the part go to verify (--steps 2, say).
    timeout "${TRAIN_S:-560}" python3 -m regionalize verify transformers.models.llama.modeling_llama \
      --factory scripts/train_factories.py:llama_8b --workload train --steps 4 --device cuda \
      --starts warm,hot --repeats 1 --skip dedup --skip bypass --json "$out/gpu-llama-8b.json" -q "${@:2}" \
      2>&1 | tee "$out/gpu-llama-8b.txt" | tail -40
    exit "${PIPESTATUS[0]}"
    ;;
esac
