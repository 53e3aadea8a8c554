"""Compiles an owner's graph in pieces: one per block and one per stretch between blocks, each distinct once.

This is the form for a torch that reuses no traced region and for blocks that differ in float constants;
in CUDA graphs, each call replays one graph of all the pieces (docs/form-torch-versions.md)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch

from .graphs import graph_modes
from .internals.compiler import inductor_pieces, op_arguments, sym_expr, sym_hint
from .internals.hooks import write_count
from .internals.tracer import tree_leaves
from .pieces_frame import SINGLE_OUTPUT, Graphs, inputs_of
from .state import PieceCounts
from .static import is_on_graph_device

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from .state import Args, Findings, Kwargs

# The most ops that a stretch between blocks may hold to run as traced rather than compiled, enough for an
# embedding or a final norm (docs/form-cuda-graphs.md).
traced_ops = 8

Symbols = dict[Any, "torch.SymInt | None"]  # a piece's sympy symbols, each with the `SymInt` that is it alone
Compiled = tuple[Any, Symbols, Callable[..., Any]]  # a frame's `ShapeEnv`, a piece's symbols, its compile


def pieces_backend(
    classes: Collection[type[torch.nn.Module]], report: Findings, mode: str | None, options: Kwargs
) -> Callable[[GraphModule, list[Any]], Graphs]:
    """Returns a Dynamo backend that compiles an owner's graph in pieces, for blocks of `classes`.

    The graph is split where each block's nodes begin and end, and pieces alike (the same nodes on inputs
    of the same sizes, layouts and dtypes) share one compiled piece, so Inductor compiles a block once.
    Each call is one Dynamo frame, or one CUDA graph (`Graphs`). `report` gets the counts that verify
    reports."""

    # A piece's key -> the frame's `ShapeEnv`, the symbols and the compiled piece of each piece compiled
    # under that key. The owner's frames share it, so a prompt's frame and the tokens' share sizeless pieces.
    pieces: dict[Hashable, list[Compiled]] = {}

    def backend(graph: GraphModule, example_inputs: list[Any]) -> Graphs:
        split, blocks = split_graph(graph, classes)
        a_call = len(list(split.children()))  # counted before the pieces replace the split's modules
        mutated, ungraphable, traced = pieces_compiled(split, blocks, example_inputs, pieces, mode, options)
        report.pieces = PieceCounts(a_call, sum(map(len, pieces.values())), traced)
        return Graphs(split, inputs_of(example_inputs, mutated), not ungraphable, mode in graph_modes)

    return backend


def split_graph(graph: GraphModule, classes: Collection[type]) -> tuple[GraphModule, set[str]]:
    """Splits `graph` in order into a piece per stretch of nodes inside one block or outside all blocks.

    It returns the split graph and the names of the pieces that are inside a block."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    segment, last, parts, blocks = 0, cast("str | tuple[()] | None", ()), {}, set()
    for node in graph.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        stack = (node.meta.get("nn_module_stack") or {}).values()
        block = next((path for path, cls in stack if cls in classes or cls in names), None)
        if block != last:
            segment, last = segment + 1, block
            if block is not None:
                blocks.add(f"submod_{segment}")  # the name that split_module gives the piece
        parts[node] = segment
    tools = cast(SimpleNamespace, inductor_pieces())  # the form in pieces is planned only where it is found
    return tools.split_module(graph, None, parts.__getitem__, keep_original_order=True), blocks


