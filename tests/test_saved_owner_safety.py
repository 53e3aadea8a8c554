"""Saved owners keep `torch.compile`'s semantics and run no code but the user's (runtime/saved.py,
guard_reads.py, guard_paths.py, files.py): a function rebound after the first call is called, in the process
that saved and in one that loaded; two functions of one bytecode with other constants are told apart; the
records and the frame are one file, whole, whatever fails while it is written; a file in a folder others
can write is never loaded, and nothing read from a file is evaluated; torch's caches are keyed on the CPU.
Each start is a fresh process, as a restart is."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from regionalize.runtime import saved as saved_owners
from regionalize.runtime.guard_paths import is_valid, parse, render
from regionalize.runtime.internals import aot, tracer

SAVES = (
    aot.saving() is not None
    and hasattr(torch.compiler, "nested_compile_region")
    and tracer.has_region_reuse()
)
needs_saving = pytest.mark.skipif(not SAVES, reason="this torch cannot save a compiled frame")

HELPER = """
import os
import torch


def act(x):
    return torch.relu(x)


def other_act(x):
    return torch.tanh(x) * 3


# Built by `exec` from one text with another constant at each start: one bytecode, other `co_consts`.
_made = {}
exec(f"def scale(x):\\n    return x * {float(os.environ.get('SCALE', '1'))}\\n", _made)
scale = _made["scale"]
"""

MODEL = """
import torch
from torch import nn

