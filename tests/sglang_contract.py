"""SGLang 0.5.23's own JSON contract (``sglang/api/v1/api_types.py``), loaded at test time.

The module is read out of the registry's ``sglang==0.5.23`` wheel (downloaded once with pip into
a cache outside the tree, never installed: it needs a GPU stack) and checked by sha256; it needs
only msgspec. Where the registry cannot be reached the tests that need it are skipped with the
reason, except in CI (``CI=true``), where that is a failure (docs/sglang.md, "Checked against
SGLang's own contract").
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import subprocess
import sys
import types
import zipfile

import pytest

VERSION = "0.5.23"
API_TYPES = "sglang/api/v1/api_types.py"
API_TYPES_SHA256 = "60fd8b7b61b1b88424139f57879e16b4b756473b26f20e214314b74dec52352b"
CACHE = pathlib.Path(
    os.environ.get("DISAGG_SGLANG_CACHE", pathlib.Path.home() / ".cache" / "disagg-sglang")
)


def _wheel() -> pathlib.Path | str:
    """The cached wheel, downloaded if missing; else why it could not be had."""
    found = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={VERSION}"]
    try:
        done = subprocess.run(  # noqa: S603 - our own interpreter, fixed arguments
            [*command, "-d", str(CACHE)], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"pip download sglang=={VERSION} failed: {error}"
    found = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
    if done.returncode or not found:
        return f"pip download sglang=={VERSION} failed: {done.stderr.strip()[-300:]}"
    return found[0]


@functools.cache
def _load() -> types.ModuleType | str:
    wheel = _wheel()
    if isinstance(wheel, str):
        return wheel
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(API_TYPES)
    digest = hashlib.sha256(source).hexdigest()
    if digest != API_TYPES_SHA256:
        return f"{API_TYPES} in {wheel.name} has sha256 {digest}, not {API_TYPES_SHA256}"
    module = types.ModuleType("sglang_api_types")
    exec(compile(source, API_TYPES, "exec"), module.__dict__)  # noqa: S102 - the pinned file
    return module


def contract() -> types.ModuleType:
    """SGLang's contract module; skips (fails in CI) when it cannot be had."""
    loaded = _load()
    if isinstance(loaded, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"SGLang's contract is required in CI: {loaded}")
        pytest.skip(f"SGLang's contract could not be loaded: {loaded}")
    return loaded
