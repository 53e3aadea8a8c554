"""The owner in CUDA graphs where torch reuses no traced region (2.11): traced whole, its graph compiled in
pieces, each distinct piece once, and a call one CUDA graph. Off a GPU the capture is stood in for
(`torch_support.emulated`), and each test runs on the GPU too where there is one."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
from runtime_support import runtime_of

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_kv_static import SETTINGS, llama_pair  # noqa: E402
from test_torch_features import without_reuse  # noqa: E402, F401
from torch import nn  # noqa: E402
from torch_support import emulated, stand_in_gpu  # noqa: E402
from transformers.cache_utils import DynamicCache, StaticCache  # noqa: E402

from regionalize.bench.accounting import served_forms  # noqa: E402
from regionalize.runtime import pieces, pieces_frame  # noqa: E402
from regionalize.runtime.forms import PIECES  # noqa: E402
from regionalize.runtime.internals import compiler  # noqa: E402
from regionalize.runtime.state import Findings, Plan  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, x: Any) -> Any:
        return x + self.linear(x).tanh()


class Stack(nn.Module):
    """Blocks between an input projection and a norm, at the widths `widths` (a projection where it
    changes); adds one to `seen` where handed one, in place."""

    def __init__(self, widths: tuple[int, ...] = (8, 8, 8, 8)) -> None:
        super().__init__()
        self.inp = nn.Linear(4, widths[0])
        self.layers = nn.ModuleList(Block(d) for d in widths)
        self.ups = nn.ModuleDict(
            {str(i): nn.Linear(a, b) for i, (a, b) in enumerate(itertools.pairwise(widths)) if a != b}
        )
        self.norm = nn.LayerNorm(widths[-1])

    def forward(self, x: Any, seen: Any = None) -> Any:
        x = self.inp(x)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if str(i) in self.ups:
                x = self.ups[str(i)](x)
        if seen is not None:
            seen.add_(1)
        return self.norm(x)


@pytest.fixture(autouse=True)
def fresh() -> None:
    """Each test's compiles its own: the modules here share their code, and Dynamo's recompile limit."""
    torch.compiler.reset()


def compiled(model: nn.Module) -> tuple[Any, Findings]:
    state = Findings(Plan(PIECES))
    backend = pieces.pieces_backend({Block}, state, "reduce-overhead", {})
    return torch.compile(model, backend=backend, fullgraph=True), state


def keys_recorded_and_run(model: nn.Module, x: Any) -> tuple[list[Any], list[Any]]:
    """The key of each piece of `model`'s graph (`x` its batch dimension dynamic), from the inputs Dynamo
    recorded and from a run on fake inputs."""
    tools = compiler.inductor_pieces()
    found: list[Any] = []

    def backend(graph: Any, example_inputs: list[Any]) -> Any:
        split, _ = pieces.split_graph(graph, {Block})
        recorded = pieces.recorded_inputs(split)
        assert recorded is not None
        found.append(
            [(target, pieces.piece_key(getattr(split, target), args)[0]) for target, args in recorded]
        )
        ran = []

        class Run(torch.fx.Interpreter):
            def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
                ran.append((target, pieces.piece_key(getattr(self.module, target), args)[0]))
                return super().call_module(target, args, kwargs)

        fake = tools.fake_mode(example_inputs)
        with fake:
            inputs = [
                fake.from_tensor(x)
                if isinstance(x, torch.Tensor) and not isinstance(x, tools.fake_tensor)
                else x
                for x in example_inputs
            ]
            Run(split).run(*inputs)
        found.append(ran)
        return graph

    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(x)
    return found[0], found[1]


def test_off_the_gpu_each_piece_takes_the_inputs_dynamo_recorded_which_a_fake_run_would_find() -> None:
    """Off the GPU no fake run learns the pieces' inputs (a CUDA graph's needs, what the graph writes and
    which ops it holds, are moot): Dynamo's record of them makes the same pieces alike, sizes symbolic."""
    recorded, ran = keys_recorded_and_run(Stack(widths=(8, 8, 16, 16)).eval(), torch.randn(2, 3, 4))
    assert recorded == ran and len(recorded) == 7
    assert len({key for _, key in recorded}) == 5  # the two blocks of each width alike


