"""``check-config`` warns about a pipeline that answers some clients oddly.

A decode on the generate route that hands chat clients the generate envelope, or that refuses
every client asking for tools (``output_mode: text``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from proxy_helpers import command, environment, running

from disagg_transforms import parse_pipeline_params, pipeline_warnings
from disagg_transforms._cli.main import main


def _write(tmp_path: Path, document: object) -> str:
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def test_check_config_warns_about_an_unwrapped_generate_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decode = {"output_mode": "auto"}
    path = _write(tmp_path, {"use_openai_format": False, "steps": {"decode": decode}})
    assert main(["check-config", path]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"{path}: warning: decode.use_openai_format: false with ")
    assert "decode.wrap_chat_completion" in err[0]


@pytest.mark.parametrize(
    "steps",
    [
        {"decode": {}},
        {
            "decode": {
                "use_openai_format": False,
                "wrap_chat_completion": True,
                "output_mode": "auto",
            }
        },
        {
            "decode": {
                "use_openai_format": False,
                "wrap_chat_completion": True,
                "output_mode": "derender",
            }
        },
    ],
)
def test_check_config_is_quiet_about_a_pipeline_that_wraps_or_stays_openai(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: object
) -> None:
    assert main(["check-config", _write(tmp_path, {"steps": steps})]) == 0
    assert capsys.readouterr().err == ""


def test_check_config_warns_that_a_text_decode_refuses_tools(tmp_path: Path) -> None:
    decode = {"use_openai_format": False, "wrap_chat_completion": True, "output_mode": "text"}
    path = _write(tmp_path, {"steps": {"decode": decode}})
    done = subprocess.run(  # noqa: S603 - our own interpreter and command
        command("check-config", path),
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("valid\n")
    [warning] = done.stderr.splitlines()
    assert warning.startswith(f"{path}: warning: decode.output_mode: text: ")
    assert "tools" in warning  # the consequence: a client asking for tools gets a 400
    assert warning.endswith("set decode.output_mode: auto")  # the fix


def test_check_config_warns_once_for_the_library_default_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The library's default (text) with the generate route's wrap: only the tools warning.
    path = _write(
        tmp_path, {"use_openai_format": False, "steps": {"decode": {"wrap_chat_completion": True}}}
    )
    assert main(["check-config", path]) == 0
    [warning] = capsys.readouterr().err.splitlines()
    assert "decode.output_mode: text" in warning


def test_serve_names_a_text_decode_at_startup(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    decode = {"use_openai_format": False, "wrap_chat_completion": True, "output_mode": "text"}
    path = _write(tmp_path, {"steps": {"decode": decode}})
    args = ["serve", "--simulate", "--config", path, "--port", "0"]
    with running((args, tmp_path / "serve.log")) as (server,):
        log = server.log()
    [warning] = [line for line in log.splitlines() if ": warning: " in line]
    assert (
        warning
        == f"{path}: warning: " + pipeline_warnings(parse_pipeline_params({"decode": decode}))[0]
    )
