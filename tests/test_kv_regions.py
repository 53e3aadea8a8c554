"""Blocks that update a transformers `DynamicCache`, in the default form: each block a region that takes its
layer's keys and values and returns the new ones, the cache written outside it. One trace serves every
layer, and what the cache holds afterwards is what the original's holds.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from runtime_support import runtime_of

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from kv_support import attributes, load, rewritten  # noqa: E402
from torch_support import needs_reuse  # noqa: E402
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402

from regionalize.bench.accounting import recording, served_forms  # noqa: E402
from regionalize.codemod import transform_source  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402

SOURCE = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)

    def forward(self, x, past_key_values=None):
        k, v = self.k(x)[:, None], self.v(x)[:, None]
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        return x + (k.mean(dim=-2) * v.mean(dim=-2))

    UPDATE_TWICE


class Block(nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.attn = Attention(d, layer_idx)
        self.mlp = nn.Linear(d, d)

    def forward(self, x, past_key_values=None):
        return self.mlp(self.attn(x, past_key_values=past_key_values)).tanh()


class Decoder(nn.Module):
    def __init__(self, d=8, depth=6):
        super().__init__()
        self.layers = nn.ModuleList([Block(d, i) for i in range(depth)])

    def forward(self, x, past_key_values=None):
        for layer in self.layers:
            x = layer(x, past_key_values)
        return x
"""
TWICE = """
    def forward(self, x, past_key_values=None):
        k, v = self.k(x)[:, None], self.v(x)[:, None]
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
            k, v = past_key_values.update(k, v, self.layer_idx)
        return x + (k.mean(dim=-2) * v.mean(dim=-2))
"""


def pair(body: str = "", source: str = SOURCE, options: Options | None = None) -> tuple[Any, Any]:
    """The rewritten decoder and the original with the same weights, the attention's forward `body`."""
    source = source.replace("    UPDATE_TWICE\n", body)
    rewritten = transform_source(source, options or Options(backend="aot_eager")).code
    assert 'owner=self, cache_index="layer_idx"' in rewritten
    torch.manual_seed(0)
    model = load(rewritten).Decoder().eval()
    twin = load(source).Decoder().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def sliding(depth: int, window: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [DynamicSlidingWindowLayer(sliding_window=window) for _ in range(depth)]
    cache.layer_class_to_replicate = None
    return cache


def steps(model: Any, cache: DynamicCache, lengths: tuple[int, ...] = (5, 1, 1, 1)) -> list[Any]:
    """A prompt, then one token at a time, with the one cache."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return [model(torch.randn(2, n, 8, generator=generator), cache) for n in lengths]


def held(cache: DynamicCache) -> list[tuple[Any, ...]]:
    """Per layer: its keys, its values, its length, and every other attribute it holds."""
    return [(layer.keys, layer.values, layer.get_seq_length(), attributes(layer)) for layer in cache.layers]


def against_twin(
    model: Any, twin: Any, make: Any = DynamicCache, lengths: tuple[int, ...] = (5, 1, 1, 1)
) -> Any:
    """`steps` of `model` and of its `twin`, each with a fresh cache from `make`: asserts equal outputs and
    caches that hold the same (every attribute of every layer); returns the model's accounting."""
    expected_cache, cache = make(), make()
    expected = steps(twin, expected_cache, lengths)
    with recording() as account:
        actual = steps(model, cache, lengths)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(held(cache), held(expected_cache), strict=True):
        torch.testing.assert_close(got[:2], want[:2])
        assert got[2:] == want[2:]
    return account


def test_a_dynamic_caches_length_is_marked_dynamic_once_it_holds_keys() -> None:
    """What the owner marks before compiling a call: nothing without a `DynamicCache` (and it stops
    looking), while its layers hold nothing (the prompt) or one token each; then the length of every layer's
    keys and values (an `EncoderDecoderCache`'s own, not its cross-attention's) and the last size of a
    tensor argument one longer than them (the attention mask), and nothing else."""
    from transformers.cache_utils import EncoderDecoderCache, StaticCache

    from regionalize.runtime.kv import Handed, mark_kv_growing

    def marked(tensor: Any) -> set[int]:
        return set(getattr(tensor, "_dynamo_weak_dynamic_indices", ()))

    new = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4)  # a layer's first keys and values, 5 long
    assert mark_kv_growing((torch.zeros(3),), {"past_key_values": None}) is Handed.NONE
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2)
    assert mark_kv_growing((), {"cache": StaticCache(config=config, max_cache_len=4)}) is Handed.NONE
    cache = DynamicCache()
    assert mark_kv_growing((), {"past_key_values": cache}) is Handed.EMPTY
    one = DynamicCache()
    one.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
    assert mark_kv_growing((), {"past_key_values": one}) is Handed.ONE
    assert not marked(one.layers[0].keys)
    cache.update(*new, 0)
    mask, positions, ids = torch.ones(1, 6), torch.zeros(1, 1), torch.zeros(1, 1)
    assert mark_kv_growing((cache, ids), {"attention_mask": mask, "position_ids": positions}) is Handed.MARKED
    assert marked(cache.layers[0].keys) == marked(cache.layers[0].values) == {2}
    assert marked(mask) == {1} and not marked(positions) and not marked(ids)  # the mask: one token longer
    own, cross = DynamicCache(), DynamicCache()
    own.update(*new, 0)
    cross.update(*new, 0)
    assert mark_kv_growing((), {"past_key_values": EncoderDecoderCache(own, cross)}) is Handed.MARKED
    assert marked(own.layers[0].keys) == {2} and not marked(cross.layers[0].keys)