def test_a_piece_without_dynamos_record_of_its_inputs_learns_them_from_a_fake_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pieces, "recorded_inputs", lambda split: None)
    torch.manual_seed(0)
    model, x = Stack(widths=(8, 8, 16, 16)).eval(), torch.randn(2, 3, 4)
    whole, state = compiled(model)
    with torch.no_grad():
        torch.testing.assert_close(whole(x), model(x))
    assert str(state.pieces) == "7 a call, 2 compiled in all, 3 run as traced"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["stood in", pytest.param("cuda", marks=cuda)])
def on_gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Where CUDA graphs run: the GPU, or the CPU standing in for it (every tensor where CUDA graphs run,
    captures `emulated`). Yields the device and the runtime's counts of the graphs captured and replayed."""
    if request.param == "stood in":
        for module in (pieces, pieces_frame):
            monkeypatch.setattr(module, "is_on_graph_device", lambda tensor: True)
        monkeypatch.setattr(pieces_frame, "capture", emulated)
    counts = torch._dynamo.utils.counters["regionalize"]
    counts.clear()
    return torch.device("cpu" if request.param == "stood in" else "cuda"), counts


def test_each_distinct_piece_is_compiled_once_and_the_call_computes_the_originals() -> None:
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(2, 3, 4)
    whole, state = compiled(model)
    with torch.no_grad():
        torch.testing.assert_close(whole(x), model(x))
    # The blocks compiled once; the projection and the norm, an op each, run as traced.
    assert str(state.pieces) == "6 a call, 1 compiled in all, 2 run as traced"
    model = Stack(widths=(8, 8, 16, 16)).eval()
    whole, state = compiled(model)
    with torch.no_grad():
        torch.testing.assert_close(whole(x), model(x))
    # Blocks of another width are pieces of their own; the projection between is one more stretch.
    assert str(state.pieces) == "7 a call, 2 compiled in all, 3 run as traced"


def test_pieces_alike_but_for_the_memory_their_inputs_share_are_not_one_piece() -> None:
    """A piece compiled for two inputs on one memory may read or write it as one: it is not reused for
    two inputs apart, nor the other way round."""
    piece = torch.fx.symbolic_trace(lambda a, b: a.add_(1) + b)
    x, y = torch.zeros(4), torch.zeros(4)
    apart = pieces.piece_key(piece, [x, y])
    assert pieces.piece_key(piece, [y, x]) == apart
    assert pieces.piece_key(piece, [x, x.view(4)]) != apart


def test_a_call_is_one_graph_replayed_whose_outputs_the_caller_keeps(on_gpu: Any) -> None:
    """The first call runs as it is, the second captures and replays, the rest replay; each output kept
    holds its own call's result; an input the graph writes to is the caller's, written every call."""
    device, counts = on_gpu
    torch.manual_seed(0)
    model = Stack().eval().to(device)
    whole, _ = compiled(model)
    seen, xs = torch.zeros((), device=device), [torch.randn(2, 3, 4, device=device) for _ in range(4)]
    with torch.no_grad():
        kept = [whole(x, seen) for x in xs]
        for out, x in zip(kept, xs, strict=True):
            torch.testing.assert_close(out, model(x))
    assert seen.item() == 4
    assert (counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]) == (1, 3)


