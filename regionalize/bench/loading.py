"""Find the factory, import the original model module and its rewrite side by side.

Torch-free on purpose: the CLI resolves and reports a bad --factory before paying for `import torch`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from regionalize.codemod import runtime_copy
from regionalize.codemod.package import module_name_for

REWRITTEN_SUFFIX = "__regionalized"
# A stand-alone script is imported under a prefixed name: its bare stem ("model", "types") could be taken.
SCRIPT_PREFIX = "_regionalize_script_"
_OWN_DIR = str(Path(__file__).resolve().parent.parent)
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class VerifyError(Exception):
    """Something in the user's code or setup failed before any check could run: exit status 2.

    `stage` says which step failed ("factory", "import original", ...); `details` carries the user's
    traceback with our own frames removed, so the report points at their code.
    """

    def __init__(self, stage: str, message: str, details: str = "") -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message
        self.details = details

    @classmethod
    def from_exception(cls, stage: str, exc: BaseException) -> VerifyError:
        return cls(stage, f"{type(exc).__name__}: {exc}", user_traceback(exc))


class Unchanged(VerifyError):
    """The codemod leaves the model as it is (every site skipped, or none found): there is nothing to
    verify. An error of one verify; a zoo counts it apart, as a model its migration leaves alone."""


def user_traceback(exc: BaseException) -> str:
    """The traceback without regionalize's and importlib's frames: only what the user can act on."""
    summary = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in summary if not f.filename.startswith(_OWN_DIR) and "<frozen" not in f.filename]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


@dataclass(frozen=True)
class Target:
    """What to verify: the model file, how to import it, and where its factory lives."""

    model_path: Path
    module_name: str  # dotted name the original is imported under
    import_root: Path  # directory that must be on sys.path for `module_name` (and its package) to import
    factory_name: str
    # Module or file holding the factory when it is not the model file; such a factory takes the model
    # module (original or rewritten) as its argument, so it can build either.
    factory_home: str | None = None

    @property
    def package(self) -> str:
        return self.module_name.rpartition(".")[0]

    @property
    def rewritten_name(self) -> str:
        # A sibling of the original in the same package, so relative imports resolve the same way.
        return self.module_name + REWRITTEN_SUFFIX


def resolve_target(model_path: str | None, factory: str) -> Target:
    """Parse `--factory NAME`, `--factory pkg.module:NAME` or `--factory path/file.py:NAME`.

    `model_path` is a file, or a module's dotted name (`transformers.models.llama.modeling_llama`).
    """
    home, sep, name = factory.rpartition(":")
    if not sep:
        home, name = "", factory
    if not name.isidentifier():
        raise VerifyError("factory", f"{factory!r} is not NAME, module.path:NAME or file.py:NAME")
    home_file = _module_file(home, "factory") if home else None
    if model_path is None:
        if home_file is None:
            raise VerifyError("factory", "give MODEL.py, or name the factory as module.path:NAME")
        model = home_file
    elif _DOTTED.fullmatch(model_path) and not model_path.endswith(".py") and not Path(model_path).exists():
        model = _module_file(model_path, "import original")
    else:
        model = Path(model_path).resolve()
        if not model.is_file():
            raise VerifyError("import original", f"no such file: {model_path}")
    root, module_name = module_name_for(model)
    if "." not in module_name:
        module_name = SCRIPT_PREFIX + module_name
    external = home if home_file is not None and home_file != model else None
    return Target(model, module_name, root, name, external)


def _module_file(home: str, stage: str) -> Path:
    """The file of `path/file.py` or of the module `package.module` (its packages get imported)."""
    if home.endswith(".py"):
        path = Path(home).resolve()
        if not path.is_file():
            raise VerifyError(stage, f"no such file: {home}")
        return path
    try:
        spec = importlib.util.find_spec(home)
    except (ImportError, ValueError) as exc:
        raise VerifyError.from_exception(stage, exc) from exc
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise VerifyError(stage, f"cannot find the Python module {home!r}")
    return Path(spec.origin).resolve()


@contextlib.contextmanager
def import_paths(target: Target) -> Iterator[None]:
    """Put the model's import root (and the factory file's) on sys.path, then restore it."""
    wanted = [str(target.import_root)]
    if target.factory_home and target.factory_home.endswith(".py"):
        wanted.append(str(module_name_for(Path(target.factory_home).resolve())[0]))
    saved = list(sys.path)
    sys.path[:0] = [p for p in dict.fromkeys(wanted) if p not in sys.path]
    try:
        yield
    finally:
        sys.path[:] = saved


def import_original(target: Target) -> ModuleType:
    try:
        if target.package:
            module = importlib.import_module(target.module_name)
        else:
            module = _exec_file(target.module_name, target.model_path)
    except BaseException as exc:  # the user's module-level code may raise anything, SystemExit included
        raise VerifyError.from_exception("import original", exc) from exc
    found = Path(module.__file__ or "").resolve()
    if found != target.model_path:
        raise VerifyError(
            "import original",
            f"`import {target.module_name}` loads {found}, not {target.model_path}: another copy shadows it",
        )
    return module


def _exec_file(name: str, path: Path) -> ModuleType:
    """Run a script as a module, afresh each time, as `python script.py` would (but not as __main__)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_rewritten(target: Target, source: str, filename: Path) -> ModuleType:
    """Execute `source` as a sibling module of the original, in the original's package.

    `filename` must hold `source`: Dynamo, tracebacks and `inspect` read lines back from it.
    """
    _runtime_copy(target, source)
    name = target.rewritten_name
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(filename))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(filename)
    # Registered before running, as the import system does: dataclasses and pickle look modules up by name.
    sys.modules[name] = module
    try:
        code = compile(source, str(filename), "exec")
        exec(code, module.__dict__)
    except BaseException as exc:
        del sys.modules[name]
        raise VerifyError.from_exception("import rewritten", exc) from exc
    return module


