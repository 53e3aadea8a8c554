"""Decoder layers that update a transformers `EncoderDecoderCache` (BART, T5, Whisper, Marian...), in the
default form: on the call that writes its cross-attention keys, each layer is a region that takes its
self-attention keys and values and returns the new ones and the cross-attention ones; the cache is
written, and the layer's flag set, outside it. One trace serves every layer; the later calls, which read
the cross-attention keys, are traced layer by layer. What the cache holds afterwards is what the
original's holds.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from kv_support import attributes, load, rewritten  # noqa: E402
from torch_support import needs_reuse  # noqa: E402
from transformers.cache_utils import DynamicCache, EncoderDecoderCache  # noqa: E402

from regionalize.bench.accounting import recording, served_forms  # noqa: E402
from regionalize.codemod import transform_source  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402

# As BART's attention: self- and cross-attention in one class, the cross keys written by the first call and
# read by the others.
SOURCE = """
import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache


class Attention(nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, key_value_states=None, past_key_values=None):
        cross = key_value_states is not None
        is_updated = False
        cache = past_key_values
        if past_key_values is not None and isinstance(past_key_values, EncoderDecoderCache):
            is_updated = past_key_values.is_updated.get(self.layer_idx)
            cache = past_key_values.cross_attention_cache if cross else past_key_values.self_attention_cache
        if cross and past_key_values is not None and is_updated:
            k = cache.layers[self.layer_idx].keys
            v = cache.layers[self.layer_idx].values
        else:
            source = key_value_states if cross else x
            k, v = self.k(source)[:, None], self.v(source)[:, None]
            if past_key_values is not None:
                k, v = cache.update(k, v, self.layer_idx)
                if cross:
                    past_key_values.is_updated[self.layer_idx] = True
        weights = torch.softmax(self.q(x)[:, None] @ k.transpose(-1, -2), dim=-1)
        return x + (weights @ v)[:, 0]