def test_graphs_follow_sizes_and_parameters_replaced_and_read_parameters_loaded_in_place(on_gpu: Any) -> None:
    """Another size is another frame of Dynamo's, captured on its own; parameters replaced (at other
    addresses) are a new capture; parameters loaded in place are read where they are, by the graph as
    captured."""
    device, counts = on_gpu
    torch.manual_seed(0)
    model, twin = Stack().eval().to(device), Stack().eval().to(device)
    whole, _ = compiled(model)

    def calls(rows: int) -> None:
        x = torch.randn(rows, 3, 4, device=device)
        for _ in range(3):
            torch.testing.assert_close(whole(x), model(x))

    def graphed() -> tuple[int, int]:
        return counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]

    with torch.no_grad():
        calls(2)
        calls(5)  # Dynamo's second frame, its sizes symbolic: each size a graph of its own
        assert graphed() == (2, 4)
        calls(2)
        assert graphed() == (3, 6)
        model.load_state_dict(twin.state_dict())  # in place
        calls(2)
        assert graphed() == (3, 9)
        model.load_state_dict(Stack().to(device).state_dict(), assign=True)  # new tensors
        calls(2)
    assert graphed() == (4, 11)


def test_a_written_input_at_another_address_is_a_new_graph_the_least_recently_replayed_giving_way(
    on_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new written input (a cache a request brings) is captured on its second call, whatever came
    before: past the limit the graph replayed least recently gives way, and is captured again when its
    input comes back. Every call computes the original's result."""
    device, counts = on_gpu
    monkeypatch.setattr(pieces_frame, "graph_limit", 2)
    torch.manual_seed(0)
    model = Stack().eval().to(device)
    whole, _ = compiled(model)
    x, counters = torch.randn(2, 3, 4, device=device), [torch.zeros((), device=device) for _ in range(3)]

    def calls(seen: Any, n: int = 3) -> tuple[int, int]:
        for _ in range(n):
            torch.testing.assert_close(whole(x, seen), model(x))
        return counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]

    a, b, c = counters
    with torch.no_grad():
        assert calls(a) == (1, 2) and calls(b) == (2, 4)  # the first call of each runs as it is
        assert calls(a, 1) == (2, 5)  # replayed: b is now the least recently replayed
        assert calls(c) == (3, 7)  # captured, b giving way
        assert calls(a, 1) == (3, 8)
        assert calls(b, 1) == (4, 9)  # seen before: captured again at once, c giving way
    assert [t.item() for t in counters] == [5, 4, 3]


def test_a_new_written_input_every_few_calls_is_graphed_however_long_the_run(on_gpu: Any) -> None:
    """A service whose every request brings a new cache: each is captured on its second call and
    replayed after, the hundredth as the first."""
    device, counts = on_gpu
    torch.manual_seed(0)
    model = Stack().eval().to(device)
    whole, _ = compiled(model)
    x = torch.randn(2, 3, 4, device=device)
    requests = 10 * pieces_frame.graph_limit
    kept = []  # each request's cache at an address of its own, none freed for the next to take
    with torch.no_grad():
        for _ in range(requests):
            seen = torch.zeros((), device=device)
            kept.append(seen)
            for _ in range(4):
                torch.testing.assert_close(whole(x, seen), model(x))
            assert seen.item() == 4
    assert (counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]) == (requests, 3 * requests)


class Peeking(Stack):
    """Reads `seen` after adding one to it, through another tensor the caller hands in too."""

    def forward(self, x: Any, seen: Any = None, other: Any = None) -> Any:
        return super().forward(x, seen) + other.sum()


def sharing(tensor: Any) -> Any:
    """A tensor on `tensor`'s memory that is not a view of it: it has a version counter of its own."""
    return torch.empty(0, device=tensor.device).set_(tensor.untyped_storage(), 0, tensor.shape)


@pytest.mark.parametrize("other", ["view", "sharing"])
def test_an_input_read_through_another_that_the_graph_writes_is_read_written(on_gpu: Any, other: str) -> None:
    """A view of an input the graph writes is written too (views share their base's version counter): the
    graph reads it where it is. A tensor on the same memory that is not a view is not seen to be written:
    such a call runs without a graph."""
    device, counts = on_gpu
    torch.manual_seed(0)
    model, x = Peeking().eval().to(device), torch.randn(2, 3, 4, device=device)
    twin_seen, seen = torch.zeros(1, device=device), torch.zeros(1, device=device)
    alias = (lambda t: t[:]) if other == "view" else sharing
    whole, _ = compiled(model)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(whole(x, seen, alias(seen)), model(x, twin_seen, alias(twin_seen)))
    graphed = (1, 3) if other == "view" else (0, 0)
    assert (counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]) == graphed


