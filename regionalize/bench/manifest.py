"""A zoo manifest (`regionalize verify --manifest zoo.toml`): read and checked strictly, before anything runs.

Torch-free: the zoo runner only reads it and starts one `regionalize verify` process per entry.

    [defaults]                  # optional: any entry key but name, model and factory
    timeout = 900               # seconds per entry
    quick = true
    starts = ["warm", "hot"]    # the fresh processes the first call is timed in (--starts)

    [[model]]
    name = "llama"                                         # unique: the row's name
    model = "transformers.models.llama.modeling_llama"     # a file (relative to the manifest) or module
    factory = "models.py:llama"                            # as --factory; a .py path is relative too
    workload = "generate"
    regionalize = { guard-bypass = "filter" }              # as [tool.regionalize]
    skip = ["per-block"]                                   # variants left out (--skip)
    ray = { num_gpus = 1, working_dir = "." }              # with --ray only (docs/cluster.md)
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from regionalize.bench.starts import checked
from regionalize.shared import config

DEFAULT_TIMEOUT_S = 1800
# [tool.regionalize] keys that say which files to rewrite and how many at once: verify has one file.
_REWRITE_ONLY = ("include", "exclude", "jobs")


class ManifestError(Exception):
    """A bad manifest: the message names the file, the entry and the key."""


def _regionalize(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a table of [tool.regionalize] settings")
    for key in _REWRITE_ONLY:
        if key in value:
            raise ValueError(f"sets {key}, which chooses files to rewrite: verify has one")
    try:
        config.check(value, "")
    except config.ConfigError as exc:
        raise ValueError(str(exc).removeprefix(": ")) from None
    return dict(value)


def _starts(value: Any) -> list[str]:
    try:
        return list(checked(value if isinstance(value, list) else []))  # not a list: refused as empty
    except ValueError as exc:
        raise ValueError(f"must be a list of {exc}") from None


# The variants a run may leave out (`verify --skip`, a manifest's `skip`), by the flag's name for each
# (`session.VARIANTS`' names): not the original, the full compile or the rewrite verified, which every
# ratio is taken against.
SKIPPABLE = {"dedup": "full_dedup", "per-block": "per_block", "bypass": "regional_bypass"}


def _skip(value: Any) -> list[str]:
    if not isinstance(value, list) or any(v not in SKIPPABLE for v in value):
        raise ValueError(f"must be a list of {', '.join(SKIPPABLE)}")
    return list(value)


def _number(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError("must be a number, 0 or more")
    return value


def _resources(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError("must be a table of custom resource names and amounts")
    return {config.string(name): _number(amount) for name, amount in value.items()}


# What an entry's task reserves on a Ray cluster (`--ray`) and what it ships there; a local run has no use
# for them. Spelled as Ray's own `.options()` and `runtime_env` keys, so that its docs apply.
RAY_KEYS: dict[str, Callable[[Any], Any]] = {
    "num_cpus": _number,
    "num_gpus": _number,
    "resources": _resources,
    "working_dir": config.string,
}


def _ray(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a table of {', '.join(RAY_KEYS)}")
    unknown = sorted(set(value) - set(RAY_KEYS))
    if unknown:
        raise ValueError(f"has unknown key {unknown[0]!r} (known: {', '.join(RAY_KEYS)})")
    return {key: RAY_KEYS[key](item) for key, item in value.items()}


# Keys an entry (or [defaults]) may set, with their checks; spelled as the command-line flags.
_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "timeout": config.positive_int,
    "quick": config.boolean,
    "starts": _starts,
    "repeats": config.positive_int,
    "cold-start": config.boolean,
    "device": config.choice(("auto", "cpu", "cuda")),
    "workload": config.choice(("generate", "train")),
    "tokens": config.positive_int,
    "steps": config.positive_int,
    "prompt-len": config.positive_int,
    "regionalize": _regionalize,
    "skip": _skip,
    "ray": _ray,
}
_ENTRY_ONLY: dict[str, Callable[[Any], Any]] = {
    "name": config.string,
    "model": config.string,
    "factory": config.string,
    "rewritten": config.string,
}


@dataclass(frozen=True)
class Entry:
    """One model of the zoo, paths already made absolute against the manifest's folder."""

    name: str
    factory: str
    model: str | None = None
    rewritten: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def with_settings(self, overrides: dict[str, Any]) -> Entry:
        return dataclasses.replace(self, settings=self.settings | overrides)

    @property
    def timeout(self) -> int:
        return self.settings.get("timeout", DEFAULT_TIMEOUT_S)

    def verify_args(self, json_out: Path) -> list[str]:
        """The `regionalize verify` arguments that run this entry and write its JSON to `json_out`."""
        args = [self.model] if self.model else []
        args += ["--factory", self.factory, "--json", str(json_out)]
        if self.rewritten:
            args += ["--rewritten", self.rewritten]
        s = self.settings
        if s.get("quick"):
            args.append("--quick")
        if s.get("starts"):
            args += ["--starts", ",".join(s["starts"])]
        if s.get("cold-start") is False:
            args.append("--no-cold-start")
        for key in ("repeats", "device", "workload", "tokens", "steps", "prompt-len"):
            if key in s:
                args += [f"--{key}", str(s[key])]
        for variant in s.get("skip", ()):
            args += ["--skip", variant]
        return args + _codemod_flags(s.get("regionalize", {}))