def pieces_compiled(
    split: GraphModule,
    blocks: set[str],
    example_inputs: list[Any],
    pieces: dict[Hashable, list[Compiled]],
    mode: str | None,
    options: Kwargs,
) -> tuple[set[int], bool, int]:
    """Compiles `split`'s pieces in place, sharing compiled pieces through `pieces`.

    A stretch between blocks of at most `traced_ops` ops runs as traced, since compiling it would cost a
    C++ build on a CPU and save next to nothing per call. Each piece is compiled for the inputs that Dynamo
    recorded. Where a CUDA graph may replay the call, or a piece lacks recorded inputs, the pieces run on
    fake copies of `example_inputs` instead, which also find the inputs that the graph writes to and the ops
    that a CUDA graph cannot replay. It returns those input positions, whether there are such ops, and how
    many pieces run as traced."""
    tools = cast(SimpleNamespace, inductor_pieces())
    fake = tools.fake_mode(example_inputs)
    patches = {**tools.mode_options(mode or "default"), **options, "triton.cudagraphs": False}
    traced: list[str] = []

    def compile_piece(target: str, args: Sequence[Any]) -> None:
        piece = getattr(split, target)
        if target not in blocks and op_count(piece) <= traced_ops:
            traced.append(target)
            compiled = piece.forward
        else:
            if not tools.returns_tuple(piece):  # Inductor's piece then returns its one output unwrapped
                split.meta.setdefault(SINGLE_OUTPUT, set()).add(target)
            key, symbols = piece_key(piece, args)
            compiled = alike(pieces.get(key, ()), symbols, fake.shape_env)
            if compiled is None:
                compiled = tools.compile_fx(piece, list(args), config_patches=patches)
                pieces.setdefault(key or object(), []).append((fake.shape_env, symbols, compiled))
        # A plain attribute replaces the piece's module (the split graph calls `self.<target>(...)`),
        # because a module's call costs more than many pieces' work.
        delattr(split, target)
        split.__dict__[target] = compiled

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    recorded = None if any(map(is_on_graph_device, tensors)) else recorded_inputs(split)
    if recorded is not None:  # off the GPU there is no CUDA graph, so the writes and ops do not matter
        for target, args in recorded:
            compile_piece(target, args)
        return set(), False, len(traced)
    return (*pieces_faked(split, example_inputs, tools, fake, compile_piece), len(traced))


def pieces_faked(
    split: GraphModule,
    example_inputs: list[Any],
    tools: SimpleNamespace,
    fake: Any,
    compile_piece: Callable[[str, Sequence[Any]], None],
) -> tuple[set[int], bool]:
    """Runs `split` on fake copies of `example_inputs` and compiles each piece as it is reached.

    It returns the positions of the inputs that the graph writes to, and whether it holds an op that a CUDA
    graph cannot replay."""
    ungraphable: list[Any] = []

    class Ungraphable(tools.dispatch_mode):  # type: ignore[name-defined,misc]  # found by the probe
        """Records the ops that a CUDA graph cannot replay: random draws, and ops that make a CPU tensor.

        A capture would run those ops once only, so Inductor's CUDA-graph trees refuse them too."""

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Args = (), kwargs: Kwargs | None = None
        ) -> Any:
            kwargs = kwargs or {}
            if torch.Tag.nondeterministic_seeded in func.tags and draws(func, args, kwargs):
                ungraphable.append(func)
            out = func(*args, **kwargs)
            if any(isinstance(t, torch.Tensor) and not is_on_graph_device(t) for t in tree_leaves(out)):
                ungraphable.append(func)
            return out

    class Compiling(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Args, kwargs: Kwargs) -> Any:
            with Ungraphable():
                out = super().call_module(target, args, kwargs)  # run before Inductor rewrites the piece
            compile_piece(target, args)
            return out

    with fake:
        real = [isinstance(x, torch.Tensor) and not isinstance(x, tools.fake_tensor) for x in example_inputs]
        inputs = [fake.from_tensor(x) if r else x for x, r in zip(example_inputs, real, strict=True)]
        versions = [write_count(x) if isinstance(x, torch.Tensor) else None for x in inputs]
        Compiling(split).run(*inputs)
    mutated = {i for i, x in enumerate(inputs) if versions[i] is not None and write_count(x) != versions[i]}
    return mutated, bool(ungraphable)


def recorded_inputs(split: GraphModule) -> list[tuple[str, list[Any]]] | None:
    """Returns each piece of `split` with the inputs that Dynamo recorded for it, in the order they run.

    The inputs are the example values of the pieces' placeholders; a piece that lacks one gives None."""
    recorded = []
    for node in split.graph.nodes:
        if node.op == "call_module":
            placeholders = [n for n in getattr(split, node.target).graph.nodes if n.op == "placeholder"]
            args = [n.meta.get("example_value") for n in placeholders]
            if len(args) != len(node.args) or any(x is None for x in args):
                return None
            recorded.append((node.target, args))
    return recorded


