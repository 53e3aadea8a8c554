"""docs/configuration.md's reference of `[tool.regionalize]`, generated from the options' own definitions.

The keys and how each value is checked come from regionalize/shared/config.py (`KEYS`), the flag, the
choices and what it does from the `regionalize` command's click options (regionalize/cli/flags.py and
commands.py), and the defaults from `Options` (regionalize/shared/options.py): a key, flag, choice or
default added or changed there changes the page, and tests/test_configuration_page.py fails until the
page is written again by `python scripts/render_docs.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from regionalize.cli import main
from regionalize.shared import config
from regionalize.shared.options import Options

# What an unset default means, where the definition leaves it to the code that reads it.
UNSET = {
    "form": '"hierarchical"; "per-block" with `style = "wrap"`',
    "dynamic": '"auto" (torch decides)',
    "jobs": "the CPU cores",
    "saved-owners": '"auto" (neither written: on at run time)',
}
VALUES = {
    config.boolean: "`true` or `false`",
    config.optional_bool: '`true`, `false` or `"auto"`',
    config.string: "a string",
    config.positive_int: "an integer, 1 or more",
}


def rewrite_options() -> dict[str, click.Option]:
    """The `regionalize` command's options by parameter name."""
    command = main.commands["rewrite"]
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


def _value(key: str, option: click.Option) -> str:
    check = config.KEYS[key]
    if check in VALUES:
        return VALUES[check]
    if isinstance(option.type, click.Choice):
        return " or ".join(f'`"{choice}"`' for choice in option.type.choices)
    if getattr(check, "__name__", "") == "_strings":
        return "a list of strings"
    raise ValueError(f"no wording for the values of tool.regionalize.{key}")


def _default(key: str, name: str, option: click.Option) -> str:
    fields = {f.name: f for f in dataclasses.fields(Options)}
    if name in fields:
        field = fields[name]
        value: Any = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
    elif option.multiple:
        value = ()
    else:  # click's default, unless it is click's own marker for none given
        value = option.default if isinstance(option.default, (bool, int, str)) else None
    if value is None or (key in UNSET and not value):
        return UNSET.get(key, "`false`" if option.is_flag else "unset")
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (frozenset, tuple, list)):
        return "`[]`" if not value else f"`{sorted(value)}`"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value}`"


def _flags(option: click.Option) -> str:
    return ", ".join(f"`{flag}`" for flag in [*option.opts, *option.secondary_opts])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def reference() -> str:
    """The table of every key, and the flags that have no key."""
    options = rewrite_options()
    rows = ["| key | flag | value | default | what it does |", "|---|---|---|---|---|"]
    for key in config.KEYS:
        name = key.replace("-", "_")
        option = options[name]
        cells = [
            f"`{key}`",
            _flags(option),
            _value(key, option),
            _default(key, name, option),
            option.help or "",
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    keyed = {key.replace("-", "_") for key in config.KEYS}
    others = sorted(_flags(o).split(", ")[0] for n, o in options.items() if n not in keyed and n != "help")
    return "\n".join(rows) + "\n\nFlags of the command line only, with no key: " + ", ".join(others) + ".\n"