class Detour(Stack):
    """Ends off the GPU and back: float64 stands for the CPU (`test_no_graph_for_work_off_the_gpu`)."""

    def forward(self, x: Any, seen: Any = None) -> Any:
        return super().forward(x, seen).double().tanh().float()


def test_no_graph_for_work_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture would run the CPU's work once only, and every replay would reuse what it made then: a
    frame that makes a tensor off the GPU is never captured (float64 tensors stand for the CPU's here,
    every other tensor where CUDA graphs run)."""
    for module in (pieces, pieces_frame):
        monkeypatch.setattr(module, "is_on_graph_device", lambda tensor: tensor.dtype != torch.float64)
    monkeypatch.setattr(pieces_frame, "capture", emulated)
    counts = torch._dynamo.utils.counters["regionalize"]
    counts.clear()
    torch.manual_seed(0)
    for model, graphed in ((Stack().eval(), (1, 2)), (Detour().eval(), (0, 0))):
        whole, _ = compiled(model)
        x = torch.randn(2, 3, 4)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(whole(x), model(x))
        assert (counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]) == graphed
        counts.clear()


def test_no_graph_with_autograd_or_random_numbers_and_none_after_a_failed_capture(
    on_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    device, counts = on_gpu
    torch.manual_seed(0)
    model, x = Stack().eval().to(device), torch.randn(2, 3, 4, device=device)
    whole, _ = compiled(model)
    for _ in range(3):
        torch.testing.assert_close(whole(x), model(x))  # autograd on
    dropped = nn.Sequential(Stack(), nn.Dropout(0.5)).train().to(device)
    whole_dropped, _ = compiled(dropped)
    with torch.no_grad():
        for _ in range(3):
            whole_dropped(x)
    assert counts["cuda_graphs_captured"] == counts["cuda_graphs_replayed"] == 0

    def failing(run: Any, inputs: list[Any], graphs: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(pieces_frame, "capture", failing)
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    whole, _ = compiled(Stack().eval().to(device))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(whole(x), whole._orig_mod(x))
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == skips + 1
    assert counts["cuda_graphs_replayed"] == 0


def llama_on(device: Any, monkeypatch: pytest.MonkeyPatch, options: Options) -> tuple[Any, Any, Any, Any]:
    """test_kv_static's rewritten Llama and its original on `device` (the CPU standing in for the GPU for
    the rewrite's runtime), a prompt and its mask."""
    model, twin = llama_pair(options)
    model, twin = model.to(device), twin.to(device)
    if device.type == "cpu":
        stand_in_gpu(monkeypatch, runtime_of(model))
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0)).to(device)
    return model, twin, ids, torch.ones_like(ids)


def generates_in_one_graph_a_token(
    model: Any, twin: Any, ids: Any, mask: Any, counts: Any, **kwargs: Any
) -> None:
    """Two generates of `model` with `kwargs` give `twin`'s tokens, without the runtime's warnings; in the
    first, after the prompt and one token run as they are, one graph is captured and replayed a token; the
    owner whole in pieces, its 4 layers one piece."""
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = twin.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)
        actual = model.generate(ids, attention_mask=mask, **kwargs, **SETTINGS)
        tokens = SETTINGS["max_new_tokens"]
        assert (counts["cuda_graphs_captured"], counts["cuda_graphs_replayed"]) == (1, tokens - 2)
        again = model.generate(ids, attention_mask=mask, **kwargs, **SETTINGS)
    assert actual.tolist() == expected.tolist() == again.tolist()
    assert not [str(w.message) for w in caught if str(w.message).startswith("regionalize")]
    form = served_forms(model)["LlamaModel"]
    # The embedding and its masks and rotary angles compiled, as the blocks are; the final norm as traced.
    assert form.startswith("whole, in pieces (6 a call, 2 compiled in all, 1 run as traced)"), form


