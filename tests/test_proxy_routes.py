"""The proxy's routes besides the client APIs, and what its simulated worker serves: real SDKs.

``serve --simulate`` processes (tests/proxy_helpers.py): count_tokens from the render,
``/tokenize``, ``/detokenize`` and ``/version`` from the render worker, JSON errors for any other
path or method, structured output, and ``--served-model-name``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest
from proxy_helpers import Server, running

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@dataclass
class Servers:
    generate: Server  # serve --simulate: the default pipeline (render, prefill, decode)
    coupled: Server  # serve --simulate, every leg in OpenAI format (no render)
    named: Server  # serve --simulate --served-model-name qwen alias


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    logs = tmp_path_factory.mktemp("routes")
    coupled = logs / "coupled.json"
    coupled.write_text(json.dumps({"use_openai_format": True, "steps": {"decode": {}}}))
    serve = ["serve", "--simulate", "--port", "0"]
    with running(
        (serve, logs / "generate.log"),
        ([*serve, "--config", str(coupled)], logs / "coupled.log"),
        ([*serve, "--served-model-name", "qwen", "alias"], logs / "named.log"),
    ) as started:
        yield Servers(*started)


def openai_client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def anthropic_client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def rendered_token_ids(server: Server, body: dict[str, Any]) -> list[int]:
    """What the render worker itself makes of a Messages body."""
    answer = httpx.post(server.url + "/simulated/v1/messages/render", json=body)
    assert answer.status_code == 200, answer.text
    token_ids: list[int] = answer.json()["token_ids"]
    return token_ids


# -- count_tokens -------------------------------------------------------------------------------


def test_anthropic_count_tokens_is_the_renders_token_count(servers: Servers) -> None:
    client = anthropic_client(servers.generate)
    counted = client.messages.count_tokens(
        model="m", system="Be brief.", messages=MESSAGES, tools=[WEATHER]
    )
    body = {"model": "m", "system": "Be brief.", "messages": MESSAGES, "tools": [WEATHER]}
    expected = len(rendered_token_ids(servers.generate, {**body, "max_tokens": 1}))
    assert counted.input_tokens == expected
    plain = client.messages.count_tokens(model="m", messages=MESSAGES)
    assert 0 < plain.input_tokens < expected
    # A client's own transfer params are not the render's (the exchange removes them).
    raw = httpx.post(
        servers.generate.url + "/v1/messages/count_tokens",
        json={"model": "m", "messages": MESSAGES, "kv_transfer_params": {"do_remote_decode": 1}},
        headers={"x-request-id": "count-1"},
    )
    assert raw.json() == {
        "input_tokens": plain.input_tokens,
        "context_management": {"original_input_tokens": plain.input_tokens},
    }
    assert raw.headers["x-request-id"] == "count-1"
    render = servers.generate.wait_for_log("count-1")
    assert "POST /v1/messages/count_tokens 200 render=200/" in render


def test_count_tokens_errors_are_anthropic_errors(servers: Servers) -> None:
    client = anthropic_client(servers.generate)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.count_tokens(model="m", messages="not a list")  # type: ignore[arg-type]
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    not_json = httpx.post(servers.generate.url + "/v1/messages/count_tokens", content=b"[1, 2]")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["message"].endswith("must be a JSON object, got an array")
    with pytest.raises(anthropic.NotFoundError):
        anthropic_client(servers.named).messages.count_tokens(model="other", messages=MESSAGES)
    counted = anthropic_client(servers.named).messages.count_tokens(model="qwen", messages=MESSAGES)
    assert counted.input_tokens > 0


# -- the render worker's own routes --------------------------------------------------------------


def test_tokenize_detokenize_and_version_are_the_render_workers(servers: Servers) -> None:
    url = servers.generate.url
    tokens = httpx.post(url + "/tokenize", json={"model": "m", "prompt": "Hi"}).json()
    assert tokens == {"count": 2, "max_model_len": 4096, "tokens": [1072, 1105], "token_strs": None}
    chat = httpx.post(url + "/tokenize", json={"model": "m", "messages": MESSAGES}).json()
    assert chat["count"] == len(chat["tokens"]) > tokens["count"]
    text = httpx.post(url + "/detokenize", json={"model": "m", "tokens": tokens["tokens"]})
    assert text.json() == {"prompt": "Hi"}
    assert httpx.get(url + "/version").json() == {"version": "0.33.0"}
    refused = httpx.post(url + "/detokenize", json={"tokens": "x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "Bad Request"


# -- any other path or method: a JSON error ------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/v1/nothing", 404, None),
        ("POST", "/v1/embeddings", 404, None),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("POST", "/health", 405, "GET, HEAD"),
        ("DELETE", "/v1/messages/count_tokens", 405, "POST"),
        ("POST", "/version", 405, "GET, HEAD"),
    ],
)
def test_any_other_path_or_method_is_a_json_error(
    servers: Servers, method: str, path: str, status: int, allow: str | None
) -> None:
    answer = httpx.request(method, servers.generate.url + path, json={})
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    allowed = answer.headers.get("allow")
    assert (allowed and set(allowed.split(", "))) == (allow and set(allow.split(", ")))
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (status, None)
    assert error["message"].endswith(f": {method} {path}")


def test_the_openai_sdk_reads_an_unknown_route_as_not_found(servers: Servers) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client(servers.generate).embeddings.create(model="m", input="hi")
    assert not_found.value.status_code == 404
    assert not_found.value.body == {  # the SDK hands over the "error" member
        "message": "Not Found: POST /v1/embeddings",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


# -- structured output ---------------------------------------------------------------------------


class City(pydantic.BaseModel):
    name: str
    population: int = pydantic.Field(ge=1000)
    coastal: bool
    districts: list[str] = pydantic.Field(min_length=2)
    mayor: Mayor | None


class Mayor(pydantic.BaseModel):
    name: str
    party: str


City.model_rebuild()


@pytest.mark.parametrize("pipeline", ["generate", "coupled"])
def test_chat_completions_parse_with_a_pydantic_model(servers: Servers, pipeline: str) -> None:
    client = openai_client(getattr(servers, pipeline))
    completion = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=City)
    city = completion.choices[0].message.parsed
    assert isinstance(city, City)
    assert city.population >= 1000
    assert len(city.districts) == 2
    assert isinstance(city.mayor, Mayor)


def test_a_json_object_response_format_is_answered_with_json(servers: Servers) -> None:
    completion = openai_client(servers.generate).chat.completions.create(
        model="m", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert json.loads(completion.choices[0].message.content or "") == {}


# -- --served-model-name -------------------------------------------------------------------------


def test_served_model_names_are_listed_and_another_name_is_not_found(servers: Servers) -> None:
    client = openai_client(servers.named)
    assert [model.id for model in client.models.list().data] == ["qwen", "alias"]
    answer = client.chat.completions.create(model="alias", messages=MESSAGES)
    assert answer.choices[0].message.content == "Hello!"
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="other", messages=MESSAGES)
    assert not_found.value.status_code == 404
    assert "The model `other` does not exist." in str(not_found.value.message)
    # Without the flag, any name is served and `simulated` is listed.
    default = openai_client(servers.generate)
    assert [model.id for model in default.models.list().data] == ["simulated"]
    assert default.chat.completions.create(model="other", messages=MESSAGES).choices


def test_served_model_name_needs_simulate(tmp_path: pathlib.Path) -> None:
    import subprocess  # noqa: PLC0415

    from proxy_helpers import command, environment  # noqa: PLC0415

    done = subprocess.run(  # noqa: S603 - our own interpreter
        command("serve", "--decode-url", "http://d", "--served-model-name", "x"),
        capture_output=True,
        text=True,
        env=environment(),
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("give it with --simulate")


def test_simulate_takes_served_model_names_repeated_or_after_one_flag(
    tmp_path: pathlib.Path,
) -> None:
    args = ["simulate", "--port", "0", "--served-model-name", "a", "b", "--served-model-name", "c"]
    with running((args, tmp_path / "worker.log")) as (worker,):
        models = httpx.get(worker.url + "/v1/models").json()
        assert [model["id"] for model in models["data"]] == ["a", "b", "c"]
        refused = httpx.post(worker.url + "/tokenize", json={"model": "d", "prompt": "x"})
        assert (refused.status_code, refused.json()["error"]["type"]) == (404, "NotFoundError")
