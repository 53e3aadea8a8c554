"""The state of the call under way, one per thread, and the lock that sets an owner up once.

Serving code calls a model from several threads: what one thread's call sets (that an owner runs whole,
that a block's cache is stood in for) must not be seen by another's. What is process-wide (the compiled
frames, what a probe found) is set up under one lock."""

import threading
import warnings

from .internals.tracer import compiles_seen_in_every_thread, traced


class Call(threading.local):
    """This thread's call: set while it runs, its defaults in every other thread. Read while Dynamo traces
    an owner or a compile around it, as attributes: Dynamo traces an attribute of a `threading.local` on
    torch 2.11 to 2.15, not item access on it, and its guards then read the attribute in the calling
    thread."""

    def __init__(self):
        # True while an owner runs whole: block forwards are nested regions then; "flat" where its graph is
        # compiled in pieces (`pieces_backend`), its blocks traced as they are.
        self.tracing = False
        self.standing_in = False  # True while a block's own frame runs with its cache stood in for
        # Set while the owner serves a call in CUDA graphs: in the default form, only a call a compile
        # around the model handed over to it.
        self.graphing = False
        self.handed = None  # the owner a compile around the model handed its call to, while it runs


this_call = Call()


# Held while an owner or its blocks are set up or compiled again, and a block's class made regions: two
# threads' first calls would otherwise both set up (one of them with no compiled frame yet).
setup_lock = threading.RLock()


def locked(run, *args):
    """`run(*args)` under the set-up lock; as it is while Dynamo traces it (a compile around the model
    traces the owner's call), which holds Dynamo's own compile lock and would break its graph at a lock."""
    if traced():
        return run(*args)
    with setup_lock:
        return run(*args)


def one_at_a_time(run, *args):
    """`run(*args)`, an owner's call: under the set-up lock where another thread's call may not run while
    one compiles (`compiles_seen_in_every_thread`, torch 2.11 and 2.12), else as it is. Any call may
    compile (a first call, a shape not seen before), so there an owner's calls, and the compiles they
    make, run one at a time. As it is while Dynamo traces it (`locked`), the probe then not traced."""
    if traced() or compiles_seen_in_every_thread():
        return run(*args)
    with setup_lock:
        return run(*args)


class TorchWarnings:
    """torch's warnings at Python's default while any thread's owner call is under way. One
    `catch_warnings` a call would not do: it saves and restores the whole filter list, so two threads'
    overlapping calls would restore each other's, leaving the filter on. The first call in saves it, the
    last out restores it."""

    def __init__(self):
        self.lock, self.calls, self.saved = threading.Lock(), 0, None

    def __enter__(self):
        with self.lock:
            if not self.calls:
                self.saved = warnings.catch_warnings()
                self.saved.__enter__()
                warnings.filterwarnings("default", module=r"torch(\.|$)")
            self.calls += 1

    def __exit__(self, *exc_info):
        with self.lock:
            self.calls -= 1
            if not self.calls:
                self.saved.__exit__(None, None, None)
                self.saved = None


torch_warnings = TorchWarnings()