@pytest.mark.usefixtures("without_reuse")
def test_transformers_llama_in_cuda_graphs_replays_one_graph_a_token_with_the_originals_tokens(
    on_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' documented GPU path, `generate(cache_implementation="static")`, on the rewrite made
    with `--mode reduce-overhead`: the original's tokens; the owner whole in pieces, its 4 layers one
    piece; after the prompt (which sets the cache up) and one token run as they are, one graph replayed a
    token; the second generate, its cache set up again by transformers at the same addresses, replays
    from its first token on."""
    device, counts = on_gpu
    model, twin, ids, mask = llama_on(device, monkeypatch, Options(mode="reduce-overhead"))
    generates_in_one_graph_a_token(model, twin, ids, mask, counts, disable_compile=True)


@pytest.mark.usefixtures("without_reuse")
def test_the_default_form_serves_the_tokens_generates_own_compile_hands_over_in_one_graph(
    on_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default rewrite through transformers' documented GPU path, `generate(cache_implementation=
    "static")`, whose own compile (in CUDA graphs, `CompileConfig`) hands each token's call to the owner:
    served whole in pieces, one graph a token after the first, where traced through per block it was
    graphed between the blocks' frames. The prompt, which `generate` runs uncompiled, per block; the
    original's tokens, twice."""
    device, counts = on_gpu
    model, twin, ids, mask = llama_on(device, monkeypatch, Options())
    if device.type == "cpu":
        config = transformers.CompileConfig(backend="eager")
        config._compile_all_devices = True  # generate compiles only on a GPU otherwise
        model.generation_config.compile_config = config
    generates_in_one_graph_a_token(model, twin, ids, mask, counts)


@pytest.mark.usefixtures("without_reuse")
def test_the_default_form_graphs_nothing_without_a_compile_around_it_to_hand_over(
    on_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `generate`'s own compile (`disable_compile=True`) the default form's calls with a static
    cache are served as they were, per block, and nothing is captured."""
    device, counts = on_gpu
    model, twin, ids, mask = llama_on(device, monkeypatch, Options())
    with torch.no_grad():
        expected = twin.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)
        actual = model.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)
    assert actual.tolist() == expected.tolist()
    assert counts["cuda_graphs_captured"] == counts["cuda_graphs_replayed"] == 0
    assert "whole" not in served_forms(model)["LlamaModel"]


@pytest.mark.usefixtures("without_reuse")
def test_what_a_compile_around_the_default_form_hands_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a call that a compile around the model traces (not the owner's own trace), with a StaticCache
    on the GPU, and only where the owner is in pieces: not a DynamicCache's, nor one off the GPU."""
    model, _, ids, mask = llama_on(torch.device("cpu"), monkeypatch, Options())
    runtime = runtime_of(model)
    owner = model.model
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, disable_compile=True, **SETTINGS)  # the owner settles
    cache = StaticCache(config=model.config, max_cache_len=16)
    cache.early_initialization(batch_size=1, num_heads=2, head_dim=8, dtype=torch.float32, device="cpu")
    embeds = torch.zeros(1, 1, 32)
    handoff = runtime.handoff
    assert not handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": cache})  # not compiling
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": cache})
    assert not handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": DynamicCache()})
    runtime.patch(monkeypatch, "is_on_graph_device", lambda tensor: False)
    assert not handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": cache})
    runtime.patch(monkeypatch, "is_on_graph_device", lambda tensor: True)
    monkeypatch.setattr(runtime.this_call, "tracing", "flat")  # the owner's own trace
    assert not handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": cache})
    monkeypatch.setattr(runtime.this_call, "tracing", False)
    whole = runtime.Plan(runtime.WHOLE)  # nested regions reused
    monkeypatch.setattr(owner.__dict__["_regionalize_owner"].report, "plan", whole)
    assert not handoff(owner, (), {"inputs_embeds": embeds, "past_key_values": cache})
