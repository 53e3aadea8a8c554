"""Source files read and written faithfully: the text with its encoding and BOM, kept to write it back
byte for byte the same way, and written atomically (the runner's files, the runtime copy, verify's and
tune's output)."""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

from regionalize.shared.sites import shown

MAX_BYTES = 10 * 1024 * 1024  # larger "source" is generated data; parsing it would stall the run


@dataclass
class SourceFile:
    """A file's text plus what is needed to write it back byte-for-byte the same way."""

    text: str
    encoding: str
    bom: bool


def read_source(path: str) -> SourceFile:
    """Raises ValueError with a one-line reason when the file is not usable Python source."""
    # Opened without blocking and checked before reading: a FIFO named on the command line would
    # otherwise hold the whole run until something writes to it.
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_BYTES + 1)
    return decode_source(data)


def decode_source(data: bytes) -> SourceFile:
    """Source bytes (a file's, or standard input's) as text; ValueError with a one-line reason."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"file is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
    except SyntaxError:  # raised both for bytes that are not UTF-8 and for a bad coding cookie
        raise ValueError("not valid utf-8, and no coding declaration that fits") from None
    encoding = "utf-8" if encoding == "utf-8-sig" else encoding
    body = data[len(codecs.BOM_UTF8) :] if bom else data
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid {encoding}: byte {exc.start}") from None
    if "\0" in text:
        raise ValueError("file contains NUL bytes: not Python source")
    return SourceFile(text, encoding, bom)


def write_output(path: str, text: str, what: str) -> str | None:
    """Write a command's output file (`what`: "report", "JSON"): None, or the error line saying why not."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        return f"error: {shown(path)}: cannot write the {what}: {exc.strerror or exc}"
    return None


def write_atomically(path: str, source: SourceFile, text: str) -> None:
    """Temp file in the same directory, then rename: a crash leaves the old file or the new one."""
    data = (codecs.BOM_UTF8 if source.bom else b"") + text.encode(source.encoding)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # a new file: the mode a plain `open` would give it
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    # Beside the file a symlink leads to: a rename is atomic only within one file system, and replaces
    # the file, not the link.
    target = os.path.realpath(path)
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".regionalize-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode & 0o7777)
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
