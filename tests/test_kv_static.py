"""Blocks that update a transformers `StaticCache` (what `generate(cache_implementation="static")` makes, and
transformers' documented way to serve compiled): each block a region that takes its layer's tensors, which
transformers' own update writes in place, so one trace serves every layer. On a layer's first update the
region sets up a stand-in, and the layer is set up from what it left, outside the region."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from runtime_support import runtime_of

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from kv_support import rewritten  # noqa: E402
from test_kv_regions import READS_THE_LAYER, TWICE, against_twin, pair  # noqa: E402
from test_torch_features import PER_BLOCK, without_reuse  # noqa: E402, F401
from torch_support import needs_reuse, stand_in_gpu  # noqa: E402
from transformers.cache_utils import DynamicCache, StaticCache, StaticLayer  # noqa: E402
from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: E402

from regionalize.bench.accounting import recording, served_forms  # noqa: E402
from regionalize.bench.served import PROMPT, STATIC  # noqa: E402
from regionalize.runtime.nested import has_region_reuse  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402

DEPTH = 6  # the depth of test_kv_regions' decoder
STATIC_FORM = f"{STATIC}: this torch does not reuse a traced region"
PROMPT_FORM = f"{PROMPT}: this torch does not reuse a traced region"


def static_cache(early: bool = False) -> StaticCache:
    """A StaticCache for test_kv_regions' decoder (batch 2, one head of 8); set up ahead of its first
    update where `early`, as transformers advises for a cache made outside `generate`."""
    cache = StaticCache(config=transformers.LlamaConfig(num_hidden_layers=DEPTH), max_cache_len=16)
    if early:
        cache.early_initialization(batch_size=2, num_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
    return cache


@needs_reuse
@pytest.mark.parametrize("early", [False, True], ids=["lazy", "early"])
def test_one_trace_serves_every_layer_and_the_cache_holds_the_originals(early: bool) -> None:
    """A prompt, then tokens: the cache holds what the original's does, every attribute of every layer,
    whether its layers are set up by their first update (in the region) or ahead of it."""
    model, twin = pair()
    account = against_twin(model, twin, lambda: static_cache(early))
    assert served_forms(model) == {"Decoder": "whole"}
    # The prompt (which sets the layers up, unless set up early) and the tokens: one trace each.
    assert account.regions_traced == 2 and account.regions_stamped == 2 * (DEPTH - 1)
    assert account.graph_breaks == 0 and not account.fell_back_to_eager


@pytest.mark.usefixtures("without_reuse")
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_without_reuse_each_block_is_one_frame_a_call_that_writes_the_cache(backend: str) -> None:
    """Where torch reuses no traced region the blocks are compiled one by one, a block and its cache's
    update one frame, shared by every layer: with Inductor too, whose owner is otherwise compiled in pieces
    (in pieces a StaticCache started and decoded later: docs/form-torch-versions.md)."""
    model, twin = pair(options=Options(backend=backend))
    account = against_twin(model, twin, static_cache)
    assert served_forms(model) == {"Decoder": STATIC_FORM if backend == "inductor" else PER_BLOCK}
    assert account.graph_breaks == 0 and account.graphs <= 2 and not account.fell_back_to_eager
    assert all(type(layer.__dict__["_regionalize_layer"]) is int for layer in model.layers)


@needs_reuse
def test_a_static_cache_that_transformers_changed_is_traced_layer_by_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers' update is checked once, eagerly, against what the regions assume (the layer's tensors
    written in place): one that rebinds them is not stood in for, and its blocks are traced in the
    owner's frame, with the original's results."""
    model, twin = pair()
    check = runtime_of(model).check_static
    assert check()
    plain_update = StaticLayer.update

    def rebinding(self: Any, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
        keys, values = plain_update(self, key_states, value_states, *args, **kwargs)
        self.keys, self.values = keys.clone(), values.clone()
        return keys, values

    monkeypatch.setattr(StaticLayer, "update", rebinding)
    assert not check()
    model, twin = pair()
    account = against_twin(model, twin, static_cache)
    assert account.regions_traced == 0 and served_forms(model) == {"Decoder": "whole"}


# A StaticCache cannot take its own keys as new ones (`index_copy_` from itself), as TWICE hands them.
WRITES_TWICE = TWICE.replace(
    "            k, v = past_key_values.update(k, v, self.layer_idx)\n",
    "            past_key_values.update(k, v, self.layer_idx)\n",
    1,
).replace(
    "update(k, v, self.layer_idx)\n        return",
    "update(k * 2, v * 2, self.layer_idx)\n        return",
)


@needs_reuse
@pytest.mark.parametrize("body", [WRITES_TWICE, READS_THE_LAYER], ids=["updates-twice", "reads-cache-layers"])
def test_a_block_that_fails_with_the_stand_in_has_its_static_cache_traced_layer_by_layer(body: str) -> None:
    """The stand-in for a StaticCache has its update and nothing else of a cache: a block that reads more,
    or updates it twice, fails while the owner is traced, before anything ran, and its cache is traced
    layer by layer, as a full compile would."""
    model, twin = pair(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        account = against_twin(model, twin, static_cache, lengths=(5, 1, 1))
    assert served_forms(model)["Decoder"].startswith("whole, caches traced layer by layer")
    assert account.regions_stamped == 0 and not account.fell_back_to_eager


@pytest.mark.parametrize("reuse", [True, False], ids=["regions reused", "no reuse"])
def test_in_cuda_graphs_a_static_cache_is_stood_in_for_where_torch_reuses_regions(
    reuse: bool, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner compiled whole in CUDA graphs (the GPU stood for by the CPU), handed a StaticCache set up
    ahead: its layers are stood in for where torch reuses a traced region; where it reuses none (2.11), they
    are traced as they are, the owner compiled in pieces, as a stand-in traced for every layer cost more
    (on an H200, a 32-layer Llama's first generate: 47 s against 26 s)."""
    if reuse and not has_region_reuse():
        pytest.skip("this torch does not reuse a traced region")
    if not reuse:
        request.getfixturevalue("without_reuse")
    model, twin = pair(options=Options(mode="reduce-overhead"))
    stand_in_gpu(monkeypatch, runtime_of(model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA graphs skipped: the tensors are the CPU's
        account = against_twin(model, twin, lambda: static_cache(early=True), lengths=(5, 1, 1))
    whole = "whole" if reuse else "whole, in pieces (6 a call, 2 compiled in all)"
    assert served_forms(model)["Decoder"].startswith(whole) and not account.fell_back_to_eager
    if reuse:
        assert account.regions_traced == 2 and account.regions_stamped == 2 * (DEPTH - 1)
    else:
        assert not account.regions_traced  # none, or (2.11) none counted


def llama_pair(options: Options) -> tuple[Any, Any]:
    from transformers.models.llama import modeling_llama

    module, _ = rewritten(modeling_llama, options)
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
    return model, twin


SETTINGS = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}


def generated() -> tuple[Any, Any]:
    """transformers' own static-cache path, `generate(cache_implementation="static")`, twice, on a rewritten
    Llama: asserts the original's tokens, no graph break and no eager fallback; the model and the account."""
    model, twin = llama_pair(Options(backend="aot_eager"))
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = twin.generate(ids, attention_mask=torch.ones_like(ids), **SETTINGS)
        with recording() as account:
            actual = model.generate(ids, attention_mask=torch.ones_like(ids), **SETTINGS)
            again = model.generate(ids, attention_mask=torch.ones_like(ids), **SETTINGS)
    assert actual.tolist() == expected.tolist() == again.tolist()
    assert account.graph_breaks == 0 and not account.fell_back_to_eager
    return model, account


@needs_reuse
def test_transformers_llama_generates_the_originals_tokens_from_one_traced_layer_static() -> None:
    model, account = generated()
    assert served_forms(model) == {"LlamaModel": "whole"}
    assert account.regions_traced == 2 and account.regions_stamped == 2 * 3


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_transformers_llama_generates_the_originals_tokens_with_a_static_cache() -> None:
    model, account = generated()
    assert served_forms(model) == {"LlamaModel": PER_BLOCK} and account.graphs <= 2


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_an_owner_in_pieces_keeps_them_for_a_growing_cache() -> None:
    """One model, handed a StaticCache and then a DynamicCache: the first per block, the second's tokens in
    pieces (its prompt per block), each with the original's outputs and cache."""
    model, twin = pair(options=Options())
    against_twin(model, twin, static_cache, lengths=(5, 1, 1))
    account = against_twin(model, twin)
    pieces = "whole, in pieces (6 a call, 1 compiled in all)"
    assert served_forms(model) == {"Decoder": f"{pieces}; {STATIC}; {PROMPT_FORM}"}
    assert not account.fell_back_to_eager


@pytest.mark.usefixtures("without_reuse")
@pytest.mark.parametrize("body", [WRITES_TWICE, READS_THE_LAYER], ids=["updates-twice", "reads-cache-layers"])
def test_without_reuse_a_static_cache_the_stand_in_cannot_serve_is_served_in_pieces(body: str) -> None:
    """The first call, per block, finds that the stand-in cannot serve the block (its frame fails to
    compile before it ran anything, and the block runs compiled as it is); from then on such calls are
    compiled in pieces, where the block is traced as it is, not a frame for each layer."""
    model, twin = pair(body, options=Options())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        account = against_twin(model, twin, static_cache, lengths=(5, 1, 1))
    assert all(layer.__dict__["_regionalize_layer"] is False for layer in model.layers)
    assert served_forms(model)["Decoder"].startswith("whole, in pieces")
    assert not account.fell_back_to_eager


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_generates_own_compile_traces_no_graph_of_two_layers() -> None:
    """`generate` compiles the forward itself for a static cache (on CPU too where `CompileConfig` says so).
    Around an owner in pieces that compile traced every layer into one graph, a full compile's start (on an
    H200 68.4 s, against 13.0 s per block); served per block, no graph it traces holds two layers'
    attention. The original's tokens, twice."""
    from transformers import CompileConfig

    model, twin = llama_pair(Options())
    layers: list[int] = []

    def backend(gm: Any, inputs: Any, **_: Any) -> Any:  # records what was traced, runs it as it is
        layers.append(sum("scaled_dot_product_attention" in str(node.target) for node in gm.graph.nodes))
        return gm.forward

    config = CompileConfig(backend=backend, mode=None)
    config._compile_all_devices = True
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = twin.generate(ids, attention_mask=torch.ones_like(ids), **SETTINGS)
        with recording() as account:
            actual = [
                model.generate(ids, attention_mask=torch.ones_like(ids), compile_config=config, **SETTINGS)
                for _ in range(2)
            ]
    assert actual[0].tolist() == actual[1].tolist() == expected.tolist()
    assert layers and max(layers) == 1 and not account.fell_back_to_eager
    assert served_forms(model) == {"LlamaModel": STATIC_FORM}


def test_a_cuda_graph_takes_a_static_cache_once_every_layer_is_set_up_at_static_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The capture conditions for a call handed a StaticCache, the GPU stood for by the CPU: not on the
    prompt, whose layers the call sets up (their tensors would be made inside the graph and overwritten by
    the next replay); once they are set up outside a compile (transformers marks their addresses static);
    not where a layer holds a tensor at an unmarked address, nor for another cache."""
    model, _ = pair()
    runtime = runtime_of(model)
    monkeypatch.setattr(runtime.process, "static_stand_ins", runtime.check_static())
    cache = static_cache(early=True)
    assert not runtime.is_static_graphable(cache)  # on the CPU: no CUDA graph
    runtime.patch(monkeypatch, "is_on_graph_device", lambda tensor: True)
    assert runtime.is_static_graphable(cache)
    assert not runtime.is_static_graphable(static_cache())  # the prompt sets its layers up
    cache.layers[3].keys = cache.layers[3].keys.clone()
    assert not runtime.is_static_graphable(cache)
    assert not runtime.is_static_graphable(DynamicCache())


def test_in_cuda_graphs_generates_own_compile_leaves_every_token_to_the_owners_graphed_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers' documented GPU path: `generate(cache_implementation="static")` compiles the forward
    itself (here on CPU too, CUDA tensors stood in for). Its compile breaks at the owner, which reads its
    graphs' conditions as it is called: every token after the prompt reaches the owner's graphed frame,
    with the original's tokens. Traced through instead (before runtime 14), the conditions were read in
    that compile's trace, came out false, and every token took the per-block path."""
    model, twin = llama_pair(Options(mode="reduce-overhead"))
    runtime = runtime_of(model)
    stand_in_gpu(monkeypatch, runtime)
    graphed: list[int] = []
    run_compiled = runtime.run_compiled

    def counted_run(owner: Any, state: Any, whole: Any, *rest: Any) -> Any:
        graphed.append(1)
        return run_compiled(owner, state, whole, *rest)

    runtime.patch(monkeypatch, "run_compiled", counted_run)
    config = transformers.CompileConfig(backend="aot_eager")
    config._compile_all_devices = True  # generate compiles only on a GPU otherwise
    model.generation_config.compile_config = config
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA graphs skipped: the tensors are the CPU's
        expected = twin.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)
        actual = model.generate(ids, attention_mask=mask, **SETTINGS)
    assert actual.tolist() == expected.tolist()
    assert len(graphed) == SETTINGS["max_new_tokens"] - 1


def test_outputs_of_a_cuda_graph_are_copies_but_the_callers_cache() -> None:
    """A replay writes its outputs' memory again: the caller keeps copies of tensors and of objects the
    call made, but the cache it handed in is its own, written in place as the original writes it."""
    model, _ = pair()
    kept = runtime_of(model).keep_outputs
    cache, made, hidden = static_cache(early=True), DynamicCache(), torch.ones(2)
    out = kept(BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache), (), {"cache": cache})
    assert out.past_key_values is cache
    assert out.last_hidden_state is not hidden and torch.equal(out.last_hidden_state, hidden)
    assert kept(made, (), {"cache": cache}) is not made


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_transformers_llama_generates_the_originals_tokens_with_a_static_cache(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU, transformers' own path (`generate(cache_implementation="static")`, which there compiles
    the forward itself): the original's tokens, twice. In CUDA graphs every call after the prompt's (which
    sets the cache's layers up) reaches the owner's graphed frame, and no graph is skipped."""
    model, twin = llama_pair(Options(mode=mode))
    model, twin = model.cuda(), twin.cuda()
    graphed: list[int] = []
    owner = model.model
    runtime = runtime_of(model)
    run_compiled = runtime.run_compiled

    def counted_run(owner: Any, state: Any, whole: Any, *rest: Any) -> Any:
        graphed.append(1)
        return run_compiled(owner, state, whole, *rest)

    runtime.patch(monkeypatch, "run_compiled", counted_run)
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0)).cuda()
    mask = torch.ones_like(ids)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = twin.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)
        actual = model.generate(ids, attention_mask=mask, **SETTINGS)
        again = model.generate(ids, attention_mask=mask, **SETTINGS)
    assert actual.tolist() == expected.tolist() == again.tolist()
    assert not [str(w.message) for w in caught if str(w.message).startswith("regionalize")]
    assert owner.__dict__["_regionalize_owner"].report.plan.form.name != "per block" or mode == "default"
    if mode == "reduce-overhead":
        assert len(graphed) == 2 * (SETTINGS["max_new_tokens"] - 1)
