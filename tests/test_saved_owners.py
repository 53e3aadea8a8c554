"""Saved owners (runtime/saved.py): a process saves its owner's compiled frame under torch's cache directory,
and a later process loads it and runs its first call with no frame traced, its output the eager model's.
Never stale (an edit in the model's module or in code it calls, a function or flag set at start-up, another
torch), never corrupt (a truncated file, two processes saving at once), never fatal (a cache directory that
cannot be written), on unless turned off. Each start is a fresh process, as a restart is."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import regionalize
from regionalize.runtime import saved as saved_owners
from regionalize.runtime.forms import WHOLE
from regionalize.runtime.internals import aot, compiler, tracer
from regionalize.runtime.state import Config, Findings, Plan

# Saving needs torch's ahead-of-time compile on by default (2.13 and later); 2.11 says why not.
SAVES = (
    aot.saving() is not None
    and hasattr(torch.compiler, "nested_compile_region")
    and tracer.has_region_reuse()
)

HELPER = """
import torch

FACTOR = 1.0


def relu(x):
    return torch.relu(x)


def tanh(x):
    return torch.tanh(x)


ACT = relu  # a function of the module's, and one of torch's, either set at start-up
POINTWISE = torch.sigmoid


def mix(x):
    return POINTWISE(ACT(x)) * FACTOR
"""

MODEL = """
import torch
from torch import nn

from helper import mix

