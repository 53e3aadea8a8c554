"""Writing `never` / `always` into [tool.regionalize]: only those lines change, the rest is kept byte for
byte, and a layout that cannot be updated safely is an error, not a broken file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from regionalize.cli.config_update import UpdateError, update


def test_a_new_file_gets_the_table(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    update(path, {"never": ["B", "A"]})
    assert path.read_text() == '[tool.regionalize]\nnever = ["A", "B"]\n'


def test_a_missing_table_is_appended_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"  # the name\n')
    update(path, {"always": ["Mixer"]})
    assert path.read_text() == '[project]\nname = "x"  # the name\n\n[tool.regionalize]\nalways = ["Mixer"]\n'


def test_keys_are_replaced_in_place_single_and_multi_line(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        "[tool.regionalize]\n"
        'never = ["Old"]  # was\n'
        "always = [\n"
        '    "A",  # a comment with a ] in it\n'
        '    "B",\n'
        "]\n"
        "jobs = 2\n"
        "\n"
        "[tool.ruff]\n"
        "line-length = 110\n"
    )
    os.chmod(path, 0o640)
    update(path, {"never": ["Stage"], "always": ["Mixer"]})
    assert path.read_text() == (
        '[tool.regionalize]\nnever = ["Stage"]\nalways = ["Mixer"]\njobs = 2\n\n'
        "[tool.ruff]\nline-length = 110\n"
    )
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_header_spelled_with_spaces_is_the_table(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[ tool.regionalize ]  # ours\nnever = ["Old"]\n')
    update(path, {"never": ["Stage"]})
    assert path.read_text() == '[ tool.regionalize ]  # ours\nnever = ["Stage"]\n'


def test_windows_line_endings_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_bytes(b"[tool.regionalize]\r\njobs = 2\r\n")
    update(path, {"never": ["Stage"]})
    assert path.read_bytes() == b'[tool.regionalize]\r\njobs = 2\r\nnever = ["Stage"]\r\n'


def test_an_inline_table_is_refused_and_the_file_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    text = 'tool = { regionalize = { never = ["A"] } }\n'
    path.write_text(text)
    with pytest.raises(UpdateError, match=r"pyproject\.toml"):
        update(path, {"never": ["B"]})
    assert path.read_text() == text


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_bytes(b"[tool.regionalize]\nname = '\xff'\n")
    with pytest.raises(UpdateError, match="UTF-8"):
        update(path, {"never": ["B"]})
    assert path.read_bytes() == b"[tool.regionalize]\nname = '\xff'\n"