def _codemod_flags(table: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for key, value in table.items():
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, list):
            flag = "--container" if key == "containers" else f"--{key}"
            for item in value:
                flags += [flag, item]
        elif not (key == "dynamic" and value == "auto"):
            flags += [f"--{key}", str(value)]
    return flags


def load(path: Path) -> list[Entry]:
    """The entries of a manifest, in file order; raises ManifestError naming what is wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None
    unknown = set(data) - {"defaults", "model"}
    if unknown:
        raise ManifestError(f"{path}: unknown table {sorted(unknown)[0]!r} (known: [defaults], [[model]])")
    defaults = _shipped(_checked(data.get("defaults", {}), _SETTINGS, f"{path}: [defaults]"), path.parent)
    models = data.get("model", [])
    if not isinstance(models, list) or not models:
        raise ManifestError(f"{path}: no [[model]] entries")
    entries: list[Entry] = []
    for number, raw in enumerate(models, 1):
        where = f"{path}: model {number}" + (f" ({raw['name']})" if isinstance(raw.get("name"), str) else "")
        values = _shipped(_checked(raw, _SETTINGS | _ENTRY_ONLY, where), path.parent)
        for required in ("name", "factory"):
            if required not in values:
                raise ManifestError(f"{where}: {required} is required")
        if not re.fullmatch(r"[\w.-]+", values["name"]):
            raise ManifestError(f"{where}: name may hold letters, digits, '.', '-' and '_' only")
        if any(e.name == values["name"] for e in entries):
            raise ManifestError(f"{where}: a second entry named {values['name']!r}")
        entries.append(
            Entry(
                name=values.pop("name"),
                factory=_relative_factory(values.pop("factory"), path.parent),
                model=_relative(values.pop("model", None), path.parent),
                rewritten=_relative(values.pop("rewritten", None), path.parent),
                settings=_merged(defaults, values),
            )
        )
    return entries


def _merged(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """An entry's settings over the defaults; its regionalize and ray tables over theirs, key by key."""
    merged = defaults | values
    for name in ("regionalize", "ray"):
        table = defaults.get(name, {}) | values.get(name, {})
        merged |= {name: table} if table else {}
    return merged


def _shipped(values: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A ray table's local working_dir made absolute against the manifest's folder, as model paths are."""
    table = values.get("ray", {})
    if "working_dir" in table and "://" not in table["working_dir"]:  # a URI is left as it is
        values["ray"] = table | {"working_dir": str((folder / table["working_dir"]).resolve())}
    return values


def _checked(table: Any, checks: dict[str, Callable[[Any], Any]], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ManifestError(f"{where} must be a table")
    values = {}
    for key, value in table.items():
        if key not in checks:
            raise ManifestError(f"{where}: unknown key {key!r} (known: {', '.join(checks)})")
        try:
            values[key] = checks[key](value)
        except ValueError as exc:
            raise ManifestError(f"{where}: {key} {exc}, not {value!r}") from None
    return values


def _relative(value: str | None, folder: Path) -> str | None:
    """A file path against the manifest's folder; a dotted module name as it is."""
    if value is None or not (value.endswith(".py") or "/" in value):
        return value
    return str((folder / value).resolve())


def _relative_factory(value: str, folder: Path) -> str:
    home, sep, name = value.rpartition(":")
    return f"{_relative(home, folder)}:{name}" if sep else value
