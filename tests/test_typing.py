"""Router code written against the public API type-checks under ``mypy --strict``.

The files in ``tests/typing/`` are how a router calls the library; mypy must accept them with
no casts and no assertions, so the public types say what a router needs to know.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TYPING = Path(__file__).parent / "typing"


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed: the typing checks need it (pip install mypy)",
)
def test_router_code_type_checks_strictly() -> None:
    result = subprocess.run(  # noqa: S603 - a fixed command on the repository's own files
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(TYPING)],
        capture_output=True,
        text=True,
        check=False,
        cwd=TYPING.parent.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
