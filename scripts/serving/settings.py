"""What the serving benchmark runs: the rewrites, the variants, the model sizes and issue 37's targets."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "results" / "serving"
MODELING = "transformers.models.llama.modeling_llama"
LLAMA_DIR = "transformers/models/llama/"
# The rewrites of modeling_llama.py, by the codemod's Options.
REWRITES: dict[str, dict[str, str]] = {
    "default": {},
    "reduce_overhead": {"mode": "reduce-overhead"},
    "per_block": {"form": "per-block"},
}
# variant -> (rewrite or None for the original, how it is compiled, the cache `generate` uses)
VARIANTS: dict[str, tuple[str | None, str, str]] = {
    "eager": (None, "none", "dynamic"),
    "full": (None, "full", "dynamic"),
    "transformers_static": (None, "transformers", "static"),
    "rewrite": ("default", "rewrite", "dynamic"),
    "rewrite_static": ("default", "rewrite + transformers", "static"),
    "rewrite_static_cuda_graphs": ("reduce_overhead", "rewrite + transformers", "static"),
    "per_block": ("per_block", "rewrite", "dynamic"),
    "accelerate_regions": (None, "accelerate", "dynamic"),
}
# A run without --variants: issue 37's seven. The `--mode reduce-overhead` rewrite is a user's choice beside
# them (since runtime 20 the default form serves generate's static-cache calls in CUDA graphs as well);
# `--variants` names it where it is wanted.
DEFAULT_VARIANTS = [v for v in VARIANTS if v != "rewrite_static_cuda_graphs"]
# What --hot restarts, in this order after every first process: a full compile and the serving paths that
# its restart target compares with it, then transformers' own. A run cut short loses restarts, not rows.
RESTARTED = ("full", "rewrite_static", "rewrite_static_cuda_graphs", "transformers_static")
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # the prompt avoids them
LLAMA3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
}
CHECK = {  # the fp32 token check: same family, small
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
SMOKE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
TARGET_SOONER, TARGET_LIMIT = 5.0, 1.5  # issue 37's targets
TARGETS = (
    f"first generate >= {TARGET_SOONER:g}x sooner than full",
    f"decode <= {TARGET_LIMIT:g}x the memory-bound limit",
    "decode no slower than transformers_static",
    "tokens identical in fp32",
    "no eager fallback",
    "restart no later than full's",
)