# As older transformers layers return `(hidden_states, None)`.
RETURNING_NONE = SOURCE.replace(
    "return self.mlp(self.attn(x, past_key_values=past_key_values)).tanh()",
    "return self.mlp(self.attn(x, past_key_values=past_key_values)).tanh(), None",
).replace(
    "x = layer(x, past_key_values)",
    "x, nothing = layer(x, past_key_values)\n            assert nothing is None",
)

# As GPT-NeoX, Bloom, Falcon and GPT-J name the cache a layer takes.
LAYER_PAST = (
    SOURCE.replace("past_key_values=past_key_values", "layer_past=past_key_values")
    .replace(
        "def forward(self, x, past_key_values=None):\n        return self.mlp",
        "def forward(self, x, layer_past=None):\n        return self.mlp",
    )
    .replace("self.attn(x, layer_past=past_key_values)", "self.attn(x, past_key_values=layer_past)")
    .replace("x = layer(x, past_key_values)", "x = layer(x, layer_past=past_key_values)")
)


@needs_reuse
@pytest.mark.parametrize(
    "source",
    [SOURCE, RETURNING_NONE, LAYER_PAST],
    ids=["a tensor", "a tuple holding None", "a cache named layer_past"],
)
@pytest.mark.parametrize("make", [DynamicCache, lambda: sliding(6, 3)], ids=["dynamic", "sliding"])
def test_one_trace_serves_every_layer_and_the_cache_holds_the_originals(make: Any, source: str) -> None:
    """Whether the block returns a tensor or a tuple holding None (which comes back beside the keys and
    values the region returns), and whatever the block calls the parameter that takes the cache."""
    model, twin = pair(source=source)
    account = against_twin(model, twin, make)
    assert served_forms(model) == {"Decoder": "whole"}
    # The prompt, then the tokens, the cache's length symbolic from the first (marked so): a trace each.
    assert account.regions_traced == 2 and account.regions_stamped == 2 * 5
    assert account.recompiles == 1
    assert not account.fell_back_to_eager


