"""On a torch that reuses no traced region (2.11), and for blocks that differ in float constants: the owner
traced whole, its graph compiled in pieces, one per block and one per stretch between blocks, each distinct
piece once (a short stretch runs as traced); in CUDA graphs a call is one CUDA graph of them all."""

import operator
import threading

import torch

from .internals.compiler import inductor_pieces, op_arguments, sym_expr, sym_hint
from .internals.hooks import writes
from .internals.tracer import counters, static_marked, tree_leaves
from .per_block import graph_modes
from .static import on_graph_device
from .threads import this_call

# Graphs kept for one compiled frame (its fixed inputs moved, its sizes), the least recently replayed
# making room for a new one: transformers' `generate` makes a new StaticCache every call.
graph_limit = 8
# The most ops of a stretch between blocks run as traced rather than compiled: an embedding, a patch
# embedding (6 ops), a final norm (8). Figures: docs/results/forward/stochastic-depth.md.
traced_ops = 8


def pieces_backend(classes, state, mode, options):
    """A Dynamo backend for an owner whose blocks are of `classes`. Dynamo traces the owner and its blocks
    whole and guards every line of it, as a full compile does (the Python between the blocks included). Its
    graph is split where a block's nodes begin and end (their module stack names the block); pieces alike
    (the same nodes on inputs of the same sizes, layouts and dtypes, which hold their weights) share one
    compiled piece, so Inductor compiles a block once, not once a layer: where region reuse is missing,
    this replaces it (the figures: docs/form-torch-versions.md). A call is one Dynamo frame and
    one call of each piece, where the per-block form makes a frame a block, whose entry alone costs more.
    In CUDA graphs the call is one CUDA graph (`Graphs`). `state` gets the counts, for the
    form verify reports."""

    # Key -> the frame's `ShapeEnv`, the symbols and the compiled piece of each piece compiled under that
    # key; shared by the owner's frames: the prompt's and the tokens' share the sizeless pieces.
    pieces = {}

    def backend(graph, example_inputs):
        split, blocks = split_graph(graph, classes)
        a_call = len(list(split.children()))  # before the pieces replace the split's modules
        mutated, ungraphable, traced = pieces_compiled(split, blocks, example_inputs, pieces, mode, options)
        compiled = sum(map(len, pieces.values()))
        traced = f", {traced} run as traced" if traced else ""
        state.pieces = f"{a_call} a call, {compiled} compiled in all{traced}"
        return Graphs(split, example_inputs, mutated, not ungraphable, mode in graph_modes)

    return backend


