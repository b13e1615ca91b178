"""The proxy app's checks at startup, in process: which steps need which worker URLs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from strategies import proxy_steps, proxy_urls

from disagg_transforms import ConfigError, Route, Step, parse_pipeline_params, resolve_format

pytest.importorskip("starlette")
from disagg_transforms.integrations.proxy import create_app, url_errors


def _expected_problems(config: dict[Step, Any], urls: dict[str, str | None]) -> int:
    problems = int(Step.CONDITIONAL_DECODE in config)
    problems += int(Step.DECODE not in config or urls["decode_url"] is None)
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
