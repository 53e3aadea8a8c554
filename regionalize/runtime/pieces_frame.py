"""Runs a frame compiled in pieces: as one CUDA graph per call where it can, and as torch saves it.

`pieces.py` compiles the pieces; `Graphs` is what its backend returns to Dynamo. Torch's `aot_compile` saves
a `Graphs` with the frame, each distinct compiled piece once, so that a later process runs the pieces
without tracing or compiling them (docs/saved-owners.md)."""

from __future__ import annotations

import pickle
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

from .internals.aot import piece_saving
from .internals.tracer import counters, is_static_marked
from .static import is_on_graph_device
from .threads import this_call

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from .state import Args

# The number of CUDA graphs kept for one compiled frame, one for each set of fixed-input addresses and
# sizes. The least recently replayed gives way, since transformers' `generate` makes a new cache each call.
graph_limit = 8

Key = tuple[tuple[int, ...], tuple[Any, ...]]  # a CUDA graph's fixed-input addresses and plain values
Graph = tuple[Callable[[], None], dict[int, torch.Tensor], list[tuple[Any, bool]], set[int]]  # `captured`
Code = list[Any]  # a graph module's state and the imports its code needs, as its pickle holds them
# A piece's name -> its code, run as traced, or the index of its compiled piece and whether that returns
# its one output unwrapped.
Pieces = dict[str, "Code | tuple[int, bool]"]
# The key of a split graph's `meta` that names its compiled pieces whose one output Inductor unwraps, which
# the saved piece returns in a list.
SINGLE_OUTPUT = "regionalize_single_output"


class Inputs(NamedTuple):
    """The positions of a frame's inputs, by what a CUDA graph does with them."""

    fixed: list[int]  # tensors that stay in place: parameters, static tensors, inputs the graph writes
    copied: list[int]  # tensors copied into the graph's buffers before each replay
    mutated: list[int]  # inputs that the graph writes to
    values: list[int]  # inputs that are not tensors


def inputs_of(example_inputs: list[Any], mutated: set[int]) -> Inputs:
    """Returns the positions of `example_inputs`, given those that the graph writes to."""
    tensors = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    kept = [isinstance(x, torch.nn.Parameter) or is_static_marked(x) for x in example_inputs]
    fixed = [i for i in tensors if i in mutated or kept[i]]
    copied = [i for i in tensors if i not in fixed]
    values = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
    return Inputs(fixed, copied, sorted(mutated), values)


def saved_split(split: GraphModule) -> tuple[Code, Pieces, list[bytes]]:
    """Returns what is saved of `split`, a graph whose pieces are compiled or run as traced.

    That is its code with an empty module for each piece, each piece as its code or as the index of a
    compiled piece, and the compiled pieces, each saved once however many blocks share it."""
    tools = cast(Any, piece_saving())  # a frame in pieces is saved only where the probe finds this
    names = [node.target for node in split.graph.nodes if node.op == "call_module"]
    single = split.meta.get(SINGLE_OUTPUT, set())
    shell = torch.fx.GraphModule({name: torch.nn.Module() for name in names}, split.graph)
    pieces: Pieces = {}
    indexes: dict[int, int] = {}
    compiled: list[bytes] = []
    for name in names:
        piece = split.__dict__[name]
        traced = getattr(piece, "__self__", None)  # a piece run as traced is its graph's `forward`
        if isinstance(traced, torch.fx.GraphModule):
            pieces[name] = tools.code_of(traced)
            continue
        if id(piece) not in indexes:
            indexes[id(piece)] = len(compiled)
            compiled.append(tools.save(piece))
        pieces[name] = indexes[id(piece)], name in single
    return tools.code_of(shell), pieces, compiled


def loaded_split(shell: Code, pieces: Pieces, compiled: list[bytes]) -> torch.nn.Module:
    """Returns the graph that `saved_split` saved, each piece a plain attribute, as `pieces_compiled` sets
    it."""
    tools = cast(Any, piece_saving())
    loaded = [tools.load(data) for data in compiled]
    split = from_code(shell)
    for name, piece in pieces.items():
        del split._modules[name]
        if isinstance(piece, list):  # a traced piece's code; an index is a tuple
            split.__dict__[name] = from_code(piece).forward
        else:
            index, single = piece
            split.__dict__[name] = _first(loaded[index]) if single else loaded[index]
    return split


def from_code(code: Code) -> torch.nn.Module:
    """Returns the module that a graph module's state and code make, without tracing that code.

    A graph module's own unpickling traces it, and a trace patches `nn.Module.__call__` for the whole
    process, which another thread's call meanwhile would meet."""
    body, imports = code
    module = torch.nn.Module()
    module.__dict__.update(body)
    module.__dict__["forward"] = types.MethodType(cast(Any, piece_saving()).forward_of(body, imports), module)
    return module


def _first(piece: Callable[..., Any]) -> Callable[..., Any]:
    """Returns `piece` returning the first of its outputs, as Inductor's own piece returns its one output."""
    return lambda *args: piece(*args)[0]


def register_saving() -> bool:
    """Returns whether this torch can save a frame compiled in pieces, and where it can, tells it that
    `Graphs` implements its interface for that."""
    tools = piece_saving()
    if tools is not None:
        tools.interface.register(Graphs)
    return tools is not None


