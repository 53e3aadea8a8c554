"""Factories for the decoder sweep (`docs/results/decoder-sweep/sweep.toml`): the causal language models of
transformers that the example zoo leaves out, at small configs, random weights, nothing downloaded. Each
takes the model's module (original or rewritten) and builds from it.

The zoo holds the families the codemod was developed against; these were chosen after it, to show what
it does on decoders it was never tuned for: other norms and residual scalings (Granite, Cohere, OLMo2),
mixtures of experts (Mixtral, Qwen3-MoE), layers of one class that differ in structure (Qwen2-MoE's
experts on every other layer, DeepSeek-V3's dense first layers), sliding-window layers (Gemma3, SmolLM3),
and older layouts (OPT, Falcon, GPT-J, BLOOM, CodeGen).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import transformers

LAYERS = 6
_TEXT = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": LAYERS,
}
_GQA = {**_TEXT, "num_key_value_heads": 2}
_OLD = {"vocab_size": 256, "n_embd": 64, "n_layer": LAYERS, "n_head": 4}


def qwen3(m: ModuleType) -> Any:
    return m.Qwen3ForCausalLM(transformers.Qwen3Config(**_GQA)).eval()


def gemma(m: ModuleType) -> Any:
    return m.GemmaForCausalLM(transformers.GemmaConfig(**_GQA, head_dim=16)).eval()


def gemma3(m: ModuleType) -> Any:
    """Sliding-window and full-attention layers, two layer kinds in one stack."""
    config = transformers.Gemma3TextConfig(**_GQA, head_dim=16, sliding_window=8)
    return m.Gemma3ForCausalLM(config).eval()


def olmo2(m: ModuleType) -> Any:
    return m.Olmo2ForCausalLM(transformers.Olmo2Config(**_GQA)).eval()


def granite(m: ModuleType) -> Any:
    return m.GraniteForCausalLM(transformers.GraniteConfig(**_GQA)).eval()


def starcoder2(m: ModuleType) -> Any:
    return m.Starcoder2ForCausalLM(transformers.Starcoder2Config(**_GQA)).eval()


def phi(m: ModuleType) -> Any:
    return m.PhiForCausalLM(transformers.PhiConfig(**_TEXT)).eval()


def stablelm(m: ModuleType) -> Any:
    return m.StableLmForCausalLM(transformers.StableLmConfig(**_GQA)).eval()


def cohere(m: ModuleType) -> Any:
    return m.CohereForCausalLM(transformers.CohereConfig(**_GQA)).eval()


def mixtral(m: ModuleType) -> Any:
    config = transformers.MixtralConfig(**_GQA, num_local_experts=4, num_experts_per_tok=2)
    return m.MixtralForCausalLM(config).eval()


def qwen3_moe(m: ModuleType) -> Any:
    config = transformers.Qwen3MoeConfig(
        **_GQA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    )
    return m.Qwen3MoeForCausalLM(config).eval()


def qwen2_moe(m: ModuleType) -> Any:
    """Layers of one class that differ in structure: a mixture of experts on every other layer
    (`decoder_sparse_step`), a dense MLP on the rest."""
    config = transformers.Qwen2MoeConfig(
        **_GQA,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=2,
    )
    return m.Qwen2MoeForCausalLM(config).eval()


def deepseek_v3(m: ModuleType) -> Any:
    """Multi-head latent attention, and dense MLPs on the first layers before the mixtures of experts
    (`first_k_dense_replace`): one layer class of two structures."""
    config = transformers.DeepseekV3Config(
        **_GQA,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
    )
    return m.DeepseekV3ForCausalLM(config).eval()


def smollm3(m: ModuleType) -> Any:
    return m.SmolLM3ForCausalLM(transformers.SmolLM3Config(**_GQA, pad_token_id=0)).eval()


def glm(m: ModuleType) -> Any:
    return m.GlmForCausalLM(transformers.GlmConfig(**_GQA, pad_token_id=0)).eval()


def opt(m: ModuleType) -> Any:
    config = transformers.OPTConfig(
        vocab_size=256,
        hidden_size=64,
        ffn_dim=128,
        num_attention_heads=4,
        num_hidden_layers=LAYERS,
        word_embed_proj_dim=64,
    )
    return m.OPTForCausalLM(config).eval()


def falcon(m: ModuleType) -> Any:
    config = transformers.FalconConfig(
        vocab_size=256, hidden_size=64, num_attention_heads=4, num_hidden_layers=LAYERS
    )
    return m.FalconForCausalLM(config).eval()


def gptj(m: ModuleType) -> Any:
    return m.GPTJForCausalLM(transformers.GPTJConfig(**_OLD, rotary_dim=8)).eval()


def bloom(m: ModuleType) -> Any:
    config = transformers.BloomConfig(vocab_size=256, hidden_size=64, n_layer=LAYERS, n_head=4)
    return m.BloomForCausalLM(config).eval()


def codegen(m: ModuleType) -> Any:
    return m.CodeGenForCausalLM(transformers.CodeGenConfig(**_OLD, rotary_dim=8)).eval()
