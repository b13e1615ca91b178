"""The public signatures as a router under ``mypy --strict`` sees them (tests/typing/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TYPING_DIR = Path(__file__).parent / "typing"
PROJECT = Path(__file__).parent.parent


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (pip install -e '.[dev]'): the typing checks need it",
)
def test_the_typing_checks_pass_mypy_strict(tmp_path: Path) -> None:
    from mypy import api  # noqa: PLC0415 - only this test needs mypy, and it may be absent

    files = sorted(str(path) for path in TYPING_DIR.glob("*.py"))
    assert files, f"no typing checks in {TYPING_DIR}"
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--python-version",
            "3.10",
            "--config-file",
            str(PROJECT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--no-error-summary",
            *files,
        ]
    )
    assert status == 0, stdout + stderr
