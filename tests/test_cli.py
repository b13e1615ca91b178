from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from golden import load_fixture
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_values

from disagg_transforms import (
    DecodeParams,
    EncodeParams,
    OutputMode,
    PrefillParams,
    build_decode_request,
    build_encode_request,
    build_prefill_request,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_responses_response,
)
from disagg_transforms._cli.main import main

API_TRACES = {
    "1. chat: POST /v1/chat/completions": "chat.completion: text 'Hello!', stop",
    "2. streaming chat: POST /v1/chat/completions": "chat.completion.chunk events + [DONE]",
    "3. Responses: POST /v1/responses": "response completed: text 'Hello!'",
    "4. Anthropic Messages: POST /v1/messages": "message: text 'Hello!', end_turn",
    "5. derender tool call: POST /v1/chat/completions": (
        """chat.completion: tool call get_weather({"city": "Paris"}), tool_calls"""
    ),
}


def _demo_sections(out: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for block in out.split("\n\n")[1:]:
        first, *rest = block.splitlines()
        sections[first] = rest
    return sections


def test_demo_traces_each_client_api_through_the_exchange_in_one_screen(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 50
    sections = _demo_sections(out)
    assert list(sections)[: len(API_TRACES)] == list(API_TRACES)
    for heading, reply in API_TRACES.items():
        render, prefill, decode, last = sections[heading]
        route = heading.split("POST ")[1]
        assert render.split()[:4] == ["render", "POST", f"{route}/render", "200"]
        assert prefill.split()[:4] == ["prefill", "POST", "/inference/v1/generate", "200"]
        assert prefill.endswith("max_tokens 1, kv do_remote_decode")
        assert decode.split()[:4] == ["decode", "POST", "/inference/v1/generate", "200"]
        assert "kv from prefill" in decode
        assert last.split()[:2] == ["reply", "200"]
        assert reply in last
    assert "streamed" in sections["2. streaming chat: POST /v1/chat/completions"][2]
    # One pipeline, decode in auto as every shipped configuration: it chose each leg's mode.
    assert '"decode":{"output_mode":"auto","wrap_chat_completion":true}' in out.splitlines()[2]
    modes = [re.findall(r"(\w+) mode", sections[heading][2]) for heading in API_TRACES]
    assert modes == [["text"], ["text"], ["text"], ["text"], ["derender"]]


def test_demo_runs_sglang_prefill_and_decode_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    sections = _demo_sections(capsys.readouterr().out)
    render, prefill, decode, reply = sections["6. chat on SGLang: POST /v1/chat/completions"]
    assert render.split()[:4] == ["render", "POST", "/v1/chat/completions/render", "200"]
    assert prefill.split()[:4] == ["prefill", "POST", "/generate", "200"]
    assert decode.split()[:4] == ["decode", "POST", "/generate", "200"]
    assert decode.endswith("sent with prefill")
    assert reply.split()[:2] == ["reply", "200"]
    assert "'Hello!'" in reply
    _, prefill, abort, reply = sections["7. a prefill that fails: POST /v1/chat/completions"]
    assert prefill.split()[:5] == ["prefill", "POST", "/generate", "500", "failed"]
    assert abort.split()[:5] == ["decode", "POST", "/abort_request", "200", "cancelled:"]
    assert reply.startswith("   reply    502 error: prefill failed with HTTP 500")


def test_demo_full_prints_every_body(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--full"]) == 0
    out = capsys.readouterr().out
    chat = out.split("\n2. ")[0]
    assert '"remote_host": "10.0.0.66"' in chat.split("render ")[0]  # the client's body
    prefill = chat.split("   prefill ")[1].split("   decode ")[0]
    assert '"max_tokens": 1' in prefill
    assert "10.0.0.66" not in prefill  # the client's transfer params reach no worker
    assert '"do_remote_decode": true' in prefill
    assert '"remote_engine_id"' in prefill  # the prefill's answer, handed to decode
    assert '"content": "Hello!"' in chat.split("   reply ")[1]
    assert "data: [DONE]" in out.split("\n3. ")[0]  # the streamed chat reply, as sent


def test_module_entry_point_runs_on_the_core_alone() -> None:
    # The README's quick start runs the demo on `pip install .`: no extra, so no httpx.
    blocked = "import sys; sys.modules.update(dict.fromkeys(['httpx', 'anyio', 'starlette']))"
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [
            sys.executable,
            "-c",
            f"{blocked}; import runpy; runpy.run_module('disagg_transforms', run_name='__main__')",
            "demo",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("   reply    200 ") == len(API_TRACES) + 1  # and SGLang's chat


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
        '<stdin>: decode.output_mode: expected "text", "derender" or "auto", got 3 (an integer)'
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


# --- demo, request, response ---------------------------------------------------------------------


def _fixture_file(tmp_path: Path, name: str) -> tuple[str, Any]:
    body = load_fixture(name)
    return _write(tmp_path, name, json.dumps(body)), body


def _leg_output(out: str) -> tuple[str, Any]:
    first, _, rest = out.partition("\n")
    return first, json.loads(rest)


@pytest.mark.parametrize(
    ("step", "params", "builder"),
    [
        (
            "decode",
            {"use_openai_format": False, "output_mode": "derender"},
            (build_decode_request, DecodeParams),
        ),
        ("prefill", {"use_openai_format": False}, (build_prefill_request, PrefillParams)),
        ("encode", {"use_openai_format": False}, (build_encode_request, EncodeParams)),
    ],
)
def test_request_round_trips_the_rendered_fixture(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    step: str,
    params: dict[str, Any],
    builder: tuple[Any, Any],
) -> None:
    build, params_type = builder
    path, body = _fixture_file(tmp_path, "request-decode-derender.json")
    argv = ["request", path, "--path", "/inference/v1/generate", "--step", step]
    assert main([*argv, "--params", json.dumps(params)]) == 0
    first, printed = _leg_output(capsys.readouterr().out)
    expected = build(body, client_path="/inference/v1/generate", params=params_type(**params))
    assert first == f"POST {expected.path}"
    assert printed == expected.body


def test_request_maps_a_chat_client_with_token_ids_from_a_file_or_inline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    ids = _write(tmp_path, "ids.json", "[1, 2, 3]")
    params = '{"use_openai_format": false}'
    _stdin(monkeypatch, json.dumps(chat).encode())
    assert main(["request", "-", "--params", params, "--token-ids", ids]) == 0
    first, printed = _leg_output(capsys.readouterr().out)
    assert first == "POST /inference/v1/generate"
    assert printed["token_ids"] == [1, 2, 3]
    assert printed["sampling_params"] == {"max_tokens": 5}
    path = _write(tmp_path, "chat.json", json.dumps(chat))
    assert main(["request", path, "--params", params, "--token-ids", "[4]"]) == 0
    assert _leg_output(capsys.readouterr().out)[1]["token_ids"] == [4]
    # The default decode step keeps the client's route: the body comes back as sent.
    assert main(["request", path]) == 0
    assert _leg_output(capsys.readouterr().out) == ("POST /v1/chat/completions", chat)


@pytest.mark.parametrize(
    "name",
    [
        "response-text.json",
        "response-text-logprobs.json",
        "response-text-finish-abort.json",
        "response-text-finish-repetition.json",
        "response-derender-text.json",
        "response-derender-tool-call.json",
    ],
)
def test_response_round_trips_the_fixtures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path, body = _fixture_file(tmp_path, name)
    mode = body["output_mode"]
    client = {"model": "m", "top_logprobs": 1}
    client_path = _write(tmp_path, "client.json", json.dumps(client))
    wrappers = {
        "chat": wrap_chat_completion,
        "responses": wrap_responses_response,
        "anthropic": wrap_anthropic_message,
    }
    for envelope, wrap in wrappers.items():
        argv = ["response", path, "--mode", mode, "--envelope", envelope]
        assert main([*argv, "--client-body", client_path]) == 0, capsys.readouterr().err
        printed = json.loads(capsys.readouterr().out)
        expected = wrap(body, requested=OutputMode(mode), client_body=client)
        if "created" in expected and "created" not in body:
            printed.pop("created", None)
            expected.pop("created")
        assert printed == expected


def test_response_refuses_a_mismatched_echo_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _fixture_file(tmp_path, "response-tokens.json")
    assert main(["response", path, "--mode", "text"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith('disagg-transforms: error: $.output_mode: requested "text"')


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["request", "{missing}"], "cannot read {missing}: "),
        (["response", "{missing}"], "cannot read {missing}: "),
        (["request", "{bad}"], "{bad}: not valid JSON: "),
        (["response", "{bad}"], "{bad}: not valid JSON: "),
        (["response", "{good}", "--client-body", "{bad}"], "{bad}: not valid JSON: "),
        (["request", "{good}", "--params", "{{"], "--params: not valid JSON: "),
        (["request", "{good}", "--params", "[1]"], "--params: expected a JSON object"),
        (["request", "{good}", "--params", '{"typo": 1}'], "decode.typo: "),
        (["request", "{good}", "--token-ids", "[1, "], "--token-ids: not valid JSON: "),
        (["request", "{good}", "--token-ids", "{missing}"], "cannot read {missing}: "),
        (
            ["request", "{good}", "--params", '{"use_openai_format": false}'],
            "$.token_ids: required",
        ),
        (
            ["response", "{good}"],
            '$: requested "text", the worker\'s response is not a generate response',
        ),
        (["request", "{array}"], "$: expected an object"),
    ],
)
def test_request_and_response_errors_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    files = {
        "missing": str(tmp_path / "nope.json"),
        "bad": _write(tmp_path, "bad.json", "{not json"),
        "good": _write(tmp_path, "good.json", json.dumps({"model": "m"})),
        "array": _write(tmp_path, "array.json", "[1]"),
    }

    def fill(text: str) -> str:
        for key, value in files.items():
            text = text.replace(f"{{{key}}}", value)
        return text

    argv = [fill(arg) for arg in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("disagg-transforms: error: ")
    assert fill(says) in line


def test_request_errors_never_show_a_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "chat.json", json.dumps({"max_tokens": 0}))
    done = subprocess.run(  # noqa: S603 - our own interpreter on a file the test wrote
        [
            sys.executable,
            "-m",
            "disagg_transforms",
            "request",
            path,
            "--params",
            '{"use_openai_format": false}',
            "--token-ids",
            "[1]",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("disagg-transforms: error: $.max_tokens")


# --- usage errors, inline token IDs, dropped keys, big integers, YAML on stdin -------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["response", "x.json", "--envelope", "bogus"], "argument --envelope: invalid choice"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["request"], "the following arguments are required: file"),
        ([], "the following arguments are required: command"),
        (["request", "x.json", "--step"], "argument --step: expected one argument"),
        (["check-config", "x.json", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("disagg-transforms: error: ")
    assert says in line
    assert line.endswith("--help)")


def test_a_usage_error_from_the_script_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "disagg_transforms", "response", "x", "--envelope", "bogus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_help_still_prints_usage_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["request", "--help"])
    assert exited.value.code == 0
    assert "--token-ids" in capsys.readouterr().out


_GENERATE = '{"use_openai_format": false}'
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.mark.parametrize(
    ("text", "ids"),
    [("1,2,3", [1, 2, 3]), ("7", [7]), (" 4 , 5 ", [4, 5]), (f"{2**63 - 1},0", [2**63 - 1, 0])],
)
def test_token_ids_inline_as_a_comma_separated_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, ids: list[int]
) -> None:
    path = _write(tmp_path, "chat.json", json.dumps(_CHAT))
    assert main(["request", path, "--params", _GENERATE, "--token-ids", text]) == 0
    assert _leg_output(capsys.readouterr().out)[1]["token_ids"] == ids


def test_token_ids_inline_wins_over_a_file_of_that_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A digits-and-commas value is always the list itself; ./NAME reads such a file.
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "12", "[9, 9]")
    path = _write(tmp_path, "chat.json", json.dumps(_CHAT))
    assert main(["request", path, "--params", _GENERATE, "--token-ids", "12"]) == 0
    assert _leg_output(capsys.readouterr().out)[1]["token_ids"] == [12]
    assert main(["request", path, "--params", _GENERATE, "--token-ids", "./12"]) == 0
    assert _leg_output(capsys.readouterr().out)[1]["token_ids"] == [9, 9]


def test_token_ids_inline_are_checked_by_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "chat.json", json.dumps(_CHAT))
    assert main(["request", path, "--params", _GENERATE, "--token-ids", "1,-2"]) == 2
    [line] = _err_lines(capsys)
    assert "$.token_ids[1]" in line


def test_request_reports_the_dropped_keys_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "chat.json", json.dumps(_CHAT))
    argv = ["request", path, "--path", "/v1/responses", "--params", _GENERATE]
    assert main([*argv, "--token-ids", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "disagg-transforms: dropped from the client's body: messages, max_tokens"
    ]
    first, printed = _leg_output(captured.out)
    assert first == "POST /inference/v1/generate"
    assert "max_tokens" not in printed["sampling_params"]


def test_request_with_nothing_dropped_prints_nothing_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An OpenAI-format leg keeps the client's body whole.
    path = _write(tmp_path, "chat.json", json.dumps(_CHAT))
    assert main(["request", path]) == 0
    assert capsys.readouterr().err == ""


@given(big=st.integers(min_value=2**64, max_value=2**256) | st.integers(-(2**256), -(2**63) - 1))
def test_request_keeps_integers_beyond_64_bits_exactly(big: int) -> None:
    body = {"model": "m", "x_seed": big, "nested": [big, {"n": big}]}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _request_stdin(json.dumps(body).encode(), ["request", "-"])
    assert code == 0, err.getvalue()
    text = out.getvalue()
    assert str(big) in text
    assert _leg_output(text)[1] == body


def _request_stdin(data: bytes, argv: list[str]) -> int:
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data))
    try:
        return main(argv)
    finally:
        sys.stdin = saved


def test_yaml_on_stdin_without_the_flag_names_format_yaml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, b"steps:\n  decode:\n    output_mode: text\n")
    assert main(["check-config", "-"]) == 2
    [line] = _err_lines(capsys)
    assert line.startswith("disagg-transforms: error: <stdin>: not valid JSON: ")
    assert "--format yaml" in line


def test_json_named_explicitly_gives_no_yaml_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, b"steps: {}\n")
    assert main(["check-config", "-", "--format", "json"]) == 2
    [line] = _err_lines(capsys)
    assert "--format yaml" not in line


# --- a document nested past the stack: one line, exit 2, whatever the subcommand -----------------

_TOO_DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("argv", "stdin"),
    [
        (["request", "-"], _TOO_DEEP),
        (["request", "-", "--params", _TOO_DEEP], "{}"),
        (["request", "-", "--token-ids", _TOO_DEEP], "{}"),
        (["response", "-"], _TOO_DEEP),
        (["check-config", "-"], _TOO_DEEP),
        (["check-config", "-", "--format", "json"], '{"steps": ' + _TOO_DEEP + "}"),
    ],
)
def test_a_document_nested_too_deep_is_one_line_and_exit_2(argv: list[str], stdin: str) -> None:
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "disagg_transforms", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "nested too deep" in done.stderr
