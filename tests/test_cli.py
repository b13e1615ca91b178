from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_values

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


# --- check-config --------------------------------------------------------------------------------

VALID = {
    "use_openai_format": False,
    "steps": {
        "prefill": {"kv_transfer_placement": "top_level"},
        "decode": {"output_mode": "derender", "wrap_chat_completion": True},
        "conditional-decode": {},
    },
}


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_check_config_accepts_a_valid_json_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "pipeline.json", json.dumps(VALID))
    assert main(["check-config", path]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.startswith("valid\n")
    # The pipeline-level flag reached decode and prefill, never conditional-decode.
    assert '"use_openai_format":false' in captured.out
    assert 'conditional-decode   {"trust_client_transfer_params":false}' in captured.out


def test_check_config_prints_every_error_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "use_openai_format": "yes",
        "stepz": {},
        "steps": {
            "decode": {"output_mode": "tokens", "wrap_chat_completion": 1, "typo": True},
            "prefil": {"use_openai_format": True},
            "conditional-decode": {"use_openai_format": False},
            "encode": None,
        },
    }
    path = _write(tmp_path, "bad.json", json.dumps(config))
    assert main(["check-config", path]) == 2
    lines = _err_lines(capsys)
    keys = [
        "stepz:",
        "pipeline.use_openai_format:",
        "decode.output_mode:",
        "decode.wrap_chat_completion:",
        "decode.typo:",
        "step:",
        "conditional-decode.use_openai_format:",
        "encode:",
    ]
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys, strict=True):
        assert line.startswith(f"{path}: {key}"), line
    assert '"prefil"' in lines[5]


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([1, 2], "$: expected an object"),
        ({"use_openai_format": True}, 'the "steps" key is missing'),
        ({"steps": ["decode"]}, "steps must be a mapping"),
        ("steps", "$: expected an object"),
    ],
)
def test_check_config_refuses_wrong_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: object, says: str
) -> None:
    path = _write(tmp_path, "shape.json", json.dumps(document))
    assert main(["check-config", path]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1
    assert says in lines[0]


def test_check_config_reads_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("yaml")
    text = "steps:\n  decode:\n    output_mode: text\n  encode:\n    use_openai_format: 'true'\n"
    path = _write(tmp_path, "pipeline.yaml", text)
    assert main(["check-config", path]) == 2
    assert _err_lines(capsys) == [
        f'{path}: encode.use_openai_format: expected true or false, got "true" (a string)'
    ]
    good = _write(tmp_path, "good.yml", "steps:\n  decode: {output_mode: derender}\n")
    assert main(["check-config", good]) == 0


def test_check_config_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, json.dumps(VALID).encode())
    assert main(["check-config", "-"]) == 0
    _stdin(monkeypatch, b'{"steps": {"decode": {"output_mode": 3}}}')
    assert main(["check-config", "-"]) == 2
    assert _err_lines(capsys) == [
        '<stdin>: decode.output_mode: expected "text" or "derender", got 3 (an integer)'
    ]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "not valid JSON: "),
        (b"", "not valid JSON: "),
        (b'{"steps": {}}\xff', "not valid JSON: "),
        (b"\xff\xfe", "not valid JSON: "),
    ],
)
def test_bad_json_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str
) -> None:
    path = _write(tmp_path, "bad.json", content)
    assert main(["check-config", path]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1
    assert lines[0].startswith(f"disagg-transforms: error: {path}: {says}")


def test_bad_yaml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("yaml")
    path = _write(tmp_path, "bad.yaml", "steps:\n  decode: [unclosed\n  - x: {\n")
    assert main(["check-config", path]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1
    assert "not valid YAML" in lines[0]


def test_yaml_without_pyyaml_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    path = _write(tmp_path, "pipeline.yaml", "steps: {}\n")
    assert main(["check-config", path]) == 2
    assert _err_lines(capsys) == [
        (
            f"disagg-transforms: error: {path}: reading YAML needs PyYAML (pip install pyyaml); "
            "or give the config as JSON"
        )
    ]
    # JSON still works without it, and --format picks the reader whatever the suffix.
    json_path = _write(tmp_path, "pipeline.txt", json.dumps(VALID))
    assert main(["check-config", "--format", "json", json_path]) == 0


@pytest.mark.parametrize("which", ["missing", "directory"])
def test_unreadable_paths_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    path = str(tmp_path / "nope.json") if which == "missing" else str(tmp_path)
    assert main(["check-config", path]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1
    assert lines[0].startswith(f"disagg-transforms: error: cannot read {path}: ")


def test_check_config_never_shows_a_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.json", "[")
    done = subprocess.run(  # noqa: S603 - our own interpreter on a file the test wrote
        [sys.executable, "-m", "disagg_transforms", "check-config", path],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


@given(st.dictionaries(st.sampled_from(["steps", "use_openai_format", "x"]), json_values))
def test_any_document_gives_exit_0_or_2_and_one_line_per_error(document: dict[str, Any]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        stdin = io.TextIOWrapper(io.BytesIO(json.dumps(document).encode()))
        old, sys.stdin = sys.stdin, stdin
        try:
            code = main(["check-config", "-"])
        finally:
            sys.stdin = old
    assert code in {0, 2}
    lines = err.getvalue().splitlines()
    assert (code == 0) == (not lines)
    # Infinity is not JSON: one reading error; otherwise one line per config error.
    assert all(
        line.startswith(("<stdin>: ", "disagg-transforms: error: <stdin>: ")) for line in lines
    )
