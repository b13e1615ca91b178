"""SGLang: one ``/generate`` body to both workers at once, met by a bootstrap room.

Its leg is built by :mod:`disagg_transforms._request.sglang`; its answers and cumulative streams
are read by :mod:`disagg_transforms._response.sglang` into the generate answer the envelopes
read (``docs/sglang.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Any, Final, Literal, TypeAlias

import msgspec

from disagg_transforms._engines.description import Engine, EngineDescription, Meeting
from disagg_transforms._response.sglang import (
    SglangFailure,
    SglangStreamReader,
    answer_failure,
    generate_answer,
    prompt_logprobs,
)
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError

__all__ = ("DEFAULT_BOOTSTRAP_PORT", "DESCRIPTION", "SglangSettings", "StreamOutput")

DEFAULT_BOOTSTRAP_PORT: Final = 8998
"""SGLang's ``--disaggregation-bootstrap-port`` default."""
_PORTS: Final = range(1, 65536)

StreamOutput: TypeAlias = Literal["cumulative", "incremental"]
"""How the workers stream: every event the whole text so far (SGLang's default), or deltas
(``--incremental-streaming-output``)."""


class SglangSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a router's SGLang workers meet and stream (``docs/sglang.md``); frozen, build once."""

    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    """The prefill workers' bootstrap port (``--disaggregation-bootstrap-port``)."""
    stream_output: StreamOutput = "cumulative"
    """The workers' stream: ``cumulative`` (SGLang's default) or ``incremental`` (run with
    ``--incremental-streaming-output``)."""
    random_bits: Callable[[int], int] | None = None
    """The host's generator of each request's ``rid`` and room (``secrets.randbits`` when
    ``None``): the library keeps no state."""

    def __post_init__(self) -> None:
        port: object = self.bootstrap_port
        if type(port) is not int or port not in _PORTS:
            msg = f"sglang.bootstrap_port: expected a port in 1..65535, got {describe(port)}"
            raise ConfigError(msg, param="sglang.bootstrap_port")
        output: object = self.stream_output
        if output not in ("cumulative", "incremental"):
            msg = (
                "sglang.stream_output: expected 'cumulative' or 'incremental', "
                f"got {describe(output)}"
            )
            raise ConfigError(msg, param="sglang.stream_output")


def _read(
    answer: Mapping[str, Any], stop_token_ids: Container[int]
) -> dict[str, Any] | SglangFailure:
    return generate_answer(answer, stop_token_ids=stop_token_ids)


def _stream(
    max_event_bytes: int, stop_token_ids: Container[int], *, incremental: bool
) -> SglangStreamReader:
    return SglangStreamReader(
        max_event_bytes=max_event_bytes, stop_token_ids=stop_token_ids, incremental=incremental
    )


DESCRIPTION = EngineDescription(
    engine=Engine.SGLANG,
    token_path=w.SGLANG_GENERATE_PATH,
    meeting=Meeting.RENDEZVOUS,
    abort_path=w.SGLANG_ABORT_PATH,
    read_answer=_read,
    stream_reader=_stream,
    prompt_logprobs=prompt_logprobs,
    peer_failure=answer_failure,
)