SCALE = 1.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.act = torch.nn.functional.silu  # an attribute holding a function, set at start-up too

    def forward(self, x):
        return x + SCALE * self.fc2(self.act(mix(self.fc1(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
"""

# One start: build the model, compile it regionally (with `saved` as argv asks), call it twice (and once
# with another batch where asked), and print what its owner says, the frames Dynamo compiled, whether the
# outputs are eager's, and the runtime's warnings.
START = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
saved = {"on": True, "off": False, "env": None}[sys.argv[2]]
import torch
if len(sys.argv) > 3 and sys.argv[3] == "other-torch":
    torch.__version__ = torch.version.__version__ = "9.9.9"
import regionalize
import model as module
from model import Net
import helper
module.SCALE = float(next((a[6:] for a in sys.argv if a.startswith("scale=")), 1.0))  # set at start-up
helper.FACTOR = float(next((a[7:] for a in sys.argv if a.startswith("factor=")), 1.0))
helper.ACT = getattr(helper, next((a[4:] for a in sys.argv if a.startswith("act=")), "relu"))
helper.POINTWISE = getattr(torch, next((a[10:] for a in sys.argv if a.startswith("pointwise=")), "sigmoid"))
torch.manual_seed(0)
model = Net().eval()
if "attribute=tanh" in sys.argv:
    for block in model.blocks:
        block.act = torch.tanh
if "trained" in sys.argv:  # a backward before it serves: its parameters hold gradients
    model(torch.randn(3, 16)).sum().backward()
if "unloadable" in sys.argv:  # torch's load failing on the saved frame, as it does on some guard states
    import regionalize.runtime.saved as saved_owners

    def fails(file, f_globals):
        raise IndexError("list index out of range")

    saved_owners.aot_load = fails
x, y = torch.randn(2, 16), torch.randn(5, 16)
with torch.no_grad():
    expected, expected_y = model(x), model(y)
    regionalize.compile_regions(model, saved=saved)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [model(x), model(x)]
        if "other-batch" in sys.argv:
            outs.append(model(y))
from torch._dynamo.utils import counters
state = model.__dict__["_regionalize_owner"]
print(json.dumps({
    "saved": state.report.saved and str(state.report.saved),
    "same": all(torch.allclose(o, e, atol=1e-5) for o, e in zip(outs, [expected, expected, expected_y])),
    "traced": counters["stats"]["unique_graphs"],
    "warnings": [str(w.message) for w in caught if "regionalize" in str(w.message)],
    **({"compiler": "torch._inductor.compile_fx" in sys.modules} if "imports" in sys.argv else {}),
}))
"""

# A training start: three steps of the model through `compile_regions` and of an eager copy, which print
# what became of the blocks' saved frames, whether the losses are eager's, the frames Dynamo compiled, and
# the runtime's warnings. With "tanh-last", the last block's `act` holds another function.
TRAIN = """
import copy, json, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
import regionalize
from regionalize.bench.accounting import saved_owners
from model import Net
torch.manual_seed(0)
model = Net().train()
if "tanh-last" in sys.argv:
    model.blocks[-1].act = torch.tanh
eager = copy.deepcopy(model)
regionalize.compile_regions(model)
x = torch.randn(3, 16)  # the first block's input requires no gradient, the others' do


def losses(net):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    found = []
    for _ in range(3):
        loss = net(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        found.append(loss.item())
    return found


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = losses(model)
from torch._dynamo.utils import counters
traced = counters["stats"]["unique_graphs"]
print(json.dumps({
    "saved": regionalize.describe(model)[0].grad_saved,
    "verify says": saved_owners(model)["Net"],  # what verify's hot start reports of the owner
    "same": all(abs(a - b) < 1e-5 for a, b in zip(got, losses(eager))),
    "traced": traced,
    "warnings": [str(w.message) for w in caught if "regionalize" in str(w.message)],
}))
"""


def write_project(folder: Path) -> Path:
    """The model's modules and the start scripts in `folder`: a project no process has started on yet."""
    (folder / "helper.py").write_text(HELPER)
    (folder / "model.py").write_text(MODEL)
    (folder / "start.py").write_text(START)
    (folder / "train.py").write_text(TRAIN)
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path)


@pytest.fixture(scope="module")
def first_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project after its first start, which compiled the owner and saved it. Most tests begin there, and
    each takes a copy (`started`) rather than compiling the same model in a fresh process of its own."""
    folder = write_project(tmp_path_factory.mktemp("first-start"))
    assert start(folder) == {"saved": "saved", "same": True, "traced": 1, "warnings": []}
    return folder


@pytest.fixture
def started(first_start: Path, tmp_path: Path) -> Path:
    """A copy of the project after its first start: its modules, torch's cache and the saved owner."""
    shutil.copytree(first_start, tmp_path, dirs_exist_ok=True)
    return tmp_path


def start(
    project: Path,
    saved: str = "on",
    *extra: str,
    env: dict | None = None,
    wait: bool = True,
    script: str = "start.py",
):
    """A fresh process's start on `project`, with torch's cache in the project's folder."""
    environ = {k: v for k, v in os.environ.items() if k != "REGIONALIZE_SAVED_OWNERS"}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(project / "cache"), **(env or {}))
    command = [sys.executable, str(project / script), str(project), saved, *extra]
    process = subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return finish(process) if wait else process


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def files(project: Path, suffix: str = saved_owners.SUFFIX) -> list[Path]:
    """The saved owners' files, or every file in their folder (`""`)."""
    return sorted((project / "cache" / "regionalize" / "owners").glob(f"*{suffix}"))


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_restart_loads_the_saved_frame_and_traces_nothing(started: Path) -> None:
    # The first start saved one file and traced one frame (`first_start` checks its answer).
    assert [path.suffix for path in files(started, "")] == [saved_owners.SUFFIX]
    again = start(started)
    assert again == {"saved": "loaded", "same": True, "traced": 0, "warnings": []}


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_restart_that_loads_its_frame_does_not_import_inductors_compiler(started: Path) -> None:
    """A restart compiles nothing, so Inductor's compiler, a slow import that a load does not need, stays
    unimported: the form is planned without asking whether it could compile pieces."""
    again = start(started, "on", "imports")
    assert (again["saved"], again["traced"], again["compiler"]) == ("loaded", 0, False)


# Blocks that differ in a drop-path rate, as stochastic depth spaces them: the owner is compiled in pieces.
STOCHASTIC_DEPTH = MODEL.replace(
    "    def __init__(self):\n        super().__init__()\n        self.fc1",
    "    def __init__(self, rate=0.0):\n        super().__init__()\n        self.rate = rate\n"
    "        self.fc1",
).replace("[Block() for _ in range(4)]", "[Block(i / 10) for i in range(4)]")


@pytest.mark.skipif(
    not SAVES or compiler.inductor_pieces() is None, reason="this torch cannot save a frame in pieces"
)
def test_an_owner_compiled_in_pieces_is_saved_and_a_restart_traces_nothing(project: Path) -> None:
    """The saved frame holds each distinct compiled piece once; a restart loads it and runs the pieces with
    no frame traced and nothing compiled, its outputs eager's."""
    assert STOCHASTIC_DEPTH != MODEL
    (project / "model.py").write_text(STOCHASTIC_DEPTH)
    assert start(project) == {"saved": "saved", "same": True, "traced": 1, "warnings": []}
    assert start(project) == {"saved": "loaded", "same": True, "traced": 0, "warnings": []}
    # An edit of the block's module is seen as for any saved owner.
    (project / "model.py").write_text(STOCHASTIC_DEPTH.replace("SCALE * ", "2 * SCALE * "))
    edited = start(project)
    assert edited["same"] and edited["traced"] == 1 and edited["saved"] == "saved"


class Rated(torch.nn.Module):
    """A block scaled by a rate of its own, so that an owner of several is compiled in pieces."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.fc, self.rate = torch.nn.Linear(8, 8), rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.rate * torch.tanh(self.fc(x))


class RatedStack(torch.nn.Module):
    """Rated blocks with a stretch of ops between them, which the frame in pieces runs as traced."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Rated(i / 10) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == 1:
                x = torch.relu(x) * 0.5
        return x


@pytest.mark.skipif(
    not SAVES or compiler.inductor_pieces() is None, reason="this torch cannot save a frame in pieces"
)
def test_a_frame_in_pieces_loads_without_an_fx_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The load rebuilds the split graph and its traced pieces from their code without tracing it, since
    FX's trace patches `nn.Module.__call__` for the whole process, where another thread's call would meet
    it. A second model in the process loads what the first saved."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    first, x = RatedStack().eval(), torch.randn(2, 8)
    second = RatedStack().eval()
    second.load_state_dict(first.state_dict())
    with torch.no_grad():
        expected = first(x)
        regionalize.compile_regions(first, saved=True)(x)
        traces: list[str] = []
        trace = torch.fx.Tracer.trace
        monkeypatch.setattr(
            torch.fx.Tracer,
            "trace",
            lambda self, *a, **k: traces.append(type(self).__name__) or trace(self, *a, **k),
        )
        out = regionalize.compile_regions(second, saved=True)(x)
    [report] = regionalize.describe(second)
    assert (report.form, report.saved) == ("whole, in pieces", "loaded")
    assert "run as traced" in (report.pieces or "")  # a traced piece's code is loaded too
    torch.testing.assert_close(out, expected)
    assert traces == []


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_parameters_holding_gradients_are_saved_only_where_torch_loads_them(project: Path) -> None:
    """torch 2.13 and 2.14 save a gradient in the guards' state as a placeholder their load cannot assign
    back: such an owner is not saved there (a file that could not load would warn at every restart)."""
    first, again = start(project, "on", "trained"), start(project, "on", "trained")
    assert first["same"] and again["same"] and not first["warnings"] and not again["warnings"]
    if aot.is_gradient_load_supported():
        assert (first["saved"], again["saved"], again["traced"]) == ("saved", "loaded", 0)
    else:
        why = "not saved: its parameters hold gradients, which this torch cannot load"
        assert (first["saved"], again["saved"], again["traced"]) == (why, why, 1)
        assert not files(project, "")
    # A file that does not load (damaged here; an earlier release saved one with gradients) warns once:
    # saved over where the owner saves, removed where it does not.
    start(project)
    [frame] = files(project)
    frame.write_bytes(frame.read_bytes()[:100])
    damaged, after = start(project, "on", "trained"), start(project, "on", "trained")
    assert len(damaged["warnings"]) == 1 and "saved compile not loaded" in damaged["warnings"][0]
    assert damaged["same"] and after["same"] and not after["warnings"]


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_training_restart_loads_the_blocks_frames_and_traces_nothing(project: Path) -> None:
    """Calls with autograd run the blocks one by one; their frames, forward and backward, are saved: one
    for the first block, whose input requires no gradient, and one for the others."""
    first = start(project, script="train.py")
    assert first.pop("verify says") == "not saved: not called whole; blocks saved"
    assert first == {"saved": "saved", "same": True, "traced": 2, "warnings": []}
    assert len(files(project)) == 2
    again = start(project, script="train.py")
    assert again.pop("verify says") == "not saved: not called whole; blocks loaded"
    assert again == {"saved": "loaded", "same": True, "traced": 0, "warnings": []}
    # A block whose attribute holds another function than the one its class's frames were saved with
    # fails their check of the guards torch drops, and gets a frame of its own.
    other = start(project, "on", "tanh-last", script="train.py")
    assert other.pop("verify says") == "not saved: not called whole; blocks loaded"
    assert other == {"saved": "loaded", "same": True, "traced": 1, "warnings": []}
    assert len(files(project)) == 3


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_block_with_hooks_of_its_own_is_not_saved() -> None:
    """FSDP2 puts hooks on each block, which run inside its frame and hold state no file's key covers."""
    from regionalize.runtime.frames import new_frame
    from regionalize.runtime.saved_blocks import saved_frames

    blocks = [torch.nn.Linear(4, 4) for _ in range(2)]
    frame = new_frame(torch.nn.Linear, "hooks")
    assert saved_frames(blocks[0], frame, {}, blocks[0]) is not None
    blocks[1].register_forward_pre_hook(lambda module, args: None)
    assert saved_frames(blocks[1], frame, {}, blocks[1]) is None


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_block_no_saved_frame_serves_runs_its_own_call_once_every_try_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Such a block (another drop-path rate) checks no saved frame's guards on its later calls."""
    from regionalize.runtime.frames import new_frame
    from regionalize.runtime.saved_blocks import saved_frames

    block, calls = torch.nn.Linear(4, 4), []
    frames = saved_frames(block, new_frame(torch.nn.Linear, "own"), {}, lambda x: calls.append(x) or x)
    frames.tried.update({"first", "call 1", "call 2"})  # every try made, none serving this block
    x = torch.ones(1, 4)
    assert frames(block, x) is x
    monkeypatch.setattr(type(frames), "serving", lambda *args: pytest.fail("checked the saved frames"))
    assert frames(block, x) is x and len(calls) == 2


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_frame_torch_cannot_load_back_is_not_kept(project: Path) -> None:
    """The saved frame is loaded back before it is kept: one torch's load fails on is not saved (every later
    start would warn of it), and the start runs as without saving, without a warning."""
    why = "not saved: torch's load of it fails (IndexError: list index out of range)"
    for _ in range(2):
        assert start(project, "on", "unloadable") == {"saved": why, "same": True, "traced": 1, "warnings": []}
        assert not files(project, "")
    assert start(project)["saved"] == "saved" and start(project)["saved"] == "loaded"


@pytest.mark.same_on_every_torch
@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_on_unless_turned_off(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off for the process (`REGIONALIZE_SAVED_OWNERS=0`) or for a model (`saved=False`, which the
    environment does not override); on otherwise."""
    for value, on in (
        ("0", False),
        ("false", False),
        ("No", False),
        (" off ", False),
        ("1", True),
        ("", True),
    ):
        monkeypatch.setenv("REGIONALIZE_SAVED_OWNERS", value)
        assert (
            saved_owners.wanted(None) is on and saved_owners.wanted(True) and not saved_owners.wanted(False)
        )
    assert start(project, "env", env={"REGIONALIZE_SAVED_OWNERS": "off"})["saved"] is None
    assert start(project, "off", env={"REGIONALIZE_SAVED_OWNERS": "1"})["saved"] is None
    assert not files(project, "")
    assert start(project, "env")["saved"] == "saved"
    assert start(project, "env", env={"REGIONALIZE_SAVED_OWNERS": "1"})["saved"] == "loaded"


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_an_edit_runs_the_edited_code(started: Path) -> None:
    # The model's own module keys the file: an edit saves another.
    model = started / "model.py"
    model.write_text(MODEL.replace("return x + SCALE * self.fc2", "return x + 2 * SCALE * self.fc2"))
    assert start(started) == {"saved": "saved", "same": True, "traced": 1, "warnings": []}
    assert len(files(started)) == 2
    # A helper in another module is checked line for line on load: compiled again, and saved over.
    (started / "helper.py").write_text(HELPER.replace("torch.relu(x)", "torch.tanh(x)"))
    edited = start(started)
    assert edited["saved"] == "saved" and edited["same"] and edited["traced"] == 1
    [warning] = edited["warnings"]
    assert "Net's saved compile not loaded (helper:" in warning and "changed since it was saved" in warning
    assert start(started)["saved"] == "loaded"


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
@pytest.mark.parametrize(
    ("setting", "name"),
    [
        ("scale=2.0", "the global SCALE"),
        ("factor=3.0", "the global helper.FACTOR"),
        ("act=tanh", "the global helper.ACT"),
        ("pointwise=tanh", "the global helper.POINTWISE"),
        ("attribute=tanh", "self._modules['blocks']._modules['0'].act"),
    ],
)
def test_a_global_set_at_start_up_is_checked(started: Path, setting: str, name: str) -> None:
    """torch's `aot_compile` drops the guards it cannot save (which function an attribute or a global
    holds), and rebuilds those on globals from the globals as they are at the load: a frame saved with one
    value of a module's flag, or one function of two, would compute with it after a load where the process
    set another."""
    other = start(started, "on", setting)
    assert other["saved"] == "saved" and other["same"] and other["traced"] == 1
    [warning] = other["warnings"]
    assert f"({name} changed since it was saved)" in warning
    assert start(started, "on", setting)["saved"] == "loaded"


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_another_torch_loads_nothing(started: Path) -> None:
    other = start(started, "on", "other-torch")
    assert other == {"saved": "saved", "same": True, "traced": 1, "warnings": []}
    assert len(files(started)) == 2


@pytest.mark.same_on_every_torch
@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_damaged_file_is_compiled_again_and_rewritten(started: Path) -> None:
    for damage in ("truncated", "garbage", "empty", "another frame", "records edited"):  # each rewritten
        [path] = files(started)
        data = path.read_bytes()
        damaged = {
            "truncated": data[: len(data) // 2],
            "garbage": b"\x80\x04junk" * 50,
            "empty": b"",
            "another frame": data[:-10] + bytes(10),  # the records name the frame's hash
            "records edited": data.replace(b'"how": "is"', b'"how": "xx"', 1),
        }[damage]
        assert damaged != data, damage
        path.write_bytes(damaged)
        again = start(started)
        assert again["saved"] == "saved" and again["same"] and again["traced"] == 1, damage
        [warning] = again["warnings"]
        assert (
            warning.startswith("regionalize: Net's saved compile not loaded (") and "compiling it" in warning
        )
    assert start(started)["saved"] == "loaded"


@pytest.mark.same_on_every_torch
@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_two_processes_saving_at_once(project: Path) -> None:
    both = [start(project, wait=False) for _ in range(2)]
    for result in map(finish, both):
        assert result["same"] and result["saved"] in ("saved", "loaded") and not result["warnings"]
    # whole files only, no temporary left
    assert [path.suffix for path in files(project, "")] == [saved_owners.SUFFIX]
    assert start(project)["saved"] == "loaded"


@pytest.mark.same_on_every_torch
@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_cache_directory_that_cannot_be_written(project: Path) -> None:
    # Where the owners' folder should be, a file: the save fails as in a read-only directory (the tests may
    # run as root, which writes anywhere).
    (project / "cache").mkdir()
    (project / "cache" / "regionalize").write_text("")
    result = start(project)
    assert result["same"] and result["traced"] == 1 and result["saved"].startswith("not saved: ")
    [warning] = result["warnings"]
    assert warning.startswith("regionalize: Net's compile not saved (")


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_a_call_its_guards_do_not_hold_compiles_as_today(started: Path) -> None:
    result = start(started, "on", "other-batch")
    assert result == {"saved": "loaded", "same": True, "traced": 1, "warnings": []}


def test_where_it_cannot_save_it_says_why(project: Path) -> None:
    """A module not imported by name (its text cannot key the file), or a torch that cannot save: the
    owner runs as without saving, its state saying why."""
    script = textwrap.dedent(
        """
        import sys, torch, regionalize
        source = open(sys.argv[1] + "/model.py").read().replace("from helper import mix", "mix = torch.relu")
        namespace = {"__name__": "built_by_exec"}
        exec(compile(source, "<model>", "exec"), namespace)
        model = namespace["Net"]().eval()
        x = torch.randn(2, 16)
        with torch.no_grad():
            expected = model(x)
            regionalize.compile_regions(model, saved=True)
            assert torch.allclose(model(x), expected, atol=1e-5)
        print(model.__dict__["_regionalize_owner"].report.saved)
        """
    )
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(project / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(project)], env=environ, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.strip().splitlines()[-1]
    if aot.saving() is None:
        assert said == "not saved: this torch cannot save a compiled frame"
    elif hasattr(torch.compiler, "nested_compile_region") and tracer.has_region_reuse():
        assert said == "not saved: its code is not in a module imported by name"
    else:
        assert said.startswith("not saved: it is compiled ")
    assert not files(project, "")


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_guard_bypass_and_cuda_graph_modes_say_why_they_are_not_saved(project: Path) -> None:
    """The guard bypass (its filter handed in the options, as the API documents it, or the dispatcher) and a
    CUDA-graph mode run as without saving, each saying why; the options handed in keep their filter for
    every later compile (torch.compile pops it from the dict it is given)."""
    script = textwrap.dedent(
        """
        import json, sys, torch, regionalize
        sys.path.insert(0, sys.argv[1])
        from model import Net
        said = {}
        for name in ("filter", "depyf", "reduce-overhead"):
            torch.manual_seed(0)
            model, x = Net().eval(), torch.randn(2, 16)
            options = {"guard_filter_fn": regionalize.guard_filter}
            with torch.no_grad():
                expected = model(x)
                if name == "filter":
                    regionalize.compile_regions(model, options=options)
                elif name == "depyf":
                    regionalize.compile_region(*model.blocks, owner=model, guard_bypass=name)
                else:
                    regionalize.compile_regions(model, mode=name)
                same = all(torch.allclose(model(x), expected, atol=1e-5) for _ in range(2))
            state = model.__dict__["_regionalize_owner"]
            said[name] = [state.report.saved and str(state.report.saved), same, "guard_filter_fn" in options]
        print(json.dumps(said))
        """
    )
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(project / "cache")}
    environ.pop("REGIONALIZE_SAVED_OWNERS", None)
    done = subprocess.run(
        [sys.executable, "-c", script, str(project)], env=environ, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {
        "filter": [f"not saved: {saved_owners.BYPASS_FILTER}", True, True],
        "depyf": [f"not saved: {saved_owners.BYPASS_DEPYF}", True, True],
        "reduce-overhead": [f"not saved: {saved_owners.GRAPH_MODES}", True, True],
    }
    assert not files(project, "")


@pytest.mark.same_on_every_torch
@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
def test_verify_says_what_each_hot_start_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from regionalize.cli.verify_command import verify

    models = Path(__file__).parent / "models"
    monkeypatch.delenv("REGIONALIZE_SAVED_OWNERS", raising=False)  # on by default
    out = tmp_path / "result.json"
    args = [str(models / "stack.py"), "--factory", "make"]  # rewritten by the codemod, in the default form
    run = CliRunner().invoke(
        verify,
        [
            *args,
            "--repeats",
            "1",
            "--starts",
            "hot",
            "--skip",
            "per-block",
            "--skip",
            "dedup",
            "--skip",
            "bypass",
            "--json",
            str(out),
        ],
    )
    assert run.exit_code == 0, run.output
    result = json.loads(out.read_text())
    assert result["saved_owners_hot"] == {"regional": {"Stack": "loaded"}}
    assert result["saved_owner_bytes"]["regional"] > 0
    assert "regional hot start, saved owners: Stack loaded" in run.stdout
    assert re.search(r"saved owners size[ -]+\d+ KiB", run.stdout)


# transformers' models as users build them: a ViT's encoder reads functions, classes and modules through
# globals of transformers' own (its attention registry, its output classes) that torch cannot save guards on;
# a Llama's `generate` with its cache (dynamic or static) passes the blocks' cache stand-ins.
TRANSFORMERS = """
import json, sys, warnings
import torch, transformers, regionalize
torch.manual_seed(0)
kind = sys.argv[1]
if kind == "vit":
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128, image_size=32,
        patch_size=8,
    )
    model, x = transformers.ViTModel(config).eval(), torch.randn(1, 3, 32, 32)
    run = lambda: model(x).last_hidden_state
elif kind == "bart":  # an encoder and a decoder, each an owner; the decoder's first step holds one token
    config = transformers.BartConfig(
        vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
    )
    model, ids = transformers.BartForConditionalGeneration(config).eval(), torch.randint(3, 100, (1, 8))
    # At least six tokens: the decoder's steps past its one-token call, which a random BART may end sooner.
    run = lambda: model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
else:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100,
    )
    model, ids = transformers.LlamaForCausalLM(config).eval(), torch.randint(0, 100, (1, 8))
    extra = {"cache_implementation": "static"} if kind == "static" else {}
    run = lambda: model.generate(ids, max_new_tokens=4, do_sample=False, **extra)
