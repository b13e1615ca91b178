"""The baselines the library is measured against, each doing the same job another way.

- ``orjson_round_trip``: ``orjson.loads`` + ``orjson.dumps`` of the same bytes, the floor of
  "parse it once".
- ``syntax_scan``: decoding into an empty ``msgspec.Struct``: every value is skipped but the JSON
  syntax is still checked, the floor of any transform that refuses bad JSON.
- ``decode_leg_*`` / ``wrap_*``: the same transform written the usual way, on dicts, with orjson,
  with the stdlib ``json`` module, and with pydantic v2 models that validate the fields the way
  vLLM's own protocol layer does (``token_ids`` as a list of non-negative ints).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

import msgspec
import orjson
import pydantic

_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_INT64_MAX = 2**63 - 1


class _Empty(msgspec.Struct):
    pass


_SCAN = msgspec.json.Decoder(_Empty)


def orjson_round_trip(raw: bytes) -> bytes:
    return orjson.dumps(orjson.loads(raw))


def syntax_scan(raw: bytes) -> bytes:
    _SCAN.decode(raw)
    return raw


# --- decode leg for a generate client: validate token_ids, move the cap, set output_mode ------


def _decode_leg_on_dict(body: dict[str, Any]) -> dict[str, Any]:
    token_ids = body["token_ids"]
    if not token_ids or not all(type(t) is int and 0 <= t <= _INT64_MAX for t in token_ids):
        msg = "bad token_ids"
        raise ValueError(msg)
    out = dict(body)
    sampling = dict(out.get("sampling_params") or {})
    for key in _CAPS:
        if key in out:
            cap = out.pop(key)
            if cap is not None and "max_tokens" not in sampling:
                sampling["max_tokens"] = cap
    out["sampling_params"] = sampling
    out["output_mode"] = "text"
    return out


def decode_leg_orjson(raw: bytes) -> bytes:
    return orjson.dumps(_decode_leg_on_dict(orjson.loads(raw)))


def decode_leg_stdlib(raw: bytes) -> bytes:
    leg = _decode_leg_on_dict(json.loads(raw))
    return json.dumps(leg, separators=(",", ":"), ensure_ascii=False).encode()


class _PydanticGenerateRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")

    token_ids: Annotated[
        list[Annotated[int, pydantic.Field(ge=0, le=_INT64_MAX)]], pydantic.Field(min_length=1)
    ]
    sampling_params: dict[str, Any] = pydantic.Field(default_factory=dict)
    max_tokens: int | None = None
    output_mode: str = "tokens"


def decode_leg_pydantic(raw: bytes) -> bytes:
    request = _PydanticGenerateRequest.model_validate_json(raw)
    sampling = dict(request.sampling_params)
    if request.max_tokens is not None and "max_tokens" not in sampling:
        sampling["max_tokens"] = request.max_tokens
    update = {"sampling_params": sampling, "output_mode": "text"}
    out = request.model_copy(update=update)
    return out.model_dump_json(exclude={"max_tokens"}).encode()


# --- wrap a generate response into a chat.completion -------------------------------------------

_CHOICE_KEEP = ("index", "logprobs", "finish_reason", "stop_reason")
_TOP_KEEP = ("created", "model", "usage")
# The nulls vLLM's own chat writes, which the library writes too (docs/responses.md).
_MESSAGE_NULLS = dict.fromkeys(("refusal", "annotations", "audio", "function_call", "reasoning"))
_CHOICE_NULLS = dict.fromkeys(("token_ids", "routed_experts", "weight_versions"))
_TOP_NULLS = dict.fromkeys(
    (
        "service_tier",
        "system_fingerprint",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "metrics",
    )
)


def _text_message(text: Any) -> dict[str, Any]:  # noqa: ANN401 - JSON
    return {"role": "assistant", "content": text, **_MESSAGE_NULLS}


def _cut(logprobs: dict[str, Any] | None, top: int) -> dict[str, Any] | None:
    # Text mode: each top_logprobs list cut to the client's top_logprobs, as the chat route does.
    if not logprobs:
        return logprobs
    content = [{**e, "top_logprobs": e["top_logprobs"][:top]} for e in logprobs["content"]]
    return {**logprobs, "content": content}


def _wrap_on_dict(response: dict[str, Any], mode: str, top: int) -> dict[str, Any]:
    if response.get("output_mode") != mode:
        msg = "output_mode echo"
        raise ValueError(msg)
    choices = []
    for choice in response["choices"]:
        out = {key: choice[key] for key in _CHOICE_KEEP if key in choice}
        if mode == "derender":
            out["message"] = choice["message"]
        else:
            out["message"] = _text_message(choice["text"])
            out["logprobs"] = _cut(choice.get("logprobs"), top)
        choices.append({**out, **_CHOICE_NULLS})
    wrapped = {key: response[key] for key in _TOP_KEEP if key in response}
    wrapped["id"] = response["request_id"].removeprefix("generate-tokens-")
    wrapped["object"] = "chat.completion"
    wrapped["choices"] = choices
    return {**wrapped, **_TOP_NULLS}


def wrap_orjson(raw: bytes, mode: str, top: int) -> bytes:
    return orjson.dumps(_wrap_on_dict(orjson.loads(raw), mode, top))


def wrap_stdlib(raw: bytes, mode: str, top: int) -> bytes:
    wrapped = _wrap_on_dict(json.loads(raw), mode, top)
    return json.dumps(wrapped, separators=(",", ":"), ensure_ascii=False).encode()


class _PydanticChoice(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    index: int
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str | None = None
    message: dict[str, Any] | None = None
    logprobs: dict[str, Any] | None = None


class _PydanticResponse(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    request_id: str
    model: str | None = None
    created: int | None = None
    usage: dict[str, Any] | None = None
    output_mode: str
    choices: list[_PydanticChoice]


def _chat_completion(
    response: Any,  # noqa: ANN401 - a typed view: pydantic's or msgspec's
    mode: str,
    logprobs: Callable[[Any], Any],
) -> dict[str, Any]:
    """The ``chat.completion`` of a typed view of the generate response, echo checked."""
    if response.output_mode != mode:
        msg = "output_mode echo"
        raise ValueError(msg)
    return {
        "id": response.request_id.removeprefix("generate-tokens-"),
        "object": "chat.completion",
        "created": response.created,
        "model": response.model,
        "usage": response.usage,
        "choices": [
            {
                "index": c.index,
                "message": c.message if mode == "derender" else _text_message(c.text),
                "logprobs": logprobs(c.logprobs),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                **_CHOICE_NULLS,
            }
            for c in response.choices
        ],
        **_TOP_NULLS,
    }


def _as_sent(logprobs: Any) -> Any:  # noqa: ANN401 - JSON
    return logprobs


def wrap_pydantic(raw: bytes, mode: str, top: int) -> bytes:
    response = _PydanticResponse.model_validate_json(raw)
    cut = _as_sent if mode == "derender" else partial(_cut, top=top)
    wrapped = _chat_completion(response, mode, cut)
    return pydantic.TypeAdapter(dict[str, Any]).dump_json(wrapped)


def _msgspec_cut_view(top: int) -> type[msgspec.Struct]:
    # The cheapest cut msgspec can express: each token's first ``top`` alternatives as the
    # fields of an array-like struct (the rest skipped while decoding), every value a Raw.
    alternatives = msgspec.defstruct(
        "Alternatives", [(f"item_{i}", msgspec.Raw) for i in range(top)], array_like=True, gc=False
    )
    entry = msgspec.defstruct(
        "Entry",
        [
            ("token", msgspec.Raw),
            ("logprob", msgspec.Raw),
            ("bytes", msgspec.Raw),
            ("top_logprobs", alternatives),
        ],
        gc=False,
    )
    return msgspec.defstruct("Logprobs", [("content", list[entry])], gc=False)  # type: ignore[valid-type]


class _MsgspecChoice(msgspec.Struct, gc=False):
    index: int
    finish_reason: msgspec.Raw = msgspec.Raw(b"null")
    stop_reason: msgspec.Raw = msgspec.Raw(b"null")
    text: msgspec.Raw = msgspec.Raw(b"null")
    message: msgspec.Raw = msgspec.Raw(b"null")
    logprobs: Any = None


_MSGSPEC_CUT_CLIENT_TOP = 2  # the wrap cases' client top_logprobs: one decoder built for it
_MsgspecChoiceCut = msgspec.defstruct(
    "ChoiceCut",
    [("logprobs", _msgspec_cut_view(_MSGSPEC_CUT_CLIENT_TOP) | None, None)],
    bases=(_MsgspecChoice,),
    gc=False,
)


def _msgspec_response(choice: type[msgspec.Struct]) -> msgspec.json.Decoder[Any]:
    view = msgspec.defstruct(
        "Response",
        [
            ("request_id", str),
            ("output_mode", str),
            ("choices", list[choice]),  # type: ignore[valid-type]
            ("model", msgspec.Raw, msgspec.Raw(b"null")),
            ("created", msgspec.Raw, msgspec.Raw(b"null")),
            ("usage", msgspec.Raw, msgspec.Raw(b"null")),
        ],
        gc=False,
    )
    return msgspec.json.Decoder(view)


_MSGSPEC_DECODERS = {
    "text": _msgspec_response(_MsgspecChoiceCut),
    "derender": _msgspec_response(
        msgspec.defstruct(
            "ChoiceRaw",
            [("logprobs", msgspec.Raw, msgspec.Raw(b"null"))],
            bases=(_MsgspecChoice,),
            gc=False,
        )
    ),
}


def wrap_msgspec(raw: bytes, mode: str, top: int) -> bytes:
    """The wrap written by hand with msgspec views: every value a Raw passed on, the text-mode
    cut made while decoding, no check at all (no UTF-8, no shapes): the floor of a msgspec
    design, which the library's own bytes path builds on."""
    if top != _MSGSPEC_CUT_CLIENT_TOP:
        msg = f"the msgspec baseline cuts to {_MSGSPEC_CUT_CLIENT_TOP} alternatives"
        raise ValueError(msg)
    response = _MSGSPEC_DECODERS[mode].decode(raw)
    return msgspec.json.encode(_chat_completion(response, mode, _as_sent))