@needs_reuse
def test_a_call_whose_cache_holds_one_token_runs_uncompiled() -> None:
    """A prompt of one token (an encoder-decoder's decoder starts so): the next call's cache holds one token,
    a size Dynamo specializes, so it runs as the original does and the call after it compiles the frame
    that serves every later token, in this sequence and the next."""
    model, twin = pair()
    lengths = (1, 1, 1, 1, 1)
    expected = steps(twin, DynamicCache(), lengths) + steps(twin, DynamicCache(), lengths)
    with recording() as account:
        actual = steps(model, DynamicCache(), lengths) + steps(model, DynamicCache(), lengths)
    torch.testing.assert_close(actual, expected)
    assert served_forms(model) == {"Decoder": "whole"}
    assert account.regions_traced == 2 and account.recompiles == 1
    assert not account.fell_back_to_eager


@needs_reuse
def test_without_a_cache_the_blocks_are_plain_regions() -> None:
    model, twin = pair()
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), recording() as account:
        torch.testing.assert_close(model(x), twin(x))
    assert account.regions_traced == 1 and account.regions_stamped == 5


# As BART's encoder layers: no cache to take, but the attention class its decoder layers update one with.
ENCODER = (
    SOURCE.replace(
        "def forward(self, x, past_key_values=None):\n        return self.mlp",
        "def forward(self, x):\n        return self.mlp",
    )
    .replace("self.attn(x, past_key_values=past_key_values)", "self.attn(x)")
    .replace("x = layer(x, past_key_values)", "x = layer(x)")
)


@needs_reuse
def test_blocks_of_a_class_that_updates_a_cache_are_regions_on_calls_without_one() -> None:
    model, twin = pair(source=ENCODER)
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), recording() as account:
        torch.testing.assert_close(model(x), twin(x))
    assert account.regions_traced == 1 and account.regions_stamped == 5
    assert served_forms(model) == {"Decoder": "whole"}


@needs_reuse
def test_a_cache_that_transformers_changed_is_traced_layer_by_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache layers' update is checked once against what the regions assume; a transformers whose
    layers keep something else is not stood in for, and the blocks are traced in the owner's frame."""
    model, twin = pair()
    check = runtime_of(model).check_kv
    assert check()
    plain_update = DynamicLayer.update

    def keeping_the_last_token(
        self: Any, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
    ) -> Any:
        keys, values = plain_update(self, key_states, value_states)
        self.keys, self.values = keys[:, :, -1:], values[:, :, -1:]
        return keys, values

    monkeypatch.setattr(DynamicLayer, "update", keeping_the_last_token)
    assert not check()
    account = against_twin(model, twin)
    assert account.regions_traced == 0 and served_forms(model) == {"Decoder": "whole"}


@needs_reuse
def test_a_layer_is_set_up_through_its_lazy_initialization_where_that_sets_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On its first update the store sets up a layer without the empty tensors that transformers joins the
    first keys to (Dynamo traced them at 11 ms a layer), where the eager check finds that this leaves the
    layer as transformers' own update does. A transformers whose `lazy_initialization` sets more has its
    layers set up through it, and they are still stood in for."""
    model, _ = pair()
    assert runtime_of(model).check_kv().__name__ == "kv_init"
    plain = DynamicLayer.lazy_initialization

    def noting_the_width(self: Any, key_states: Any, value_states: Any) -> None:
        plain(self, key_states, value_states)
        self.width = key_states.shape[-1]

    monkeypatch.setattr(DynamicLayer, "lazy_initialization", noting_the_width)
    model, twin = pair()
    assert runtime_of(model).check_kv().__name__ == "kv_lazy"
    made: list[Any] = []  # the twin's cache, then the model's
    account = against_twin(model, twin, lambda: made.append(DynamicCache()) or made[-1])
    assert all(layer.width == 8 for layer in made[1].layers)
    assert account.regions_traced == 2 and account.regions_stamped == 2 * 5


READS_THE_LAYER = """
    def forward(self, x, past_key_values=None):
        k, v = self.k(x)[:, None], self.v(x)[:, None]
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
            k = past_key_values.layers[self.layer_idx].keys
        return x + (k.mean(dim=-2) * v.mean(dim=-2))