def _runtime_copy(target: Target, source: str) -> None:
    """The runtime copy a vendored rewrite imports (`runtime_copy.py`), as `--apply` would leave it: where
    it is not on disk up to date, this runtime's package is loaded under the copy's name from its own
    files (Dynamo, tracebacks and `inspect` read a module's lines back from its file)."""
    if runtime_copy.vendor_import_line(source) is None:
        return
    folder = runtime_copy.folder_for(str(target.model_path))
    if folder is None or not runtime_copy.pending(folder):
        return
    top = runtime_copy.package_root(target.model_path)
    name = runtime_copy.MODULE if top is None else f"{target.module_name.split('.')[0]}.{runtime_copy.MODULE}"
    if name not in sys.modules:  # else loaded by an earlier import: one copy a name, as Dynamo finds modules
        load_runtime(name)


def load_runtime(name: str) -> ModuleType:
    """This runtime's package loaded from its own files under `name`, a copy of its own (Dynamo, tracebacks
    and `inspect` read a module's lines back from its file)."""
    init = runtime_copy.RUNTIME / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_factory(target: Target) -> Callable[[ModuleType], Any]:
    """A function building from a given module (original or rewritten): `build(module) -> factory result`."""
    if target.factory_home is None:

        def build(module: ModuleType) -> Any:
            factory = getattr(module, target.factory_name, None)
            if not callable(factory):
                name = target.model_path.name
                raise VerifyError("factory", f"{name} defines no function {target.factory_name}")
            return factory()

        return build
    home = target.factory_home
    try:
        if home.endswith(".py"):
            factory_module = importlib.import_module(module_name_for(Path(home).resolve())[1])
        else:
            factory_module = importlib.import_module(home)
    except BaseException as exc:
        raise VerifyError.from_exception("factory", exc) from exc
    factory = getattr(factory_module, target.factory_name, None)
    if not callable(factory):
        raise VerifyError("factory", f"{home} defines no function {target.factory_name}")
    try:
        inspect.signature(factory).bind(factory_module)
    except TypeError:
        raise VerifyError(
            "factory",
            f"{home}:{target.factory_name} lives outside the model file, so it must take one argument: "
            "the model module to build from (original or rewritten)",
        ) from None
    return factory
