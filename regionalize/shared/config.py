"""`[tool.regionalize]` in pyproject.toml: found by walking up from the given paths, checked strictly."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from regionalize.shared.options import FORMS, GUARD_BYPASS, MODES, STYLES


class ConfigError(Exception):
    """A bad pyproject.toml: the message names the file and the key."""


def choice(choices: tuple[str, ...]) -> Any:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return check


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def optional_bool(value: Any) -> bool | None:
    if value == "auto":
        return None
    return boolean(value)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of strings")
    return tuple(value)


def positive_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("must be a positive integer")
    return value


# Keys are spelled as on the command line; values are checked and converted by these functions.
KEYS = {
    "style": choice(STYLES),
    "form": choice(FORMS),
    "mode": choice(MODES),
    "fullgraph": boolean,
    "dynamic": optional_bool,
    "backend": string,
    "guard-bypass": choice(GUARD_BYPASS),
    "include": _strings,
    "exclude": _strings,
    "force-exclude": boolean,
    "always": _strings,
    "never": _strings,
    "containers": _strings,
    "jobs": positive_int,
    "vendor": boolean,
    "saved-owners": optional_bool,
}


def find_pyproject(paths: list[str]) -> Path | None:
    """The nearest pyproject.toml with a [tool.regionalize] table, above the common ancestor of paths.

    Read as TOML, so that every spelling of the table counts (`[tool.regionalize]`, `[ tool.regionalize ]`,
    dotted keys under `[tool]`). One that names regionalize but is not valid TOML is returned too, so
    that `load` reports it instead of the run going on without its settings.
    """
    if not paths:
        return None
    resolved = [Path(os.path.abspath(p)) for p in paths]
    start = Path(*_common_parts(resolved))
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            try:
                text = candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if "regionalize" not in text:  # no table of ours in any spelling: not parsed
                continue
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                return candidate
            tool = data.get("tool")
            if isinstance(tool, dict) and "regionalize" in tool:
                return candidate
    return None


def _common_parts(paths: list[Path]) -> tuple[str, ...]:
    dirs = [p if p.is_dir() else p.parent for p in paths]
    parts = dirs[0].parts
    for other in dirs[1:]:
        n = 0
        while n < min(len(parts), len(other.parts)) and parts[n] == other.parts[n]:
            n += 1
        parts = parts[:n]
    return parts


def load(path: Path) -> dict[str, Any]:
    """The checked settings of one file, keyed by option name (dashes become underscores)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    table = data.get("tool", {}).get("regionalize", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.regionalize] must be a table")
    return check(table, str(path))


def check(table: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate a [tool.regionalize]-shaped table; `where` names its source in errors."""
    settings: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            known = ", ".join(sorted(KEYS))
            raise ConfigError(f"{where}: unknown key tool.regionalize.{key} (known keys: {known})")
        try:
            settings[key.replace("-", "_")] = KEYS[key](value)
        except ValueError as exc:
            raise ConfigError(f"{where}: tool.regionalize.{key} {exc}, not {value!r}") from None
    return settings
