from __future__ import annotations

import subprocess
import sys

import pytest

from disagg_transforms.__main__ import main


def test_demo_shows_routes_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "/v1/chat/completions     /v1/chat/completions       /inference/v1/generate" in out
    assert '"output_mode":"text"' in out


def test_module_entry_point_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "disagg_transforms", "demo"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "resolve_format" in done.stdout