def op_count(piece: GraphModule) -> int:
    """Counts the ops of `piece`, a piece of Dynamo's graph, leaving out item and size look-ups."""
    calls = [n for n in piece.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    return sum(n.target not in (operator.getitem, "size") for n in calls)


def draws(func: Any, args: Args, kwargs: Kwargs) -> bool:
    """Returns whether `func`, an op that may draw random numbers, draws any with these arguments.

    A dropout of probability 0, or outside training, draws none, like the one in every attention call."""
    given = op_arguments(func, args, kwargs)
    p = given.get("dropout_p", given.get("p"))
    return given.get("train", True) is not False and not (isinstance(p, (int, float)) and p == 0)


def piece_key(piece: GraphModule, args: Sequence[Any]) -> tuple[Hashable | None, Symbols]:
    """Returns what makes two pieces one compiled piece, and the piece's symbols.

    The key holds the nodes, the inputs' sizes, layouts and dtypes, and which inputs share memory, with
    symbolic sizes named in their order of appearance. Each symbol comes with the `SymInt` input that is
    that symbol alone, or None. A piece that holds a constant (`get_attr`) gets no key and is its own."""
    tools = cast(SimpleNamespace, inductor_pieces())
    index: dict[torch.fx.Node, int] = {}
    nodes: list[tuple[str, str, str]] = []
    for node in piece.graph.nodes:
        if node.op == "get_attr":
            return None, {}
        index[node] = len(index)
        uses = torch.fx.node.map_arg((node.args, node.kwargs), index.__getitem__)
        nodes.append((node.op, "" if node.op == "placeholder" else str(node.target), repr(uses)))
    symbols: Symbols = {}

    def named(value: object) -> str:
        if not isinstance(value, torch.SymInt):
            return repr(value)
        expr = sym_expr(value)
        if expr.is_Symbol and symbols.get(expr) is None:
            symbols[expr] = value
        for symbol in sorted(expr.free_symbols, key=str):
            symbols.setdefault(symbol, None)
        order = list(symbols)
        return str(expr.xreplace({s: tools.size_symbol(order.index(s)) for s in expr.free_symbols}))

    def described(x: object) -> object:
        if not isinstance(x, torch.Tensor):
            return named(x)
        sizes, strides = tuple(map(named, x.shape)), tuple(map(named, x.stride()))
        offset = named(x.storage_offset() * x.element_size() % 16)
        return sizes, strides, x.dtype, x.device, x.requires_grad, offset

    inputs = tuple(described(x) for x in args)
    storages = [tools.storage(x.untyped_storage()) for x in args if isinstance(x, torch.Tensor)]
    shared = tuple(storages.index(s) for s in storages)
    return (tuple(nodes), inputs, shared), symbols


def alike(candidates: Iterable[Compiled], symbols: Symbols, sizes: Any) -> Callable[..., Any] | None:
    """Returns the compiled piece among `candidates` whose symbols match this piece's, or None.

    Symbols match where they have the same values now, which the frame then guards equal. A piece with
    symbols is shared only within its frame (`sizes`, the frame's `ShapeEnv`), because another frame's
    symbols of the same names are other symbols."""
    for theirs_sizes, theirs, compiled in candidates:
        if symbols and theirs_sizes is not sizes:
            continue
        pairs = [(a, b) for (s, a), (t, b) in zip(symbols.items(), theirs.items(), strict=True) if s != t]
        known = all(a is not None and b is not None and sym_hint(a) is not None for a, b in pairs)
        # Each comparison of equal hints adds a guard to the frame and replaces b's symbol by a's.
        if (
            known
            and all(sym_hint(a) == sym_hint(b) for a, b in pairs)  # type: ignore[arg-type]  # not None: known
            and all(a == b for a, b in pairs)
        ):
            return compiled
    return None