class Block(nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.self_attn = Attention(d, layer_idx)
        self.cross_attn = Attention(d, layer_idx)
        self.mlp = nn.Linear(d, d)

    def forward(self, x, memory, past_key_values=None):
        x = self.self_attn(x, past_key_values=past_key_values)
        x = self.cross_attn(x, key_value_states=memory, past_key_values=past_key_values)
        return self.mlp(x).tanh()


class Decoder(nn.Module):
    def __init__(self, d=8, depth=6):
        super().__init__()
        self.layers = nn.ModuleList([Block(d, i) for i in range(depth)])

    def forward(self, x, memory, past_key_values=None):
        for layer in self.layers:
            x = layer(x, memory, past_key_values)
        return x
"""


def pair(source: str = SOURCE) -> tuple[Any, Any]:
    """The rewritten decoder and the original with the same weights."""
    code = transform_source(source, Options(backend="aot_eager")).code
    assert 'cache_index="layer_idx"' in code
    torch.manual_seed(0)
    model = load(code).Decoder().eval()
    twin = load(source).Decoder().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def steps(model: Any, cache: EncoderDecoderCache, lengths: tuple[int, ...] = (5, 1, 1, 1)) -> list[Any]:
    """A prompt, then one token at a time, with the one cache and the one encoder output."""
    generator = torch.Generator().manual_seed(1)
    memory = torch.randn(2, 7, 8, generator=generator)
    with torch.no_grad():
        return [model(torch.randn(2, n, 8, generator=generator), memory, cache) for n in lengths]


def held(cache: EncoderDecoderCache) -> list[Any]:
    """Per layer of either cache: its keys, its values and every other attribute; and the flags."""
    layers = [*cache.self_attention_cache.layers, *cache.cross_attention_cache.layers]
    return [(layer.keys, layer.values, attributes(layer)) for layer in layers] + [cache.is_updated]


@needs_reuse
def test_one_trace_serves_every_layer_and_the_caches_hold_the_originals() -> None:
    """The prompt writes the cross-attention keys: one region, traced once and stamped out for the other
    five layers. The tokens read them: traced layer by layer, without regions, in one frame for them all
    (the self-attention cache's length marked dynamic from the first)."""
    model, twin = pair()
    expected_cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    expected = steps(twin, expected_cache)
    with recording() as account:
        actual = steps(model, cache)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(held(cache), held(expected_cache), strict=True):
        if isinstance(want, dict):
            assert got == want
        else:
            torch.testing.assert_close(got[:2], want[:2])
            assert got[2] == want[2]
    assert served_forms(model) == {"Decoder": "whole"} and not account.fell_back_to_eager
    assert account.regions_traced == 1 and account.regions_stamped == 5 and account.recompiles == 1


OTHER_LAYER = SOURCE.replace(
    "is_updated = past_key_values.is_updated.get(self.layer_idx)",
    "is_updated = past_key_values.is_updated.get(self.layer_idx - 1)",
)


# The flag set through another per-block integer than the one the updates take.
OTHER_INDEX = SOURCE.replace(
    "        self.layer_idx = layer_idx\n",
    "        self.layer_idx = layer_idx\n        self.flag_idx = layer_idx\n",
).replace(
    "past_key_values.is_updated[self.layer_idx] = True", "past_key_values.is_updated[self.flag_idx] = True"
)


def test_a_block_indexing_its_cache_by_another_attribute_is_compiled_without_regions() -> None:
    """The stand-in would set the flag of the block's own layer whatever index it is handed."""
    assert "is_updated[self.flag_idx]" in OTHER_INDEX
    code = transform_source(OTHER_INDEX, Options(backend="aot_eager")).code
    assert "__setitem__(self.flag_idx, True)" in code
    assert "owner=self, nested=False" in code


def test_a_block_reading_another_layers_flag_is_compiled_without_regions() -> None:
    """A stand-in answers for the block's own layer whatever index it is handed, so a block that indexes
    its cache by anything but its own integer gets none: the owner is compiled whole without regions."""
    code = transform_source(OTHER_LAYER, Options(backend="aot_eager")).code
    assert "owner=self, nested=False" in code


@needs_reuse
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_transformers_encoder_decoders_generate_the_originals_tokens_from_one_traced_layer(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BART's and T5's decoder layers, generating with transformers' own `EncoderDecoderCache`: on the
    prompt one region is traced and stamped out for the other layers, as for the encoder's. T5 also asks
    the cache its length (`get_seq_length(self.layer_idx)`); its first layer computes the position bias
    the others are handed, so it has regions of its own; its layers return that bias, a region's input, and
    the region returns a copy of it, traced once (no retry with every output copied); and its encoder and
    decoder stacks, one class, still compile the decoder with the cache length symbolic (else it
    recompiles every token)."""
    import importlib

    # What is traced is counted: a frame an earlier run saved would load with nothing traced.
    monkeypatch.setenv("REGIONALIZE_SAVED_OWNERS", "0")
    original = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    module, _ = rewritten(original)
    if family == "bart":
        config = transformers.BartConfig(
            vocab_size=128, d_model=32, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, forced_eos_token_id=None,
        )  # fmt: skip
        name, traced, stamped = "BartForConditionalGeneration", 1 + 1, 3 + 3
    else:
        config = transformers.T5Config(
            vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=4, num_heads=4, decoder_start_token_id=0
        )
        name, traced, stamped = "T5ForConditionalGeneration", 2 + 2, 2 + 2
    torch.manual_seed(0)
    model = getattr(module, name)(config).eval()
    twin = getattr(original, name)(config).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    expected = twin.generate(ids, **settings)
    with recording() as account:
        actual = model.generate(ids, **settings)
    assert actual.tolist() == expected.tolist()
    assert not account.fell_back_to_eager and "whole" in set(served_forms(model).values())
    assert (account.regions_traced, account.regions_stamped) == (traced, stamped)