def split_graph(graph, classes):
    """`graph` split in order: a piece per stretch of nodes inside one block, or outside all. Returns the
    split graph and the names of its pieces inside a block."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    segment, last, parts, blocks = 0, (), {}, set()
    for node in graph.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        stack = (node.meta.get("nn_module_stack") or {}).values()
        block = next((path for path, cls in stack if cls in classes or cls in names), None)
        if block != last:
            segment, last = segment + 1, block
            if block is not None:
                blocks.add(f"submod_{segment}")  # split_module's name for the piece
        parts[node] = segment
    return inductor_pieces().split_module(graph, None, parts.__getitem__, keep_original_order=True), blocks


def pieces_compiled(split, blocks, example_inputs, pieces, mode, options):
    """Compile `split`'s pieces in place; `pieces` maps what makes pieces alike to the compiled one. A
    stretch outside the `blocks` pieces of at most `traced_ops` ops runs as traced: Inductor's
    compile of it would cost about a second on a CPU (a C++ build) and save next to nothing a call. Returns
    the positions of the inputs that the graph writes to, whether it holds an op that a CUDA graph cannot
    replay (`Ungraphable`), and how many pieces run as traced. Each piece's inputs are those Dynamo
    recorded; where a CUDA graph may replay the call, which needs the writes and the ops, or a piece lacks
    them, the pieces run on fake copies of `example_inputs` instead, and learn them so."""
    tools = inductor_pieces()
    fake = tools.fake_mode(example_inputs)
    patches = {**tools.mode_options(mode or "default"), **options, "triton.cudagraphs": False}
    traced = []

    def compile_piece(target, args):
        piece = getattr(split, target)
        if target not in blocks and op_count(piece) <= traced_ops:
            traced.append(target)
            compiled = piece.forward
        else:
            key, symbols = piece_key(piece, args)
            compiled = alike(pieces.get(key, ()), symbols, fake.shape_env)
            if compiled is None:
                compiled = tools.compile_fx(piece, list(args), config_patches=patches)
                pieces.setdefault(key or object(), []).append((fake.shape_env, symbols, compiled))
        # A plain attribute where the piece was (the split graph's code calls `self.<target>(...)`): a
        # module's call costs more than many a piece's work.
        delattr(split, target)
        split.__dict__[target] = compiled

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    recorded = None if any(map(on_graph_device, tensors)) else recorded_inputs(split)
    if recorded is not None:  # off the GPU: no CUDA graph, so neither the writes nor the ops matter
        for target, args in recorded:
            compile_piece(target, args)
        return set(), False, len(traced)
    return (*pieces_faked(split, example_inputs, tools, fake, compile_piece), len(traced))


def pieces_faked(split, example_inputs, tools, fake, compile_piece):
    """Run `split` on fake copies of `example_inputs`, compiling each piece with `compile_piece` as it is
    reached; return the positions of the inputs that the graph writes to, and whether it holds an op that
    a CUDA graph cannot replay."""
    ungraphable = []

    class Ungraphable(tools.dispatch_mode):
        """Records ops a CUDA graph cannot replay as the call would run them: those that draw random
        numbers, and those that make a tensor off the GPU, whose work a capture would run once only (the
        CPU's is not captured), as Inductor's CUDA-graph trees refuse a graph that holds them."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if torch.Tag.nondeterministic_seeded in func.tags and draws(func, args, kwargs):
                ungraphable.append(func)
            out = func(*args, **kwargs)
            if any(isinstance(t, torch.Tensor) and not on_graph_device(t) for t in tree_leaves(out)):
                ungraphable.append(func)
            return out

    class Compiling(torch.fx.Interpreter):
        def call_module(self, target, args, kwargs):
            with Ungraphable():
                out = super().call_module(target, args, kwargs)  # before Inductor, which rewrites the piece
            compile_piece(target, args)
            return out

    with fake:
        real = [isinstance(x, torch.Tensor) and not isinstance(x, tools.fake_tensor) for x in example_inputs]
        inputs = [fake.from_tensor(x) if r else x for x, r in zip(example_inputs, real, strict=True)]
        versions = [writes(x) if isinstance(x, torch.Tensor) else None for x in inputs]
        Compiling(split).run(*inputs)
    mutated = {i for i, x in enumerate(inputs) if versions[i] is not None and writes(x) != versions[i]}
    return mutated, bool(ungraphable)


def recorded_inputs(split):
    """Each piece of `split` with its inputs as Dynamo recorded them while it traced (the example values
    its placeholders keep, which the split copies from the graph's), in the order the pieces run; None
    where a piece lacks one."""
    recorded = []
    for node in split.graph.nodes:
        if node.op == "call_module":
            placeholders = [n for n in getattr(split, node.target).graph.nodes if n.op == "placeholder"]
            args = [n.meta.get("example_value") for n in placeholders]
            if len(args) != len(node.args) or any(x is None for x in args):
                return None
            recorded.append((node.target, args))
    return recorded


def op_count(piece):
    """The ops of `piece`, a piece of Dynamo's graph: its calls, an item or a size taken counted as none."""
    calls = [n for n in piece.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    return sum(n.target not in (operator.getitem, "size") for n in calls)


def draws(func, args, kwargs):
    """Does `func`, an op that may draw random numbers, draw any here: not a dropout of probability 0 or
    out of training (attention's among them, which every call of torch's scaled dot product makes)."""
    given = op_arguments(func, args, kwargs)
    p = given.get("dropout_p", given.get("p"))
    return given.get("train", True) is not False and not (isinstance(p, (int, float)) and p == 0)


def piece_key(piece, args):
    """What makes two pieces one compiled piece: their nodes, their inputs' sizes, layouts and dtypes, and
    which of their inputs share memory (a piece compiled for an input passed twice reads it once), sizes
    that are symbols named in their order of appearance. Returns that and the piece's symbols in that
    order, each with the `SymInt` among its inputs that is the symbol alone (None where none is): each
    layer's cache length is a symbol of its own. The key is None for a piece holding a constant
    (`get_attr`), which is its own."""
    tools = inductor_pieces()
    index, nodes = {}, []
    for node in piece.graph.nodes:
        if node.op == "get_attr":
            return None, {}
        index[node] = len(index)
        uses = torch.fx.node.map_arg((node.args, node.kwargs), index.__getitem__)
        nodes.append((node.op, "" if node.op == "placeholder" else str(node.target), repr(uses)))
    symbols = {}

    def named(value):
        if not isinstance(value, torch.SymInt):
            return repr(value)
        expr = sym_expr(value)
        if expr.is_Symbol and symbols.get(expr) is None:
            symbols[expr] = value
        for symbol in sorted(expr.free_symbols, key=str):
            symbols.setdefault(symbol, None)
        order = list(symbols)
        return str(expr.xreplace({s: tools.size_symbol(order.index(s)) for s in expr.free_symbols}))

    def described(x):
        if not isinstance(x, torch.Tensor):
            return named(x)
        sizes, strides = tuple(map(named, x.shape)), tuple(map(named, x.stride()))
        offset = named(x.storage_offset() * x.element_size() % 16)
        return sizes, strides, x.dtype, x.device, x.requires_grad, offset

    inputs = tuple(described(x) for x in args)
    storages = [tools.storage(x.untyped_storage()) for x in args if isinstance(x, torch.Tensor)]
    shared = tuple(storages.index(s) for s in storages)
    return (tuple(nodes), inputs, shared), symbols


def alike(candidates, symbols, sizes):
    """The compiled piece among `candidates` (the sizes, symbols and compiled piece of each piece of this
    one's key) whose symbols are this piece's, or can be made so: each pair with one value now, which the
    frame then guards equal (a call with other values compiles again). A piece with symbols is shared
    within its frame only (`sizes`, the frame's `ShapeEnv`): another frame's symbols of the same names
    are others, and what Inductor assumed of them is guarded in that frame only. None where none is."""
    for theirs_sizes, theirs, compiled in candidates:
        if symbols and theirs_sizes is not sizes:
            continue
        pairs = [(a, b) for (s, a), (t, b) in zip(symbols.items(), theirs.items(), strict=True) if s != t]
        known = all(a is not None and b is not None and sym_hint(a) is not None for a, b in pairs)
        # Each comparison of hints equal is a guard of the frame's (and replaces b's symbol by a's).
        if known and all(sym_hint(a) == sym_hint(b) for a, b in pairs) and all(a == b for a, b in pairs):
            return compiled
    return None


class Graphs:
    """A compiled frame's graph, served as one CUDA graph a call, captured on the second call of each
    set of fixed-input addresses and sizes (the first runs it as it is: Triton's tuning and any lazy set-up
    happen outside a capture). Its inputs are fixed (parameters, tensors at addresses marked static, such
    as a `StaticCache`'s, and any it writes to) or copied into the graph's own before each replay; a fixed
    input at another address is a new capture, as is another size of a dynamic one; the frame keeps
    `graph_limit` graphs, the least recently replayed giving way to a new one, so a service
    whose requests each bring a new cache keeps its graphs. Its outputs are copied out of the graph's
    memory: the next replay overwrites it. Run without a graph: with autograd, off the GPU, where it draws
    random numbers or computes off the GPU, where an input it copies in shares memory with one it writes,
    and once a capture failed (counted as Inductor's CUDA-graph skips, which the owner warns of).
    Dynamo's guards on the frame stand for the Python the capture ran."""

    def __init__(self, run, example_inputs, mutated, graphable, always=True):
        # The graphs in the order of their last replay, the keys seen in the order first seen (dicts).
        self.run, self.graphs, self.warm, self.pool = run, {}, {}, None
        self.graphable, self.always, self.lock = graphable, always, threading.Lock()
        tensors = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
        kept = [isinstance(x, torch.nn.Parameter) or static_marked(x) for x in example_inputs]
        self.fixed = [i for i in tensors if i in mutated or kept[i]]
        self.copied = [i for i in tensors if i not in self.fixed]
        self.mutated = sorted(mutated)
        self.values = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]

    def __call__(self, *args):
        if not (self.graphable and (self.always or this_call.graphing)) or torch.is_grad_enabled():
            return self.run(*args)
        # One thread's call at a time: every call's inputs are copied into the same buffers, and its
        # outputs out of the same memory.
        with self.lock:
            return self.replayed(args)

    def replayed(self, args):
        # A fixed input at the address it was captured at is where it was then (CUDA's addresses are
        # unified with the host's); the others are checked.
        key = tuple(args[i].data_ptr() for i in self.fixed), tuple(args[i] for i in self.values)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.captured(key, args)
        elif not self.servable(args, graph[3]):
            graph = None
        elif len(self.graphs) > 1:  # the last replayed last: one graph, the usual case, needs no move
            self.graphs[key] = self.graphs.pop(key)
        if graph is None:
            return self.run(*args)
        replay, buffers, outputs, _ = graph
        for i, buffer in buffers.items():
            buffer.copy_(args[i])
        replay()
        counters()["regionalize"]["cuda_graphs_replayed"] += 1
        # Copied out of the graph's memory, which the next replay writes; but a fixed input or a view of
        # one, memory the graph writes in place, the caller's own.
        return tuple(x.clone() if copy else x for x, copy in outputs)

    def servable(self, args, written):
        """Can the graph take the inputs it copies in: on the GPU, none the memory of an input the graph
        writes to (its copy would not see the write)."""
        copied = [args[i] for i in self.copied]
        return all(on_graph_device(x) and x.untyped_storage().data_ptr() not in written for x in copied)

    def captured(self, key, args):
        """The graph for `key`, captured on its second call, else None: the call runs as it is."""
        if not all(on_graph_device(args[i]) for i in self.fixed):
            return None
        written = {args[i].untyped_storage().data_ptr() for i in self.mutated}
        if not self.servable(args, written):
            return None
        if key not in self.warm:
            self.warm[key] = None
            if len(self.warm) > 4 * graph_limit:  # the keys seen, the oldest forgotten
                del self.warm[next(iter(self.warm))]
            return None
        if len(self.graphs) >= graph_limit:
            # Its memory in the pool the graphs share is free between its replays, as every graph's is.
            del self.graphs[next(iter(self.graphs))]
        buffers = {i: torch.empty_like(args[i]).copy_(args[i]) for i in self.copied}
        inputs = [buffers.get(i, x) for i, x in enumerate(args)]
        try:
            replay, outputs = capture(self.run, inputs, self)
        except Exception:  # an op a CUDA graph cannot hold: this frame runs without one
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


def capture(run, inputs, graphs):
    """`run(*inputs)` captured as a CUDA graph in the memory pool `graphs` shares among its graphs (one
    graph's memory is free again once its outputs are copied out), returned as its replay and its
    outputs. The capture runs nothing on the GPU: the replay does the call's work."""
    if graphs.pool is None:
        graphs.pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, pool=graphs.pool):
        outputs = run(*inputs)
    return graph.replay, outputs