import helper


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.fn = torch.sigmoid

    def forward(self, x):
        return x + self.fn(helper.scale(helper.act(self.fc(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
"""

# One start: compile the model regionally (saving on, unless "off"), call it, then rebind what argv asks
# and call it again; print each call's largest difference from the model computed by hand (eagerly), what
# the owner says, the frames Dynamo compiled and the runtime's warnings. "write=fail" makes the saved
# file's write fail part-way (the file size limit), "write=kill" kills the process part-way through it.
START = """
import json, os, resource, signal, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
import regionalize
import regionalize.runtime.files as files
import helper
from model import Net

if "write=fail" in sys.argv or "write=kill" in sys.argv:
    write_whole = files.write_whole

    def failing(path, fill):
        def part(temp):
            fill(temp)
            if "write=kill" in sys.argv:  # half written, then killed
                os.truncate(temp, os.path.getsize(temp) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            data = open(temp, "rb").read()
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(data) // 2, hard))
            try:
                with open(temp, "wb") as file:
                    file.write(data)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

        return write_whole(path, part)

    import regionalize.runtime.saved as saved
    saved.write_whole = failing

torch.manual_seed(0)
model = Net().eval()
x = torch.randn(2, 16)


def by_hand():
    out = x
    for block in model.blocks:
        out = out + block.fn(helper.scale(helper.act(block.fc(out))))
    return out


regionalize.compile_regions(model, saved="off" not in sys.argv)
diffs = []
with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    diffs.append((model(x) - by_hand()).abs().max().item())
    if "rebind=global" in sys.argv:
        helper.act = helper.other_act
    if "rebind=attribute" in sys.argv:
        for block in model.blocks:
            block.fn = torch.tanh
    diffs.append((model(x) - by_hand()).abs().max().item())
from torch._dynamo.utils import counters
print(json.dumps({
    "saved": str(model.__dict__["_regionalize_owner"].report.saved),
    "same": max(diffs) < 1e-5,
    "diffs": diffs,
    "traced": counters["stats"]["unique_graphs"],
    "warnings": [str(w.message) for w in caught if "regionalize" in str(w.message)],
}))
"""


def write_project(folder: Path) -> Path:
    """The model's modules and the start script in `folder`: a project no process has started on yet."""
    (folder / "helper.py").write_text(HELPER)
    (folder / "model.py").write_text(MODEL)
    (folder / "start.py").write_text(START)
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path)


@pytest.fixture(scope="module")
def first_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project after its first start (SCALE 1), which compiled the owner and saved it. Several tests begin
    there, and each takes a copy (`started`) rather than compiling the same model in a process of its own."""
    folder = write_project(tmp_path_factory.mktemp("first-start"))
    first = start(folder)
    assert (first["saved"], first["same"], first["warnings"]) == ("saved", True, []), first
    return folder


@pytest.fixture
def started(first_start: Path, tmp_path: Path) -> Path:
    """A copy of the project after its first start: its modules, torch's cache and the saved owner."""
    shutil.copytree(first_start, tmp_path, dirs_exist_ok=True)
    return tmp_path


def start(project: Path, *extra: str, env: dict | None = None, wait: bool = True):
    """A fresh process's start on `project`, with torch's cache in the project's folder."""
    environ = {k: v for k, v in os.environ.items() if k not in ("REGIONALIZE_SAVED_OWNERS", "SCALE")}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(project / "cache"), **(env or {}))
    command = [sys.executable, str(project / "start.py"), str(project), *extra]
    process = subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return finish(process) if wait else process


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def owner_files(project: Path) -> list[Path]:
    return sorted((project / "cache" / "regionalize" / "owners").glob(f"*{saved_owners.SUFFIX}"))


@needs_saving
@pytest.mark.parametrize("rebind", ["rebind=global", "rebind=attribute"])
def test_a_function_rebound_after_the_first_call_is_called(project: Path, rebind: str) -> None:
    """torch's saved frame drops the guards on which function a name holds; the runtime checks them on
    every call, and a call where one fails compiles again, as `torch.compile` does: in the process that
    saved the frame and in one that loaded it."""
    first = start(project, rebind)
    assert (first["saved"], first["same"], first["warnings"]) == ("saved", True, []), first
    assert first["traced"] == 2  # the rebound function's call compiled again
    again = start(project, rebind)
    assert (again["saved"], again["same"], again["warnings"]) == ("loaded", True, []), again
    assert again["traced"] == 1


@needs_saving
def test_one_bytecode_with_another_constant_is_told_apart(started: Path) -> None:
    """A function built by `exec` from one text with another constant has the same bytecode: its constants
    are part of what the file records of it."""
    other = start(started, env={"SCALE": "2"})
    assert other["same"] and other["saved"] == "saved" and other["traced"] == 1, other
    [warning] = other["warnings"]
    assert "(the global helper.scale changed since it was saved)" in warning
    assert start(started, env={"SCALE": "2"})["saved"] == "loaded"


@pytest.mark.same_on_every_torch
@needs_saving
@pytest.mark.parametrize("fault", ["write=fail", "write=kill"])
def test_a_write_that_fails_part_way_leaves_the_file_before_it(started: Path, fault: str) -> None:
    """The records and the frame are one file, renamed into place whole: a write that fails (the disk
    full) or a process killed while writing leaves the file as it was, which a later start loads."""
    [path] = owner_files(started)
    before = path.read_bytes()
    environ = {k: v for k, v in os.environ.items() if k != "REGIONALIZE_SAVED_OWNERS"}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(started / "cache"), SCALE="2")
    command = [sys.executable, str(started / "start.py"), str(started), fault]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600)
    if fault == "write=kill":
        assert done.returncode == -9, done.stderr[-3000:]
    else:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["same"] and result["saved"].startswith("not saved: OSError"), result
    assert owner_files(started) == [path] and path.read_bytes() == before
    assert start(started, env={"SCALE": "1"})["saved"] == "loaded"
    redone = start(started, env={"SCALE": "2"})
    assert redone["same"] and redone["saved"] == "saved"


@needs_saving
def test_two_processes_with_other_code_writing_one_file(project: Path) -> None:
    """Two starts at once whose code differs in what the file's name does not cover: whichever file stays
    is whole, and each code then gets its own answer from it."""
    both = [start(project, env={"SCALE": scale}, wait=False) for scale in ("1", "2")]
    for result in map(finish, both):
        assert result["same"] and result["saved"] == "saved", result
    assert len(owner_files(project)) == 1
    results = [start(project, env={"SCALE": scale}) for scale in ("1", "1", "2", "2")]
    assert all(result["same"] for result in results)
    assert [result["saved"] for result in results[1::2]] == ["loaded", "loaded"]


class _Payload:
    """Unpickled, it writes a marker file: what a planted file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


@pytest.mark.same_on_every_torch
@needs_saving
def test_a_folder_others_can_write_is_never_loaded_from(started: Path) -> None:
    """A file in a folder that another user could write is not unpickled: one warning, and the owner
    compiles as without saving."""
    [path] = owner_files(started)
    marker = started / "ran"
    kept, _ = saved_owners.unpack(path.read_bytes())
    payload = pickle.dumps(_Payload(marker))
    del kept["format"], kept["frame"]
    path.write_bytes(saved_owners.pack(kept, payload))
    cache = started / "cache"
    cache.chmod(0o777)
    result = start(started)
    assert result["same"] and result["traced"] == 1 and not marker.exists()
    why = f"{cache} can be written by others"
    assert result["saved"] == f"not saved: {why}"
    [warning] = result["warnings"]
    assert warning.startswith(f"regionalize: saved compiles not loaded or saved ({why}: whoever can write")


@pytest.mark.same_on_every_torch
@needs_saving
def test_records_are_data_never_evaluated(started: Path) -> None:
    """A record's path is looked up, never evaluated: a file whose records hold code runs none of it."""
    [path] = owner_files(started)
    marker = started / "ran"
    kept, frame = saved_owners.unpack(path.read_bytes())
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    kept["reads"][0]["path"] = [["global", code]]
    del kept["format"], kept["frame"]
    path.write_bytes(saved_owners.pack(kept, frame))
    result = start(started)
    assert result["same"] and not marker.exists()
    [warning] = result["warnings"]
    assert "saved compile not loaded" in warning


@needs_saving
def test_a_cache_made_for_another_vector_instruction_set(project: Path) -> None:
    """torch keys its compiled graphs without the CPU's vector instruction set: a cache made under one gave
    wrong numbers, or corrupted memory, under another. The runtime keys its files and torch's caches on it,
    with saving on and off."""
    for saving in ("on", "off"):
        for capability in ("avx2", "", "avx2"):
            result = start(project, saving, env={"ATEN_CPU_CAPABILITY": capability})
            assert result["same"] and not result["warnings"], (saving, capability, result)
    assert len(owner_files(project)) == 2


def test_a_guards_source_becomes_a_path_of_look_ups() -> None:
    source = "dict(type(self._modules['blocks']._modules['0']).__dict__)['forward'].__kwdefaults__['r']"
    path = parse(source)
    assert path is not None and is_valid(path)
    assert render(path) == source
    assert render(parse("G['__import_helper'].ACT")) == "the global helper.ACT"
    assert render(parse("__import__('torch').utils")) == "torch.utils"
    for other in ("G['a'].f(1)", "self.x[y]", "G['a'] + 1", "getattr(self, 'x')", "__import__(name)", "G[0]"):
        assert parse(other) is None, other
    for planted in (
        [["global", "x"], ["attr", "a b"]],
        [["eval", "x"]],
        [["arg", "x"], ["call", "exec"]],
        "x",
    ):
        assert not is_valid(planted), planted


ACT = torch.relu  # a global of this module's that a watched frame reads


def _frame(self: object, x: torch.Tensor) -> torch.Tensor:
    return ACT(x)


def test_the_watch_fails_where_a_dropped_guard_would() -> None:
    """The check made from the dropped guards' paths: true while every path finds what it found, false
    once one is rebound or no longer leads anywhere; kept guards (torch checks those) are not watched."""
    from regionalize.runtime.guard_reads import reads_of
    from regionalize.runtime.watch import Watch

    owner = torch.nn.Module()
    owner.inner = torch.nn.Linear(2, 2)
    owner.inner.fn = torch.tanh
    guards = [
        ("is", "G['ACT']", torch.relu, True),
        ("is", "self._modules['inner'].fn", torch.tanh, True),
        ("len", "self._modules['inner'].weight.shape", torch.Size([2, 2]), True),
        ("is", "G['torch'].sigmoid", torch.sigmoid, False),  # kept: torch's own guards check it
    ]
    watch = Watch(reads_of(guards), _frame)
    call = (owner, (torch.ones(2),), {})
    assert watch.is_unchanged(*call)
    global ACT
    ACT = torch.sigmoid
    try:
        assert not watch.is_unchanged(*call)
    finally:
        ACT = torch.relu
    assert watch.is_unchanged(*call)
    owner.inner.fn = torch.sin
    assert not watch.is_unchanged(*call)
    del owner.inner.fn
    assert not watch.is_unchanged(*call)  # the path leads nowhere
    owner.inner.fn = torch.tanh
    assert watch.is_unchanged(*call)
    with pytest.raises(ValueError, match="cannot be checked on each call"):
        Watch(reads_of([("is", "G['a'] + 1", 1, True)]), _frame)


def _helper(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _framed(self: object, x: torch.Tensor, act: object = torch.relu) -> torch.Tensor:
    return _helper(x)


def test_the_watch_reads_code_by_content_and_arguments_as_bound() -> None:
    """A code object is the same where it is the same object or has the same content, and differs where a
    constant differs; an argument is read as the call binds it, a default where the call leaves it out."""
    from regionalize.runtime.guard_reads import reads_of
    from regionalize.runtime.watch import Watch

    code = _helper.__code__
    guards = [("value", "G['_helper'].__code__", code, True), ("is", "act", torch.relu, True)]
    watch = Watch(reads_of(guards), _framed)
    owner, x = torch.nn.Module(), torch.ones(2)
    assert watch.is_unchanged(owner, (x,), {})
    assert not watch.is_unchanged(owner, (x,), {"act": torch.tanh})
    assert not watch.is_unchanged(owner, (x, torch.tanh), {})
    assert not watch.is_unchanged(owner, (), {})  # the call does not bind
    try:
        _helper.__code__ = code.replace(co_consts=tuple(3 if c == 2 else c for c in code.co_consts))
        assert not watch.is_unchanged(owner, (x,), {})
        _helper.__code__ = code.replace()  # another object of the same content
        assert _helper.__code__ is not code
        assert watch.is_unchanged(owner, (x,), {})
    finally:
        _helper.__code__ = code


def test_only_a_folder_no_one_else_can_write_is_trusted(tmp_path: Path) -> None:
    """As ssh checks its keys: the user's (or root's) folders, writable by no one else; a sticky folder of
    root's (/tmp) may be open to all."""
    from regionalize.runtime.files import distrust, make_folder

    folder = tmp_path / "cache" / "regionalize" / "owners"
    make_folder(str(folder))
    assert (folder.stat().st_mode & 0o777, folder.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    path = str(folder / "x.owner")
    assert distrust(path) is None
    (tmp_path / "cache").chmod(0o777)
    assert distrust(path) == f"{tmp_path / 'cache'} can be written by others"
    (tmp_path / "cache").chmod(0o1777)  # sticky: others cannot replace what is in it, if root owns it
    assert (distrust(path) is None) == (os.geteuid() == 0)
    (tmp_path / "cache").chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "cache")
    assert distrust(str(link / "regionalize" / "owners" / "x.owner")) is None
    if os.geteuid() == 0:  # a folder another user owns (root can make one here)
        os.chown(tmp_path / "cache", 12345, 12345)
        assert distrust(path) == f"{tmp_path / 'cache'} belongs to another user"
        assert distrust(str(link / "regionalize")) is not None  # through the link too