"""


@needs_reuse
@pytest.mark.parametrize("body", [TWICE, READS_THE_LAYER], ids=["updates-twice", "reads-cache-layers"])
def test_a_block_that_fails_with_the_stand_in_has_its_cache_traced_layer_by_layer(body: str) -> None:
    """Updating the cache twice, or reading an attribute of it that the stand-in lacks, fails while the
    owner is traced, before anything ran: the owner is compiled whole again, the caches traced layer by
    layer, with no warning and the original's results."""
    model, twin = pair(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        account = against_twin(model, twin, lengths=(5, 1, 1))
    assert served_forms(model)["Decoder"].startswith("whole, caches traced layer by layer")
    # The one region traced is the failed attempt; none is stamped out.
    assert account.regions_stamped == 0 and not account.fell_back_to_eager


@pytest.mark.parametrize(
    ("test", "stand_in"),
    [
        ("isinstance(past_key_values, DynamicCache)", False),
        ("type(past_key_values) is DynamicCache", False),
        ('hasattr(past_key_values, "layers")', False),
        ('getattr(past_key_values, "layers", None)', False),
        ("not isinstance(past_key_values, (EncoderDecoderCache, StaticCache))", True),
    ],
)
def test_a_block_that_asks_its_caches_type_gets_a_stand_in_only_if_it_answers_alike(
    test: str, stand_in: bool
) -> None:
    """The stand-in for a cache layer is not a `DynamicCache`: a block that asks would take another branch,
    so the codemod leaves its owner compiled whole without regions; unless the block asks only whether
    the cache is one of transformers' other caches, which a `DynamicCache` is not either."""
    source = SOURCE.replace("    UPDATE_TWICE\n", "").replace(
        "        if past_key_values is not None:\n", f"        if past_key_values is not None and {test}:\n"
    )
    assert source.count(test) == 1
    rewritten = transform_source(source, Options()).code
    assert ('owner=self, cache_index="layer_idx")' in rewritten) == stand_in
    assert ("owner=self, nested=False)" in rewritten) != stand_in


@needs_reuse
def test_transformers_llama_generates_the_originals_tokens_from_one_traced_layer() -> None:
    from transformers.models.llama import modeling_llama

    module, _ = rewritten(modeling_llama, Options(backend="aot_eager"))
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = module.LlamaForCausalLM(config).eval()
    twin = modeling_llama.LlamaForCausalLM(config).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    expected = twin.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    with recording() as account:
        actual = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    assert actual.tolist() == expected.tolist()
    # One frame for the prompt, one that every token shares: its cache's length marked dynamic.
    assert account.regions_traced == 2 and account.regions_stamped == 2 * 3 and account.recompiles == 1
    assert served_forms(model) == {"LlamaModel": "whole"}


@needs_reuse
def test_transformers_gpt2_generates_the_originals_tokens_from_one_traced_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPT-2's attention asks whether its cache is an `EncoderDecoderCache` and reads `cache.layers[i]` on
    that path only, so its layers get the stand-in too. Its keys and values are views of one projection:
    the stand-in keeps copies, as a region's outputs must not alias each other. (With Dynamo's graph
    deduplication, which runtime 2 used, Inductor generated other tokens than eager in torch 2.13.) Saved
    owners off: the prompt's frame compiled ahead of its call would leave the steps' compile no recompile
    to count (tests/test_saved_owners.py generates with them)."""
    from transformers.models.gpt2 import modeling_gpt2

    monkeypatch.setenv("REGIONALIZE_SAVED_OWNERS", "0")
    module, code = rewritten(modeling_gpt2)
    assert 'owner=self, cache_index="layer_idx")' in code
    config = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=8, n_head=4)
    torch.manual_seed(0)
    model = module.GPT2LMHeadModel(config).eval()
    twin = modeling_gpt2.GPT2LMHeadModel(config).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = twin.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        with recording() as account:
            actual = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    assert actual.tolist() == expected.tolist()
    assert served_forms(model) == {"GPT2Model": "whole"} and not account.fell_back_to_eager
    assert account.regions_traced == 2 and account.regions_stamped == 2 * 7 and account.recompiles == 1
