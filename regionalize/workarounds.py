"""The ways the runtime works around torch, as data: each names what it does, the torch versions it covers,
torch's issue (or where it was found, when none is filed), the probe that tells whether the running torch
needs it, and when it can go. `docs/torch-workarounds.md` is rendered from this table, and
tests/test_workarounds.py checks, on each CI torch, which are needed there: a torch that fixes one fails that
test, which says the workaround can go. A probe of None marks one applied on every torch, whose check would
cost a compile the runtime does not pay; the test probes those it can.

It lives beside the runtime, not in it: the runtime never reads it, and `--vendor` copies the runtime
package into users' trees, where a table for the docs has no use."""

import dataclasses
import inspect
import threading
from collections.abc import Callable

import torch

from regionalize.runtime.internals.aot import is_gradient_load_supported
from regionalize.runtime.internals.cpu import cpu_check_available
from regionalize.runtime.internals.tracer import (
    compiles_seen_in_every_thread,
    has_inlined_module_imports,
    has_region_reuse,
)


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One workaround (see the module's docstring)."""

    name: str
    does: str
    covers: str  # the torch versions
    issue: str  # torch's issue, or where it was found
    probe: Callable[[], bool] | None
    until: str  # when it can go

    def needed(self) -> bool | None:
        """Does the running torch need it? None where it has no probe (applied on every torch)."""
        return None if self.probe is None else bool(self.probe())


def _reuse_limit_low() -> bool:
    """Does torch's nested region keep fewer variants a block class than a deep stack has layers?"""
    if not has_region_reuse():
        return False
    default = inspect.signature(torch.compiler.nested_compile_region).parameters["max_reuse_entries"].default
    return isinstance(default, int) and default < 1024


def _compiling_seen_across_threads() -> bool:
    """Does `torch.compiler.is_compiling()` answer True in a thread while another thread compiles?"""
    started, release = threading.Event(), threading.Event()

    def backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., object]:
        started.set()
        release.wait(30)
        return graph.forward

    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiling = threading.Thread(target=lambda: torch.compile(add_one, backend=backend)(torch.ones(1)))
    compiling.start()
    started.wait(30)
    seen = torch.compiler.is_compiling()
    release.set()
    compiling.join()
    return seen


def _regions_not_reused() -> bool:
    return not has_region_reuse()


def _compiles_unseen_in_other_threads() -> bool:
    return not compiles_seen_in_every_thread()


