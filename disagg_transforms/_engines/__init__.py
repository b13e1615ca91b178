"""Engines: what depends on the worker engine, one description per engine (docs/sglang.md).

A pipeline's legs all speak one engine (KV cannot cross engines). What differs between vLLM and
SGLang is described here, one module per engine: the token route a leg is sent to, how prefill
and decode meet (vLLM: the prefill answers first and hands its ``kv_transfer_params`` on;
SGLang: both legs at once, the same body, a bootstrap room), how a worker is told to stop, and
how its answer and stream read as the generate answer every envelope is rebuilt from. Adding an
engine is a new module here and its row in :data:`ENGINES`.
"""

from __future__ import annotations

from collections.abc import Mapping

from disagg_transforms._engines import sglang, vllm
from disagg_transforms._engines.description import Engine, EngineDescription, Meeting
from disagg_transforms._engines.sglang import SglangSettings, StreamOutput

__all__ = ("ENGINES", "Engine", "EngineDescription", "Meeting", "SglangSettings", "StreamOutput")

ENGINES: Mapping[Engine, EngineDescription] = {
    Engine.VLLM: vllm.DESCRIPTION,
    Engine.SGLANG: sglang.DESCRIPTION,
}
"""Each engine's description, one row per engine."""
