"""Run a page's shell examples as mypy's and Ruff's documentation tests do.

A ```console block holds `$ command` lines, each followed by what it prints (standard output, then
standard error, in the order a terminal shows them). A line `...` in the shown output stands for any
number of lines left out. A ```python block whose first line is `# mypkg/NAME.py` is a file the page's
commands run on. The commands run in a shell, in a fresh folder holding those files, one after another,
`regionalize` being this checkout's (`python -m regionalize`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass
class Command:
    line: str  # without the `$ `
    shown: list[str]
    block: re.Match[str]


def commands(text: str) -> list[Command]:
    """Every `$ command` of the page's ```console blocks, in order, with the output shown under it."""
    found: list[Command] = []
    for block in FENCE.finditer(text):
        if block[1].strip() != "console":
            continue
        for line in block[2].splitlines():
            if line.startswith("$ "):
                found.append(Command(line[2:], [], block))
            else:
                assert found and found[-1].block is block, f"output before a command: {line!r}"
                found[-1].shown.append(line)
    return found


def shell_commands(text: str) -> list[str]:
    """The commands of the page's ```sh blocks, comments dropped."""
    return [
        line.split("  #")[0].strip()
        for block in FENCE.finditer(text)
        if block[1].strip() == "sh"
        for line in block[2].splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def write_files(text: str, folder: Path) -> list[str]:
    """The page's ```python blocks that name their file, written under `folder`; each package gets an
    empty `__init__.py`."""
    written = []
    for block in FENCE.finditer(text):
        first = block[2].split("\n", 1)[0]
        if block[1].strip() == "python" and (name := re.fullmatch(r"# (mypkg/[\w/]+\.py)", first)):
            path = folder / name[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text(block[2], encoding="utf-8")
            written.append(name[1])
    return written


def run(command: str, folder: Path) -> list[str]:
    """What a terminal shows for the command: unbuffered, so stdout and stderr come in the order written."""
    line = re.sub(r"^regionalize\b", f"{sys.executable} -m regionalize", command)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "COLUMNS": "80"}
    env.pop("CI", None)
    done = subprocess.run(
        line, shell=True, cwd=folder, env=env, capture_output=False, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.stdout.splitlines()


def matches(shown: list[str], printed: list[str]) -> bool:
    """`shown` is `printed`, a `...` line standing for any run of lines (none included)."""
    pattern = "".join(".*?" if line == "..." else re.escape(line + "\n") for line in shown)
    return re.fullmatch(pattern, "".join(line + "\n" for line in printed), re.DOTALL) is not None


def updated(text: str, outputs: list[tuple[Command, list[str]]]) -> str:
    """The page with each console block's output replaced by what its commands printed."""
    by_block: dict[int, list[str]] = {}
    blocks: dict[int, re.Match[str]] = {}
    for command, printed in outputs:
        by_block.setdefault(command.block.start(2), []).extend([f"$ {command.line}", *printed])
        blocks[command.block.start(2)] = command.block
    for start in sorted(by_block, reverse=True):
        block = blocks[start]
        text = text[: block.start(2)] + "\n".join(by_block[start]) + "\n" + text[block.end(2) :]
    return text
