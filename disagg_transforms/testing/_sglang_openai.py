"""SGLang 0.5.23's OpenAI routes on the simulated SGLang worker: the bodies, not the P/D meeting.

``/v1/chat/completions`` and ``/v1/completions`` as SGLang's OpenAI server reads and answers
them (``sglang/srt/entrypoints/openai/{protocol,serving_chat,serving_completions}.py``): the
rendezvous fields and ``rid`` at the top level (its ``PDRoutingFields``), the hermes tool parser
over the simulated model's ``<tool_call>`` text, SGLang's answer and chunk shapes
(``matched_stop``, ``reasoning_content``, ``metadata``), its ``ErrorResponse`` and in-stream
error. The worker (``_sglang.py``) meets the peer and calls :func:`answer` / :func:`chunks`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from disagg_transforms.testing._common import WorkerSettings
from disagg_transforms.testing._generate import _called_tool, _tool_arguments
from disagg_transforms.testing._render import chat_prompt
from disagg_transforms.testing._tokenizer import IM_END, encode

CHAT_PATH: Final = "/v1/chat/completions"
COMPLETIONS_PATH: Final = "/v1/completions"
OPENAI_PATHS: Final = (CHAT_PATH, COMPLETIONS_PATH)
_COMPLETIONS_CAP: Final = 16  # CompletionRequest.max_tokens' default; chat's is none
_ROUTING: Final = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "rid")


def error_response(message: str, error_type: str, code: int) -> dict[str, Any]:
    """SGLang's ``ErrorResponse`` (``serving_base.create_error_response``)."""
    return {"object": "error", "message": message, "type": error_type, "param": None, "code": code}


def stream_error(message: str, error_type: str, code: int) -> bytes:
    """SGLang's in-stream error event on its OpenAI routes (Python ``json.dumps`` spacing)."""
    payload = json.dumps({"error": error_response(message, error_type, code)})
    return f"data: {payload}\n\n".encode()


class OpenAIRefusalError(Exception):
    """A body SGLang's OpenAI layer refuses: 400 ``ErrorResponse``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.body = error_response(message, "BadRequest", 400)


@dataclasses.dataclass(frozen=True)
class OpenAITurn:
    """One OpenAI request as SGLang's server turns it into its ``GenerateReqInput``."""

    chat: bool
    model: str
    prompt: list[int]
    stream: bool
    include_usage: bool
    sampling: dict[str, Any]
    """SGLang's sampling names (``max_new_tokens``, ``stop``, ``no_stop_trim``)."""
    routing: dict[str, Any]
    """``rid`` and the rendezvous fields, as the route copies them into ``/generate``'s."""
    tool: Mapping[str, Any] | None
    """The function the simulated model calls (chat with tools), else ``None``."""


def _refuse(message: str) -> OpenAIRefusalError:
    return OpenAIRefusalError(message)


def _routing(body: Mapping[str, Any]) -> dict[str, Any]:
    """``PDRoutingFields`` and ``rid``, pydantic lax: a numeric-string room is taken as an int."""
    out: dict[str, Any] = {}
    for key in _ROUTING:
        value = body.get(key)
        if value is None:
            continue
        if key in ("bootstrap_port", "bootstrap_room"):
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                msg = f"1 validation error: {key}: Input should be a valid integer"
                raise _refuse(msg)
        elif not isinstance(value, str):
            msg = f"1 validation error: {key}: Input should be a valid string"
            raise _refuse(msg)
        out[key] = value
    return out


def read_turn(path: str, body: object, settings: WorkerSettings) -> OpenAITurn:
    """The request, or the refusal SGLang's OpenAI layer answers.

    Raises:
        OpenAIRefusalError: not an object, no prompt, a wrong type.
    """
    if not isinstance(body, dict):
        msg = "1 validation error: body: Input should be a valid dictionary"
        raise _refuse(msg)
    chat = path == CHAT_PATH
    tool = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            msg = "1 validation error: messages: Field required"
            raise _refuse(msg)
        tools = body.get("tools") or None
        choice = body.get("tool_choice", "auto")
        ids = body.get("input_ids")
        prompt = ids if isinstance(ids, list) else encode(chat_prompt(messages, tools, body))
        if tools and choice != "none":
            context = {"tools": tools, "tool_choice": choice}
            tool = _called_tool({"parse_context": context, "token_ids": prompt})
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        given = body.get("prompt")
        if isinstance(given, str):
            prompt = encode(given)
        elif isinstance(given, list) and given and all(type(i) is int for i in given):
            prompt = list(given)
        else:
            msg = "1 validation error: prompt: Input should be a valid string or list of int"
            raise _refuse(msg)
        cap = body.get("max_tokens", _COMPLETIONS_CAP)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
        msg = "1 validation error: max_tokens: Input should be a valid integer"
        raise _refuse(msg)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        msg = "1 validation error: stream: Input should be a valid boolean"
        raise _refuse(msg)
    options = body.get("stream_options")
    sampling = {"max_new_tokens": cap, "stop": body.get("stop")}
    if body.get("no_stop_trim") is True:
        sampling["no_stop_trim"] = True
    model = body.get("model")
    return OpenAITurn(
        chat=chat,
        model=model if isinstance(model, str) else settings.default_model,
        prompt=list(prompt),
        stream=stream,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        sampling=sampling,
        routing=_routing(body),
        tool=tool,
    )