class Graphs:
    """Serves a compiled frame's graph as one CUDA graph per call.

    A graph is captured on the second call with each set of fixed-input addresses and sizes, so that
    Triton's tuning happens outside a capture. Fixed inputs (parameters, tensors at static addresses and
    inputs the graph writes to) stay in place, and other inputs are copied in before each replay. The frame
    keeps `graph_limit` graphs and copies outputs out of the graph's memory. Calls with autograd, off the
    GPU, or with ops a graph cannot hold run without a graph. Dynamo's guards on the frame stand for the
    Python that the capture ran
    (docs/form-cuda-graphs.md#cuda-graphs-where-torch-reuses-no-traced-region-in-pieces). Torch's
    `aot_compile` saves and loads it through the two class methods of its `SerializableCallable`."""

    graphs: dict[Key, Graph]
    warm: dict[Key, None]
    pool: Any  # the graphs' memory pool, made at the first capture

    def __init__(self, run: torch.nn.Module, inputs: Inputs, graphable: bool, always: bool = True) -> None:
        # Dicts: the graphs in the order of their last replay, and the keys in the order first seen.
        self.run, self.graphs, self.warm, self.pool = run, {}, {}, None
        self.graphable, self.always, self.lock = graphable, always, threading.Lock()
        self.fixed, self.copied, self.mutated, self.values = inputs

    @classmethod
    def serialize_compile_artifacts(cls, graphs: Graphs) -> bytes:
        """Returns `graphs` as bytes, which torch's `aot_compile` saves with the frame (`saved.py`)."""
        inputs = Inputs(graphs.fixed, graphs.copied, graphs.mutated, graphs.values)
        return pickle.dumps(
            (saved_split(cast("GraphModule", graphs.run)), inputs, graphs.graphable, graphs.always)
        )

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Graphs:
        """Returns the `Graphs` that `serialize_compile_artifacts` saved, its pieces run as they were."""
        split, inputs, graphable, always = pickle.loads(data)
        return cls(loaded_split(*split), inputs, graphable, always)

    def __call__(self, *args: Any) -> Any:
        if not (self.graphable and (self.always or this_call.graphing)) or torch.is_grad_enabled():
            return self.run(*args)
        # One thread's call at a time, because every call copies its inputs into the same buffers and its
        # outputs out of the same memory.
        with self.lock:
            return self.replayed(args)

    def replayed(self, args: Args) -> Any:
        # A fixed input at the address of its capture is the same memory, since CUDA's addresses are
        # unified with the host's; the other inputs are checked.
        key = tuple(args[i].data_ptr() for i in self.fixed), tuple(args[i] for i in self.values)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.captured(key, args)
        elif not self.servable(args, graph[3]):
            graph = None
        elif len(self.graphs) > 1:  # moved to the end; a single graph, the usual case, needs no move
            self.graphs[key] = self.graphs.pop(key)
        if graph is None:
            return self.run(*args)
        replay, buffers, outputs, _ = graph
        for i, buffer in buffers.items():
            buffer.copy_(args[i])
        replay()
        counters()["regionalize"]["cuda_graphs_replayed"] += 1
        # Copied out of the graph's memory, which the next replay writes; a fixed input or a view of one
        # is the caller's own memory and is not copied.
        return tuple(x.clone() if copy else x for x, copy in outputs)

    def servable(self, args: Args, written: set[int]) -> bool:
        """Returns whether the inputs to copy in are on the GPU and share no memory that the graph writes."""
        copied = [args[i] for i in self.copied]
        return all(is_on_graph_device(x) and x.untyped_storage().data_ptr() not in written for x in copied)

    def captured(self, key: Key, args: Args) -> Graph | None:
        """Returns the graph for `key`, captured on its second call, or None when the call runs uncaptured."""
        if not all(is_on_graph_device(args[i]) for i in self.fixed):
            return None
        written = {args[i].untyped_storage().data_ptr() for i in self.mutated}
        if not self.servable(args, written):
            return None
        if key not in self.warm:
            self.warm[key] = None
            if len(self.warm) > 4 * graph_limit:  # forget the oldest key seen
                del self.warm[next(iter(self.warm))]
            return None
        if len(self.graphs) >= graph_limit:
            # Its memory in the graphs' shared pool is free between replays, as every graph's is.
            del self.graphs[next(iter(self.graphs))]
        buffers = {i: torch.empty_like(args[i]).copy_(args[i]) for i in self.copied}
        inputs = [buffers.get(i, x) for i, x in enumerate(args)]
        try:
            replay, outputs = capture(self.run, inputs, self)
        except Exception:  # an op that a CUDA graph cannot hold, so this frame runs without one
            self.graphable = False
            counters()["inductor"]["cudagraph_skips"] += 1
            return None
        # What verify counts, beside the graphs of torch's CUDA-graph trees.
        counters()["regionalize"]["cuda_graphs_captured"] += 1
        fixed = {args[i].untyped_storage().data_ptr() for i in self.fixed}
        outputs = [
            (x, isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in fixed) for x in outputs
        ]
        graph = self.graphs[key] = replay, buffers, outputs, written
        return graph


def capture(run: Callable[..., Any], inputs: list[Any], graphs: Graphs) -> tuple[Callable[[], None], Any]:
    """Captures `run(*inputs)` as a CUDA graph in the pool that `graphs` shares, and returns its replay.

    It also returns the outputs; the capture runs nothing on the GPU, and the replay does the work."""
    if graphs.pool is None:
        graphs.pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, pool=graphs.pool):
        outputs = run(*inputs)
    return graph.replay, outputs
