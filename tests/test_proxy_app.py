"""The proxy app in process: which steps need which worker URLs, ``/health`` and ``/v1/models``."""

from __future__ import annotations

import ctypes
import socket
from typing import Any

import pytest
from hypothesis import given
from strategies import proxy_steps, proxy_urls

from disagg_transforms import ConfigError, Route, Step, parse_pipeline_params, resolve_format
from disagg_transforms.testing import SimulatedWorker

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from proxy_helpers import served
from starlette.testclient import TestClient

from disagg_transforms.integrations import proxy
from disagg_transforms.integrations.proxy import create_app, url_errors


def _expected_problems(config: dict[Step, Any], urls: dict[str, str | None]) -> int:
    problems = int(Step.DECODE not in config or urls["decode_url"] is None)
    # A conditional decode asks the decode worker: it needs the decode URL too.
    problems += int(
        Step.CONDITIONAL_DECODE in config
        and Step.DECODE not in config
        and urls["decode_url"] is None
    )
    for step in (Step.ENCODE, Step.PREFILL):
        problems += int((step in config) != (urls[f"{step.value}_url"] is not None))
    generate = any(
        resolve_format(params.use_openai_format, "/v1/chat/completions") is Route.GENERATE
        for step, params in config.items()
        if step is not Step.CONDITIONAL_DECODE
    )
    return problems + int(urls["render_url"] is not None and not generate)


@given(steps=proxy_steps, urls=proxy_urls)
def test_every_mismatch_of_steps_and_urls_is_one_error(
    steps: dict[str, Any], urls: dict[str, str | None]
) -> None:
    config = parse_pipeline_params(steps)
    errors = url_errors(config, **urls)
    assert len(errors) == _expected_problems(config, urls)
    assert all(isinstance(error, ConfigError) and error.param for error in errors)
    if urls["decode_url"] is None:
        return
    decode_url: str = urls["decode_url"]

    def build() -> Any:
        return create_app(
            config,
            decode_url=decode_url,
            prefill_url=urls["prefill_url"],
            encode_url=urls["encode_url"],
            render_url=urls["render_url"],
        )

    if errors:
        with pytest.raises(ConfigError) as caught:
            build()
        assert caught.value.message == errors[0].message
    else:
        assert build().routes


def test_a_decode_only_pipeline_needs_only_the_decode_url() -> None:
    config = parse_pipeline_params({"decode": {}}, use_openai_format=False)
    assert url_errors(config, decode_url="http://d") == []
    assert url_errors(config, decode_url="http://d", render_url="http://r") == []
    openai_format = parse_pipeline_params({"decode": {}})
    [error] = url_errors(openai_format, decode_url="http://d", render_url="http://r")
    assert error.message.startswith("--render-url: no leg speaks the generate route")


def test_serve_without_the_proxy_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from disagg_transforms._cli.main import main  # noqa: PLC0415

    monkeypatch.setitem(__import__("sys").modules, "uvicorn", None)  # as if not installed
    assert main(["serve", "--decode-url", "http://d"]) == 2
    assert capsys.readouterr().err == (
        "disagg-transforms: error: this command needs uvicorn: "
        "pip install 'disagg_transforms[proxy]'\n"
    )


def test_models_is_the_decode_workers_answer_with_two_headers_passed_on() -> None:
    worker = SimulatedWorker()
    with served(worker) as url:
        app = create_app(parse_pipeline_params({"decode": {}}), decode_url=url)
        headers = {"authorization": "Bearer k", "x-request-id": "models-1", "x-other": "kept out"}
        with TestClient(app) as client:
            answer = client.get("/v1/models", headers=headers)
            assert client.get("/health").status_code == 200
    assert answer.status_code == 200
    assert "simulated" in [model["id"] for model in answer.json()["data"]]
    [call] = worker.calls_to("/v1/models")
    assert (call.headers["authorization"], call.headers["x-request-id"]) == ("Bearer k", "models-1")
    assert "x-other" not in call.headers
    assert worker.calls_to("/health") == []  # the proxy's /health calls no worker


@pytest.mark.skipif(not proxy._is_glibc(), reason="mallopt's thresholds are glibc's")
def test_each_serving_process_fixes_glibcs_heap_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Else where they end depends on the process's history (docs/performance.md, SGLang).
    assert proxy._steady_heap()  # glibc takes both
    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda _name: Libc())
    app = create_app(parse_pipeline_params({"decode": {}}), decode_url="http://127.0.0.1:9")
    with TestClient(app):
        assert calls == [(-3, 1 << 20), (-1, 8 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def test_an_unreachable_worker_is_a_502_naming_the_step() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
    try:
        app = create_app(parse_pipeline_params({"decode": {}}), decode_url=url)
        with TestClient(app) as client:
            health = client.get("/health")
            models = client.get("/v1/models")
            chat = client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
            )
    finally:
        sock.close()
    assert (health.status_code, health.content) == (200, b"")
    for answer in (models, chat):
        assert answer.status_code == 502
        assert answer.json()["error"]["message"] == "decode failed: could not connect to the worker"
