"""Settings shared by the codemod, the runner and the verifier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STYLES = ("inplace", "wrap")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
GUARD_BYPASS = ("none", "filter", "depyf")
# hierarchical: the blocks' owner compiled whole, each block a nested region (one frame per call);
# per-block: each block compiled on its own (the fastest start, a frame per block call).
FORMS = ("hierarchical", "per-block")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes whose compiled code uses CUDA graphs


@dataclass(frozen=True)
class Options:
    """How blocks are compiled; every field maps onto a command-line flag and a pyproject key."""

    style: str = "inplace"
    form: str | None = None  # None: hierarchical, unless --style wrap asks for per-block
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    backend: str = "inductor"
    guard_bypass: str = "none"
    # Class names the user says are (or are not) repeated blocks, overriding the built-in heuristics.
    always: frozenset[str] = field(default_factory=frozenset)
    never: frozenset[str] = field(default_factory=frozenset)
    # Container classes beyond torch.nn's and OpenMMLab's, by class or dotted name (a package's own).
    containers: frozenset[str] = field(default_factory=frozenset)
    # Where a rewritten file gets the runtime: False, the installed regionalize (`import regionalize`);
    # True, a copy in the user's tree (`_regionalize.py` of the package, or inline in a lone file).
    vendor: bool = False
    # Saved owners (docs/saved-owners.md): True or False writes `saved=` into each owner's call; None
    # leaves it to the runtime: on unless REGIONALIZE_SAVED_OWNERS=0.
    saved_owners: bool | None = None

    def __post_init__(self) -> None:
        if self.guard_bypass == "depyf" and self.style != "inplace":
            raise ValueError("--guard-bypass depyf compiles blocks in place: it needs --style inplace")
        if self.mode in CUDA_GRAPH_MODES and self.style != "inplace":
            raise ValueError(
                f"--mode {self.mode} puts a CUDA graph around the blocks' owner: it needs --style inplace"
            )
        if self.mode in CUDA_GRAPH_MODES and (self.guard_bypass != "none" or self.form == "per-block"):
            raise ValueError(
                f"--mode {self.mode} replays one CUDA graph per call around the blocks' owner: it needs the "
                "hierarchical form, without --guard-bypass"
            )
        if self.saved_owners and not self.hierarchical:
            raise ValueError(
                "--saved-owners saves the blocks' owner compiled whole: it needs the hierarchical form"
            )
        if self.form == "hierarchical" and self.style == "wrap":
            raise ValueError(
                "--style wrap compiles each block on its own frame: it needs --form per-block "
                "(the hierarchical form has one frame per call)"
            )

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Options:
        """Options from checked settings (pyproject and flags merged), ignoring the runner's own keys."""
        known = {k: v for k, v in settings.items() if k in cls.__dataclass_fields__}
        for key in ("always", "never", "containers"):
            if key in known:
                known[key] = frozenset(known[key])
        return cls(**known)

    @property
    def hierarchical(self) -> bool:
        return self.form == "hierarchical" or (self.form is None and self.style == "inplace")

    def compile_kwargs(self) -> dict[str, object]:
        """Keyword arguments for torch.compile / Module.compile, defaults omitted."""
        kwargs: dict[str, object] = {}
        if self.backend != "inductor":
            kwargs["backend"] = self.backend
        if self.mode != "default":
            kwargs["mode"] = self.mode
        if self.fullgraph:
            kwargs["fullgraph"] = True
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        return kwargs