with torch.no_grad():
    expected = run()
    regionalize.compile_regions(model, saved=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
from torch._dynamo.utils import counters
print(json.dumps({
    "saved": sorted({str(report.saved) for report in regionalize.describe(model)}),
    "traced": counters["stats"]["unique_graphs"],
    "same": torch.allclose(out.float(), expected.float(), atol=1e-5),
    "warnings": [str(w.message) for w in caught if "regionalize" in str(w.message)],
    **({"compiler": "torch._inductor.compile_fx" in sys.modules} if "imports" in sys.argv else {}),
}))
"""


@pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")
@pytest.mark.parametrize("kind", ["vit", "dynamic", "bart", "static"])
def test_transformers_models_are_saved_and_loaded(tmp_path: Path, kind: str) -> None:
    """After a restart the first call is loaded: a ViT's forward, a decoder's first token (its prefill), an
    encoder-decoder's encoder and decoder. So are a `DynamicCache`'s steps, whose frame, its length dynamic,
    serves every token: a restarted `generate` traces nothing. A `StaticCache`'s steps are served per block
    and compile as without saving."""
    pytest.importorskip("transformers")
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}

    def start() -> dict:
        command = [sys.executable, "-c", TRANSFORMERS, kind]
        done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, again = start(), start()
    assert {**first, "traced": None} == {"saved": ["saved"], "same": True, "traced": None, "warnings": []}
    assert {**again, "traced": None} == {"saved": ["loaded"], "same": True, "traced": None, "warnings": []}
    assert first["traced"] > 0
    if kind != "static":
        assert again["traced"] == 0


def test_the_key_names_the_runtime_that_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vendored copy beside the package, or another release, keys files of its own: its code is traced
    into the frame, and a file of the other would be found changed on load, with a warning."""
    from regionalize.runtime import saved

    saved._runtime.cache_clear()
    package = saved._runtime()
    monkeypatch.setattr(saved, "__package__", "_regionalize")
    saved._runtime.cache_clear()
    try:
        assert saved._runtime() != package
    finally:
        saved._runtime.cache_clear()


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_the_key_names_the_runtime_whose_region_a_block_class_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block class whose region another runtime copy installed (both in one process) traces that copy's
    code into the frame: it keys a file of its own, not one a later process would find changed on load."""
    from regionalize.runtime import saved

    model, x = _Net(), torch.randn(2, 4)
    state = types.SimpleNamespace(
        report=Findings(Plan(WHOLE)), config=Config({}, direct=False, save=True), blocks=model.blocks
    )
    first = saved.key(model, state, (x,), {})
    assert saved.key(model, state, (x,), {}) == first
    region = type("Region", (), {"__module__": "runtime_copy_1.regions"})()  # as another copy installs it
    monkeypatch.setattr(_Block, "_regionalize_region", region, raising=False)
    assert saved.key(model, state, (x,), {}) != first


def test_the_key_covers_the_calls_keyword_inputs_and_the_compile_options() -> None:
    """A call's keyword names and inputs, and the owner's compile options, each name a file of their own."""
    from regionalize.runtime import saved

    model, x = _Net(), torch.randn(2, 4)

    def key(options: dict[str, object], kwargs: dict[str, object]) -> str:
        state = types.SimpleNamespace(
            report=Findings(Plan(WHOLE)), config=Config(options, direct=False, save=True), blocks=model.blocks
        )
        return saved.key(model, state, (x,), kwargs)

    keys = {
        key({}, {}),
        key({}, {"y": x}),
        key({}, {"y": x[:1]}),
        key({}, {"z": x}),
        key({"dynamic": False}, {}),
    }
    assert len(keys) == 5
