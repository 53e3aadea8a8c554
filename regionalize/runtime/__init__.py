# regionalize runtime 32: written by regionalize, which updates it on a later run; do not edit.
"""Runs the models that regionalize rewrote, with torch alone installed (docs/compile-forms.md).

Each module has one job:

- `api.py` defines the public API that rewritten models call, and `compile_regions` for a built model.
- `owner.py` sets an owner up, compiles it in its form, serves its calls, and steps down the ladder.
- `forms.py` defines each form an owner takes as a class, and the ladder of fallbacks between them.
- `plan.py` picks the form that an owner takes at its first call.
- `state.py` holds what the runtime keeps for each owner and for the process.
- `describe.py` describes each owner of a model as a record: its form, why, and its saved frame.
- `regions.py` makes a block class's `forward` a nested compile region.
- `stand_in.py` runs a block in regions with a stand-in for its cache's layer.
- `nested.py` wraps a function as a nested compile region with flat arguments and packed outputs.
- `outer.py` lets a module that holds stages take their blocks and be compiled as one owner.
- `pieces.py` splits an owner's graph at its blocks and compiles each distinct piece once.
- `pieces_frame.py` runs a frame compiled in pieces, in CUDA graphs where it can, and saves it.
- `per_block.py` compiles each block on its own, the fallback form.
- `kv.py` stands in for a block's layer of a transformers `DynamicCache` or `EncoderDecoderCache`.
- `static.py` stands in for a block's layer of a transformers `StaticCache`.
- `around.py` lets an owner serve the calls that a compile around the model hands over to it.
- `graphs.py` decides what one CUDA graph can serve and copies the outputs that a caller keeps.
- `frames.py` makes the frames that the runtime compiles, in the globals of the model's code.
- `threads.py` keeps the state of each thread's call and the lock that sets owners up once.
- `stack.py` gives an owner's call a fresh chunk of Python's frame stack.
- `constants.py` finds blocks of one class that differ in float constants.
- `fixes.py` holds what the codemod's fixes call: `eager` and `symbolic_ints`.
- `bypass.py` implements the guard bypass: filtered guards, or compiled code called directly.
- `saved.py` saves an owner's compiled frame and loads it in a later process.
- `saved_blocks.py` saves the frames of blocks that calls with autograd run one by one.
- `guard_paths.py`, `guard_reads.py` and `watch.py` record and check what a saved frame's guards read.
- `files.py` writes the runtime's files whole and reads them only from folders that others cannot write.
- `cpu_keys.py` keys compiled code on the CPU; `cpu_answers.py` keeps the answers of Inductor's CPU check.
- `internals/` reaches every private name of torch that the runtime uses, each behind a probe.

`--vendor` copies this package, unchanged, into a rewritten package as `_regionalize/` (docs/vendoring.md).
"""

from . import api
from .api import *  # noqa: F403 (the public names, listed once in api.py)

__all__ = api.__all__
