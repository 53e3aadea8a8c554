"""Write list settings into `[tool.regionalize]` of a pyproject.toml, leaving every other line as it was.

`regionalize tune --write` uses it. TOML has no standard-library writer, and rewriting the whole file
would lose its comments and layout, so only the lines of the keys set change: a key's line (or its
multi-line array) is replaced, a missing key goes at the end of the table, a missing table at the end
of the file. The result is parsed again and compared before it is written, atomically.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path

from regionalize.shared.config import tomllib
from regionalize.shared.source_files import SourceFile, write_atomically

_HEADER = re.compile(r"^\[\s*tool\s*\.\s*regionalize\s*\]\s*(#.*)?$")
_TABLE = re.compile(r"^\[")


class UpdateError(ValueError):
    """The file cannot be updated safely; the message names it."""


def update(path: Path, values: dict[str, list[str]]) -> None:
    """Set each key of `values` (`never`, `always`) in the file's `[tool.regionalize]` table."""
    data = path.read_bytes() if path.exists() else b""
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8-sig")  # bytes, so that "\r\n" line endings survive
    except UnicodeDecodeError as exc:
        raise UpdateError(f"{path}: not UTF-8, as TOML must be: {exc.reason} at byte {exc.start}") from None
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if header is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines.append("[tool.regionalize]")
        header = len(lines) - 1
    end = _table_end(lines, header)
    for key, names in values.items():
        line = f"{key} = {json.dumps(sorted(names))}"
        setting = re.compile(rf"^{re.escape(key)}\s*=")
        found = next((i for i in range(header + 1, end) if setting.match(lines[i])), None)
        if found is None:
            last = max([header, *(i for i in range(header + 1, end) if lines[i].strip())])
            lines.insert(last + 1, line)
            end += 1
        else:
            stop = _value_end(lines, found)
            lines[found : stop + 1] = [line]
            end -= stop - found
    updated = newline.join(lines) + newline
    try:
        table = tomllib.loads(updated).get("tool", {}).get("regionalize", {})
    except tomllib.TOMLDecodeError as exc:
        raise UpdateError(f"{path}: cannot update [tool.regionalize] safely: {exc}") from None
    if any(sorted(table.get(key, [])) != sorted(names) for key, names in values.items()):
        raise UpdateError(f"{path}: cannot update [tool.regionalize] safely: its layout is unusual")
    write_atomically(str(path), SourceFile(text, "utf-8", bom), updated)


def _table_end(lines: list[str], header: int) -> int:
    """The index after the table's last line: the next table header at the start of a line, or the end."""
    index = header + 1
    while index < len(lines):
        if _TABLE.match(lines[index]):
            return index
        index = _value_end(lines, index) + 1 if "=" in lines[index] else index + 1
    return index


def _value_end(lines: list[str], start: int) -> int:
    """The last line of the value that starts on `start`: a multi-line array ends where its brackets close."""
    depth = 0
    for index in range(start, len(lines)):
        code = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|#.*', "", lines[index])
        depth += code.count("[") - code.count("]")
        if depth <= 0:
            return index
    return len(lines) - 1
