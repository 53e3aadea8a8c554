"""The test session's own torch cache.

Inductor, AOTAutograd and the runtime (its saved owners, its CPU check's answers) keep what they compile
under `TORCHINDUCTOR_CACHE_DIR`, else under a folder of torch's in the system's temporary directory that
every process of the user shares. Tests sharing that folder would run on what an earlier session, or the
user's own work, left there (a second run found other files than the first, and failed), and would leave
their files in it. So this file, which pytest loads before any test module imports torch, sets the variable
for the session, in `os.environ`: the processes the tests start inherit it. Tests that give a process a
cache of its own (a restart's, in `tmp_path`) still do.

The folder:
- `REGIONALIZE_TEST_CACHE_DIR` set: that folder (made where missing), kept after the session. A second
  session given the same folder runs on the cache the first one left.
- otherwise: a new temporary folder, removed when the session ends. A `TORCHINDUCTOR_CACHE_DIR` of the
  caller's is not used: the tests would read and write that cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_KEPT = os.environ.get("REGIONALIZE_TEST_CACHE_DIR")
if _KEPT:
    CACHE = os.path.abspath(_KEPT)
    os.makedirs(CACHE, exist_ok=True)
else:
    CACHE = tempfile.mkdtemp(prefix="regionalize-tests-cache-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _KEPT:
        shutil.rmtree(CACHE, ignore_errors=True)
