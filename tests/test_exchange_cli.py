"""``check-config`` warns about a pipeline that answers chat clients with a generate envelope."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_transforms._cli.main import main


def _write(tmp_path: Path, document: object) -> str:
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def test_check_config_warns_about_an_unwrapped_generate_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"use_openai_format": False, "steps": {"decode": {}}})
    assert main(["check-config", path]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"{path}: warning: decode.use_openai_format: false with ")
    assert "decode.wrap_chat_completion" in err[0]


@pytest.mark.parametrize(
    "steps",
    [{"decode": {}}, {"decode": {"use_openai_format": False, "wrap_chat_completion": True}}],
)
def test_check_config_is_quiet_about_a_pipeline_that_wraps_or_stays_openai(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: object
) -> None:
    assert main(["check-config", _write(tmp_path, {"steps": steps})]) == 0
    assert capsys.readouterr().err == ""