WORKAROUNDS = (
    Workaround(
        "module globals",
        "Every frame the runtime compiles takes the globals of the model code it calls (`frames.py`): "
        "Dynamo imports an inlined function's module by its name, which a model loaded by "
        "`spec_from_file_location`, `runpy.run_path` or `exec` does not have.",
        "2.11 to 2.13",
        "pytorch/pytorch#181243 (fixed in 2.14 by pytorch/pytorch#184653)",
        has_inlined_module_imports,
        "when torch 2.13 leaves the supported range",
    ),
    Workaround(
        "regions traced for every block",
        "The owner is traced whole and its graph compiled in pieces, each distinct block once (`pieces.py`): "
        "Dynamo traces a nested region again for every block.",
        "2.11",
        "reuse of traced regions (`max_reuse_entries`) came in torch 2.12",
        _regions_not_reused,
        "when torch 2.11 leaves the supported range",
    ),
    Workaround(
        "reuse limit",
        "Regions are made with `max_reuse_entries=1024` (`nested.py`): torch keeps 8 variants a block class, "
        "and a deep stack whose blocks each read their own integer fails at its ninth layer.",
        "2.12 to 2.15",
        "not filed: found on a 32-layer Llama",
        _reuse_limit_low,
        "when torch's default keeps a variant for every layer of a deep stack",
    ),
    Workaround(
        "compiling in another thread",
        "`is_tracing` asks Dynamo's tracing context of the thread too (`internals/tracer.py`): "
        "`torch.compiler.is_compiling()` reads one flag of the process, set while any thread compiles.",
        "2.13 to 2.15",
        "not filed: found serving a model from several threads",
        _compiling_seen_across_threads,
        "when `is_compiling()` answers for the calling thread",
    ),
    Workaround(
        "calls while another thread compiles",
        "An owner's calls, and the compiles they make, run one at a time under the set-up lock "
        "(`threads.py`): AOTAutograd's trace sets FX's tracing flag for the process, and another thread's "
        "call of a compiled frame meanwhile raised (`Detected that you are using FX to symbolically trace a "
        "dynamo-optimized function`).",
        "2.11 and 2.12",
        "not filed: found serving a model from several threads; 2.13 holds `is_compiling()` for the compile",
        _compiles_unseen_in_other_threads,
        "when torch 2.12 leaves the supported range",
    ),
    Workaround(
        "a tracing thread that ends",
        "The no-op CUDA device guard that Dynamo's trace sets where CUDA is unavailable is set first from a "
        "thread kept for the process, as a model is set up (`internals/tracer.py`): it belonged to the "
        "thread that traced first, and once that thread ended, the next trace in another thread crashed (a "
        "segfault in `FakeTensorMode.__enter__`).",
        "2.11",
        "not filed: found serving a model from several threads",
        _regions_not_reused,
        "when torch 2.11 leaves the supported range",
    ),
    Workaround(
        "compiling ahead beside other threads",
        "A saved owner's compile ahead of its call, and its load, hold Dynamo's compile lock and mark a "
        "compile session, as Dynamo's own compiles do (`internals/aot.py`), and an owner's other calls wait "
        "for that frame (`saved.py`): `aot_compile` takes neither, and its trace patches "
        "`nn.Module.__call__` for the whole process, so a compile beside it in another thread left the "
        "patch in place and every later call failed (`Detected that you are using FX to symbolically trace "
        "a dynamo-optimized function`).",
        "2.13 (found); applied on every torch that saves",
        "not filed: found as calls from several threads failing after a first call that compiled ahead",
        None,
        "when `aot_compile` takes Dynamo's compile lock and compile session",
    ),
    Workaround(
        "gradients of repeated regions",
        "A call with autograd on compiles the blocks one by one (`owner.py`): Inductor's code for a graph "
        "holding repeated regions returns wrong gradients where a full compile's are exact. Its buffer reuse "
        "around the regions is the cause: with `allow_buffer_reuse` off they are right.",
        "2.13 to 2.15 (measured; 2.11 trains right); applied on every torch",
        "not filed: found by `regionalize verify`'s gradient check on Llama and ViT",
        None,
        "when a Llama compiled whole with its layers as regions trains as eager does with buffer reuse on "
        "(`scripts/bench_train.py --methods eager whole-reuse`) on every supported torch",
    ),
    Workaround(
        "regions reused across structures",
        "Each region takes the classes of its block's modules as an argument (`nested.py`): Dynamo reused a "
        "region traced for one block for another whose submodule is of another class.",
        "2.13 (measured); applied on every torch",
        "not filed: found by `regionalize verify` on ModernBERT",
        None,
        "when Dynamo's reuse check compares the classes of a region's modules",
    ),
    Workaround(
        "nested regions never nested",
        "A block that holds owners of blocks is never made a region (`outer.py`).",
        "2.12 to 2.15",
        "pytorch/pytorch#192905",
        None,
        "when nested regions inside regions reuse the right body",
    ),
    Workaround(
        "Inductor's CPU check",
        "Inductor's check of the CPU's instruction sets runs in a thread while Dynamo traces, and Inductor "
        "waits for it before it builds a kernel (`internals/cpu.py`): the check adds `-mavx512bf16` to a "
        "set's flags while it tries them, and a kernel built meanwhile took the flag into its cache key.",
        "2.11 to 2.15",
        "not filed: found restarting transformers' ConvNeXt",
        cpu_check_available,
        "when Inductor checks the CPU once, ahead of compiling, without changing shared flags",
    ),
    Workaround(
        "a saved owner's load",
        "A saved owner is loaded inside a tracing context (`internals/aot.py`): torch 2.13 rebuilds the "
        "guard of a module the trace imported (the runtime's, reached from the model's globals) as it reads "
        "the file, and that asks for a trace under way.",
        "2.13 (2.14 and 2.15 load without it); applied on every torch",
        "not filed: found saving the runtime's owner frame (docs/design-saved-owners.md)",
        None,
        "when torch 2.13 leaves the supported range",
    ),
    Workaround(
        "a saved owner's guards",
        "A saved owner records what its guards read that torch's load would not check, compares it before "
        "a load (`guard_reads.py`), and checks the guards torch dropped on every call (`watch.py`): "
        "`aot_compile` drops the guards it cannot save (which function, class or module a global or an "
        "attribute holds), from the frame it serves in the compiling process too, and its load builds the "
        "guards on globals from the globals at the load, so a flag or an activation function set at "
        "start-up, or a function rebound after the first call, went unchecked and the frame computed with "
        "the one it was compiled with. Dynamo's globals for the modules its code loads, named by their id "
        "in the saving process, are put back before the load.",
        "2.13 to 2.15; applied on every torch",
        "not filed: found by tests/test_saved_owners.py",
        None,
        "when a loaded frame's guards check what it was compiled for, globals and functions included",
    ),
    Workaround(
        "a saved owner's gradients",
        "An owner whose parameters hold gradients at its first call is not saved (`saved.py`): torch's "
        "guard state saves a gradient as a placeholder that its load fails to assign back (`TypeError: "
        "assigned grad expected to be a Tensor`), so every restart warned and compiled again.",
        "2.12 to 2.14 (2.11's load fails too, and saves nothing)",
        "not filed: found by tests/test_hierarchical.py (a backward, then a no_grad call); fixed in 2.15",
        lambda: not is_gradient_load_supported(),
        "when the oldest torch that saves owners is 2.15",
    ),
    Workaround(
        "compile caches on mixed CPUs",
        "The runtime adds the CPU (its architecture, flags and `ATEN_CPU_CAPABILITY`, and the C++ compiler) "
        "to the tag torch puts in every compile cache's key, `torch.compiler.config.cache_key_tag` "
        "(`cpu_keys.py`), and to its saved owners' keys: Inductor writes a CPU kernel for the vector "
        "instructions it picks, but keys its compiled graphs without them, so a cache made under "
        "`ATEN_CPU_CAPABILITY=avx2` and run on an AVX-512 CPU served the other's code, which crashed with a "
        "double free, and the reverse computed wrong numbers.",
        "2.12 to 2.15 (measured on 2.13); applied on every torch",
        "not filed: found running a cache made under another `ATEN_CPU_CAPABILITY` "
        "(tests/test_saved_owner_safety.py)",
        None,
        "when torch keys its compiled graphs on the vector instructions its kernels use",
    ),
    Workaround(
        "the CPU check's answers",
        "The builds of Inductor's CPU check that worked are kept under torch's cache directory, keyed by "
        "the CPU's flags, the compiler and torch's build, and a later process takes them (`cpu_answers.py`): "
        "Inductor builds and loads a program for each instruction set in every process, each load a "
        "process of its own: the floor of a saved owner's load.",
        "2.11 to 2.15",
        "not filed: found measuring saved owners' restarts (docs/design-saved-owners.md, try 7)",
        None,
        "when Inductor keeps its CPU check's answer across processes",
    ),
    Workaround(
        "marks of a saved frame",
        "A saved frame that does not take a call is checked again without the marks that the runtime set "
        "on the call's cache lengths (`saved.py`, `fits`), and they stay off where it takes it: torch "
        "rebuilds a loaded frame's guards from a saved state that keeps no marks, so they refuse any input "
        "that carries one, and the call of a restarted `generate` that marks the lengths never ran the "
        "saved frame of its decode steps.",
        "2.13 to 2.15",
        "not filed: found restarting a decoder's `generate`",
        None,
        "when torch's saved guard state keeps the marks of an input's sizes",
    ),
)


def needed() -> list[str]:
    """The names of the workarounds the running torch needs, by probing it."""
    return [w.name for w in WORKAROUNDS if w.needed()]
