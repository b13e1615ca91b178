"""vLLM: the engine the library was built for; its answers already are generate answers.

Its legs are built by :mod:`disagg_transforms._request.legs` (a prefill leg, then a decode leg
carrying the prefill's ``kv_transfer_params``); its answers are read by the envelope modules of
:mod:`disagg_transforms._response` as they come.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from disagg_transforms._engines.description import Engine, EngineDescription, Meeting
from disagg_transforms._routes import ROUTE_PATH, Route


def _as_is(answer: Mapping[str, Any], _stop_token_ids: Container[int]) -> dict[str, Any]:
    return dict(answer)


DESCRIPTION = EngineDescription(
    engine=Engine.VLLM,
    token_path=ROUTE_PATH[Route.GENERATE],
    meeting=Meeting.HANDOFF,
    abort_path=None,
    read_answer=_as_is,
    stream_reader=None,
    prompt_logprobs=None,
    peer_failure=None,
)