# --- convert a generate SSE stream into chat.completion.chunk events, chunk by chunk ----------

_DONE = b"[DONE]"


def chat_stream_orjson(events: list[bytes], completion_id: str, model: str, created: int) -> bytes:
    """The minimal per-chunk converter: parse the data line, build the chunk, dump it, frame it.

    No checks (echo, types, bounds) and no logprobs cut: the floor of any converter written on
    dicts with orjson. Cut as vLLM's chat route cuts a stream (``docs/responses.md``): an
    opening chunk for choice 0 (the benchmark's clients ask one), no chunk for an empty delta
    that does not finish, ``stop_reason`` and ``weight_versions`` on the finishing chunk only.
    """
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": created}
    head["model"] = model
    opening = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    out = [b"data: " + orjson.dumps(opening) + b"\n\n"]
    for event in events:
        data = event.removeprefix(b"data: ").rstrip()
        if data == _DONE:
            out.append(b"data: [DONE]\n\n")
            continue
        chunk = orjson.loads(data)
        if not chunk["choices"]:
            built = {**head, "choices": [], "usage": chunk["usage"]}
            out.append(b"data: " + orjson.dumps(built) + b"\n\n")
        for choice in chunk["choices"]:
            text, finish = choice["text"], choice["finish_reason"]
            if not text and finish is None and choice["logprobs"] is None:
                continue
            built_choice = {
                "index": choice["index"],
                "delta": {"content": text} if text else {},
                "logprobs": choice["logprobs"],
                "finish_reason": finish,
            }
            if finish is not None:
                built_choice["stop_reason"] = choice["stop_reason"]
            built_choice["token_ids"] = None
            if finish is not None:
                built_choice["weight_versions"] = None  # vLLM 0.33's finishing chunk
            built = {**head, "choices": [built_choice]}
            out.append(b"data: " + orjson.dumps(built) + b"\n\n")
    return b"".join(out)
