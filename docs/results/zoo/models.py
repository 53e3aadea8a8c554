"""Factories for the example zoo (`docs/results/zoo/zoo.toml`): transformers models at small configs, random
weights, nothing downloaded. Each takes the model's module (original or rewritten) and builds from it.

Depths are those of real checkpoints' smaller members, widths cut so the zoo runs on a 2-core CPU.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import transformers

LAYERS = 8
_TEXT = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def _ids(length: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))


def _pixels(size: int = 64) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


# Causal language models, verified on greedy generation with a KV cache (workload = "generate").


def _causal_lm(model_class: Any, config_class: Any) -> Any:
    return model_class(config_class(**_TEXT, num_hidden_layers=LAYERS, num_key_value_heads=2)).eval()


def llama(m: ModuleType) -> Any:
    return _causal_lm(m.LlamaForCausalLM, transformers.LlamaConfig)


def mistral(m: ModuleType) -> Any:
    return _causal_lm(m.MistralForCausalLM, transformers.MistralConfig)


def qwen2(m: ModuleType) -> Any:
    return _causal_lm(m.Qwen2ForCausalLM, transformers.Qwen2Config)


def gpt_neox(m: ModuleType) -> Any:
    """Its layers take the cache as `layer_past`."""
    return _causal_lm(m.GPTNeoXForCausalLM, transformers.GPTNeoXConfig)


def gpt2(m: ModuleType) -> Any:
    return m.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=LAYERS, n_head=4)
    ).eval()


# Encoders and vision models, verified on one forward.


def bert(m: ModuleType) -> Any:
    return m.BertModel(transformers.BertConfig(**_TEXT, num_hidden_layers=LAYERS)).eval(), (_ids(),)


def roberta(m: ModuleType) -> Any:
    return m.RobertaModel(transformers.RobertaConfig(**_TEXT, num_hidden_layers=LAYERS)).eval(), (_ids(),)


def t5(m: ModuleType) -> Any:
    config = transformers.T5Config(
        vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=LAYERS // 2, num_heads=4
    )
    return m.T5Model(config).eval(), (_ids(),), {"decoder_input_ids": _ids(8)}


def bart(m: ModuleType) -> Any:
    """Its encoder layers build the attention class whose layer index its decoder layers' caches take."""
    config = transformers.BartConfig(
        vocab_size=256, d_model=64, encoder_layers=LAYERS // 2, decoder_layers=LAYERS // 2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
    )  # fmt: skip
    return m.BartModel(config).eval(), (_ids(),), {"decoder_input_ids": _ids(8)}


def modernbert(m: ModuleType) -> Any:
    """Its first layer has an `nn.Identity` where the others have a norm: they share no region."""
    ids = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "cls_token_id": 2, "sep_token_id": 1}
    config = transformers.ModernBertConfig(**_TEXT, num_hidden_layers=LAYERS, **ids)
    return m.ModernBertModel(config).eval(), (_ids(),)


def vit(m: ModuleType) -> Any:
    config = transformers.ViTConfig(
        image_size=64, patch_size=8, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_hidden_layers=LAYERS,
    )  # fmt: skip
    return m.ViTModel(config).eval(), (_pixels(),)


def dinov2(m: ModuleType) -> Any:
    config = transformers.Dinov2Config(
        image_size=64, patch_size=8, hidden_size=64, num_attention_heads=4, num_hidden_layers=LAYERS
    )
    return m.Dinov2Model(config).eval(), (_pixels(),)


def clip_vision(m: ModuleType) -> Any:
    config = transformers.CLIPVisionConfig(
        image_size=64, patch_size=8, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_hidden_layers=LAYERS,
    )  # fmt: skip
    return m.CLIPVisionModel(config).eval(), (_pixels(),)
