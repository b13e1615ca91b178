"""``simulate --engine sglang``: a prefill and a decode as separate processes meet by room."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import time

import httpx
import pytest
from proxy_helpers import command, environment, running

from disagg_transforms._request.sglang import Rendezvous, build_sglang_request
from disagg_transforms._response.sglang import generate_answer, sglang_error_message
from disagg_transforms.testing import toy_encode

SGLANG = ["simulate", "--engine", "sglang", "--port", "0"]


def _body(bootstrap_port: int, room: int) -> dict[str, object]:
    rendezvous = Rendezvous(
        rid=f"{room:032x}",
        bootstrap_host="127.0.0.1",
        bootstrap_port=bootstrap_port,
        bootstrap_room=room,
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
    return build_sglang_request(
        chat, client_path="/v1/chat/completions", rendezvous=rendezvous, token_ids=toy_encode("hi")
    ).body


async def _pair(
    prefill: str, decode: str
) -> tuple[httpx.Response, httpx.Response, httpx.Response, float]:
    async with httpx.AsyncClient(timeout=30) as client:
        info = (await client.get(f"{prefill}/server_info")).json()
        assert info["disaggregation_mode"] == "prefill"
        body = _body(info["disaggregation_bootstrap_port"], room=42)
        first, second = await asyncio.gather(
            client.post(f"{prefill}/generate", json=body),
            client.post(f"{decode}/generate", json=body),
        )
        started = time.monotonic()
        alone = await client.post(f"{decode}/generate", json=_body(1, room=43))
        return first, second, alone, time.monotonic() - started


def test_a_prefill_and_a_decode_process_meet_by_room(tmp_path: pathlib.Path) -> None:
    prefill_args = [*SGLANG, "--disaggregation-mode", "prefill", "--bootstrap-port", "0"]
    decode_args = [*SGLANG, "--disaggregation-mode", "decode", "--transfer-timeout", "0.5"]
    with running(
        (prefill_args, tmp_path / "prefill.log"), (decode_args, tmp_path / "decode.log")
    ) as (prefill, decode):
        first, second, alone, waited = asyncio.run(_pair(prefill.url, decode.url))
    assert first.status_code == second.status_code == 200
    assert first.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    read = generate_answer(second.json())
    assert isinstance(read, dict)
    assert read["choices"][0]["text"] == "Hello!"
    # A decode whose prefill never gets the room fails after --transfer-timeout, as SGLang does.
    assert alone.status_code == 500
    assert waited >= 0.5
    message = sglang_error_message(alone.json())
    assert message is not None
    assert message.startswith("Decode transfer failed")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ([*SGLANG, "--fault", "bogus"], "--fault: unknown SGLang fault 'bogus'"),
        ([*SGLANG, "--gateway"], "--gateway simulates llm-d's gateway"),
        (["simulate", "--disaggregation-mode", "prefill"], "need --engine sglang"),
    ],
)
def test_simulate_refuses_what_sglang_does_not_take(args: list[str], line: str) -> None:
    result = subprocess.run(  # noqa: S603 - our own interpreter and command
        command(*args), capture_output=True, text=True, timeout=60, env=environment(), check=False
    )
    assert result.returncode == 2
    assert line in result.stderr