def tool_script(tool: Mapping[str, Any]) -> list[int]:
    """What the simulated model writes to call ``tool``: hermes text, then the EOS."""
    call = {"name": tool["name"], "arguments": _tool_arguments(tool)}
    return [*encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>"), IM_END]


def _tool_calls(text: str, rid: str) -> tuple[str, list[dict[str, Any]]]:
    """SGLang's hermes detector: the text before the call and the calls (``_process_tool_calls``).

    SGLang's call id is ``call_`` and 24 random hex digits; here the digest of the rid, so a
    test can repeat it.
    """
    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if not 0 <= start < end:
        return text, []
    try:
        call = json.loads(text[start + len("<tool_call>") : end])
    except ValueError:
        return text, []
    digest = hashlib.sha256(rid.encode()).hexdigest()[:24]
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
    function = {"name": call.get("name"), "arguments": arguments}
    return text[:start].strip(), [
        {"id": f"call_{digest}", "index": 0, "type": "function", "function": function}
    ]


def _finish(meta: Mapping[str, Any], *, calls: bool) -> tuple[str | None, object]:
    """``finish_reason`` and ``matched_stop`` of a choice from ``meta_info.finish_reason``."""
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict):
        return None, None
    if calls and finish.get("type") == "stop":
        return "tool_calls", None
    return finish.get("type"), finish.get("matched")


def _usage(meta: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's ``UsageInfo`` (cache report off: no ``prompt_tokens_details``)."""
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def answer(turn: OpenAITurn, generated: Mapping[str, Any], created: int) -> dict[str, Any]:
    """The whole answer from the worker's ``/generate`` answer of the request."""
    meta = generated["meta_info"]
    if turn.chat:
        content, calls = _tool_calls(generated["text"], meta["id"])
        finish, matched = _finish(meta, calls=bool(calls))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": None,
        }
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
        kind = "chat.completion"
    else:
        finish, matched = _finish(meta, calls=False)
        choice = {"index": 0, "text": generated["text"], "logprobs": None}
        kind = "text_completion"
    choice.update(finish_reason=finish, matched_stop=matched)
    return {
        "id": meta["id"],
        "object": kind,
        "created": created,
        "model": turn.model,
        "choices": [choice],
        "usage": _usage(meta),
        "metadata": {"weight_version": meta.get("weight_version", "default")},
    }


def _chunk(turn: OpenAITurn, rid: str, created: int, choices: list[Any]) -> bytes:
    kind = "chat.completion.chunk" if turn.chat else "text_completion"
    head = {"id": rid, "object": kind, "created": created, "model": turn.model}
    return b"data: " + orjson.dumps({**head, "choices": choices}) + b"\n\n"


def _stream_choice(delta: Mapping[str, Any], finish: str | None, matched: object) -> dict[str, Any]:
    return {
        "index": 0,
        "delta": {"reasoning_content": None, **delta},
        "logprobs": None,
        "finish_reason": finish,
        "matched_stop": matched,
    }


def chunks(turn: OpenAITurn, generated: Sequence[Mapping[str, Any]], created: int) -> list[bytes]:
    """The stream's events from the worker's cumulative ``/generate`` events (no ``[DONE]``).

    Chat: the role chunk, a content delta per event (a tool call: its name and id, then its
    arguments, as the hermes detector streams them), the finish chunk; completions: a text delta
    per event, the last with its finish. Then the usage chunk when ``stream_options`` asks.
    """
    rid = generated[-1]["meta_info"]["id"]
    out: list[bytes] = []
    sent = ""
    last = generated[-1]["meta_info"]
    if turn.chat:
        out.append(
            _chunk(
                turn,
                rid,
                created,
                [_stream_choice({"role": "assistant", "content": ""}, None, None)],
            )
        )
        _, calls = _tool_calls(generated[-1]["text"], rid)
        if calls:
            call = calls[0]
            named = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            arguments = {
                "id": None,
                "index": 0,
                "type": "function",
                "function": {"name": None, "arguments": call["function"]["arguments"]},
            }
            for delta in (named, arguments):
                tool_delta = {"role": None, "content": None, "tool_calls": [delta]}
                out.append(_chunk(turn, rid, created, [_stream_choice(tool_delta, None, None)]))
        else:
            for event in generated:
                delta, sent = event["text"][len(sent) :], event["text"]
                if delta:
                    choice = _stream_choice({"content": delta}, None, None)
                    out.append(_chunk(turn, rid, created, [choice]))
        finish, matched = _finish(last, calls=bool(calls))
        out.append(_chunk(turn, rid, created, [_stream_choice({}, finish, matched)]))
    else:
        for event in generated:
            delta, sent = event["text"][len(sent) :], event["text"]
            finish, matched = _finish(event["meta_info"], calls=False)
            choice = {
                "index": 0,
                "text": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": matched,
            }
            out.append(_chunk(turn, rid, created, [choice]))
    if turn.include_usage:
        kind = "chat.completion.chunk" if turn.chat else "text_completion"
        usage = {"id": rid, "object": kind, "created": created, "model": turn.model}
        usage.update(choices=[], usage=_usage(last))
        out.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    return out
