"""The command line: `regionalize` (`rewrite`, the default command, and `rule`, in `commands`), `tune` and
`verify`, their shared flags and `[tool.regionalize]` writer, and the rendered reports."""

from regionalize.cli.commands import main

__all__ = ["main"]
