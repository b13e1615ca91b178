"""``POST /v1/chat/completions`` and ``/v1/completions``: vLLM's coupled serving.

A leg sent in OpenAI format (``use_openai_format: true``), and a completions client on any
pipeline, speak these routes. The request is rendered as ``/render`` would, generated as a
text-mode generate call would (as a ``derender`` one, the generate route's parser, when it
offers tools: :func:`parses`), and answered in the coupled envelope (the shapes of
``chat-completion-coupled.json`` and ``chat-completion-chunk-coupled.json``). Chat's logprobs
are cut to the request's ``top_logprobs`` as vLLM's chat serving cuts them, and completions
answers carry no logprobs. :func:`text_turn` is the same generation for the coupled Responses
and Messages routes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import orjson

from disagg_transforms.testing import _generate, _render
from disagg_transforms.testing._common import WorkerSettings

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


def parses(request: Mapping[str, Any]) -> bool:
    """Whether a rendered request runs the tool parser: it offers tools, ``tool_choice`` not none.

    Then the coupled routes generate as the generate route's ``derender`` mode does (the model
    thinks, and calls a tool), the request ``output_mode: auto`` gives that mode to; else as
    its ``text`` mode (docs/testing.md).
    """
    context = request.get("parse_context")
    if not isinstance(context, dict) or not context.get("tools"):
        return False
    return context.get("tool_choice") not in (None, "none")


def _generated(
    request: dict[str, Any], settings: WorkerSettings, call: _generate.Call, *, parse: bool = True
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A rendered request generated: the whole answer, or the stream's chunks.

    A request the tool parser runs on (unless ``parse`` is false) is generated in ``derender``
    mode (whole: that mode does not stream), its stream cut from the parse of each prefix
    (:func:`_parsed_chunks`).
    """
    parsed = parse and parses(request)
    streams = request.get("stream") is True
    request = {**request, "output_mode": "derender" if parsed else "text"}
    if parsed:
        request["stream"] = False
    _generate.validate(request, legacy=False)
    _generate.check_request(request, settings)
    answer = _generate.generate(
        request,
        settings,
        header_id=call.header_id,
        legacy=False,
        sequence=call.sequence,
        cached_tokens=call.cache.computed(request["token_ids"]),
    )
    if answer.events is not None:
        return None, [orjson.loads(event[len(b"data: ") :]) for event in answer.events[:-1]]
    assert answer.body is not None  # noqa: S101 - a whole answer
    if parsed and streams:
        return None, _parsed_chunks(answer.body, request)
    return answer.body, []


def _parsed_chunks(answer: Mapping[str, Any], request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A derender answer as the generate stream a parsing server would make of it.

    One chunk per token (the choices in turn), whose choice carries ``text`` (the content's
    delta) and ``parsed`` (the reasoning's delta, the tool calls the token completed); then the
    usage chunk when asked. A choice whose tokens are hidden (``include_reasoning: false``)
    comes whole in one chunk.
    """
    context = request["parse_context"]
    options = request.get("stream_options") or {}
    continuous = options.get("continuous_usage_stats") is True
    prompt = answer["usage"]["prompt_tokens"]
    steps: list[list[dict[str, Any]]] = []
    for choice in answer["choices"]:
        tokens = choice["token_ids"]
        messages = (
            [choice["message"]]
            if tokens is None
            else _generate.parsed_prefixes(
                tokens, choice["finish_reason"], context, answer["request_id"], choice["index"]
            )
        )
        entries = (choice["logprobs"] or {}).get("content")
        before: Mapping[str, Any] = {}
        for step, message in enumerate(messages):
            last = step == len(messages) - 1
            piece = {
                "index": choice["index"],
                "text": _grown(before.get("content"), message["content"]),
                "parsed": _parsed_delta(before, message),
                "finish_reason": choice["finish_reason"] if last else None,
                "stop_reason": choice["stop_reason"] if last else None,
                "token_ids": None if tokens is None else [tokens[step]],
                "logprobs": None if entries is None else {"content": [entries[step]]},
            }
            usage = None
            if continuous:
                usage = {"prompt_tokens": prompt, "completion_tokens": step + 1}
            while len(steps) <= step:
                steps.append([])
            steps[step].append(
                {"request_id": answer["request_id"], "usage": usage, "choices": [piece]}
            )
            before = message
    chunks = [chunk for step in steps for chunk in step]
    if options.get("include_usage") is True:
        usage = dict(answer["usage"])
        details = usage.pop("prompt_tokens_details")
        del usage["completion_tokens_details"]
        if details is not None:  # dumped without its nulls, as the generate stream's
            usage["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
        chunks.append({"request_id": answer["request_id"], "usage": usage, "choices": []})
    return chunks


def _grown(before: object, after: object) -> str:
    """What a text grew by between two parses (``""``: nothing, or none yet)."""
    old = before if isinstance(before, str) else ""
    new = after if isinstance(after, str) else ""
    return new.removeprefix(old)


def _parsed_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoning and tool calls a token added to the parse, as a chat delta writes them."""
    delta: dict[str, Any] = {}
    reasoning = _grown(before.get("reasoning"), after.get("reasoning"))
    if reasoning:
        delta["reasoning"] = reasoning
    done = len(before.get("tool_calls") or [])
    calls = (after.get("tool_calls") or [])[done:]
    if calls:
        delta["tool_calls"] = [
            {"index": done + offset, **call} for offset, call in enumerate(calls)
        ]
    return delta


@dataclasses.dataclass(frozen=True)
class TextTurn:
    """One choice generated, as the Responses and Messages routes read it."""

    deltas: tuple[str, ...]
    """The text's pieces as a stream sends them (empty ones left out); the whole text alone
    when the request does not stream (the parsed content, when the parser ran)."""
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens``, ``None`` when the usage has no details."""
    kv_transfer_params: Any
    """A prefill's NIXL params (a whole answer only: stream chunks carry none)."""
    parsed: bool = False
    """Whether the parser ran (a whole answer that offered tools)."""
    reasoning: str | None = None
    """The parsed reasoning."""
    tool_calls: tuple[dict[str, Any], ...] = ()
    """The parsed tool calls, in chat's shape."""

    @property
    def text(self) -> str:
        """The generated text."""
        return "".join(self.deltas)


def text_turn(
    request: dict[str, Any], body: object, settings: WorkerSettings, call: _generate.Call
) -> TextTurn:
    """Generate a rendered request's first choice, whole or streamed.

    A whole answer that offers tools runs the parser (:func:`parses`); a stream does not.

    Args:
        request: The render route's ``GenerateRequest`` for ``body``.
        body: The client's body: its ``kv_transfer_params`` reach the engine, as vLLM's
            Responses and Anthropic requests carry them since vLLM PRs #37424 and #37535 (the
            simulated render routes leave them out).
        settings: The worker's settings.
        call: Where it runs.

    Returns:
        The turn; a stream's counts come from its usage chunk.
    """
    kv = body.get("kv_transfer_params") if isinstance(body, dict) else None
    if isinstance(kv, dict):
        request = {**request, "kv_transfer_params": kv}
    if request.get("stream") is True:
        request = {**request, "stream_options": {"include_usage": True}}
    whole, chunks = _generated(request, settings, call, parse=request.get("stream") is not True)
    message: dict[str, Any] = {}
    if whole is not None:
        [choice] = whole["choices"][:1]
        message = choice.get("message") or {"content": choice["text"]}
        usage, finish, deltas = whole["usage"], choice["finish_reason"], [message["content"]]
    else:
        usage = chunks[-1]["usage"]
        choices = [choice for chunk in chunks for choice in chunk["choices"]]
        finish = choices[-1]["finish_reason"] if choices else None
        deltas = [choice["text"] for choice in choices]
    details = usage.get("prompt_tokens_details") or {}
    return TextTurn(
        deltas=tuple(delta for delta in deltas if delta),
        finish_reason=finish,
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        cached_tokens=details.get("cached_tokens"),
        kv_transfer_params=None if whole is None else whole["kv_transfer_params"],
        parsed="role" in message,
        reasoning=message.get("reasoning"),
        tool_calls=tuple(message.get("tool_calls") or ()),
    )


def created_time(settings: WorkerSettings) -> int:
    """An answer's ``created`` time: the settings' fixed one, else the clock."""
    return settings.created if settings.created is not None else int(time.time())


def _head(request_id: str, kind: str, model: object, settings: WorkerSettings) -> dict[str, Any]:
    return {"id": request_id, "object": kind, "created": created_time(settings), "model": model}


def chat(
    body: object, settings: WorkerSettings, call: _generate.Call
) -> dict[str, Any] | list[dict[str, Any]]:
    """``POST /v1/chat/completions``: a ``chat.completion``, or the chunks of its stream.

    Args:
        body: The client's chat body.
        settings: The worker's settings.
        call: Where it runs (the ``x-request-id`` header, if sent, is the id's base).

    Returns:
        The answer body, or the stream's chunk bodies (``[DONE]`` left to the caller).
    """
    request = _render.render_chat(body, call.header_id, settings)
    whole, chunks = _generated(request, settings, call)
    head = _head(request["request_id"], "chat.completion", request["model"], settings)
    wanted = body.get("top_logprobs") if isinstance(body, dict) else None
    top = wanted if isinstance(wanted, int) else 0  # the chat request model's default
    if whole is not None:
        return {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    # The parser's message (derender), else the text (vLLM's ChatMessage).
                    "message": choice.get("message")
                    or {
                        "role": "assistant",
                        "content": choice["text"],
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": _chat_logprobs(choice["logprobs"], top),
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": choice["stop_reason"],
                    "token_ids": None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
                for choice in whole["choices"]
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _cache_counted(whole["usage"]),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": whole["kv_transfer_params"],
            "ec_transfer_params": whole["ec_transfer_params"],
            "metrics": None,
        }
    head["object"] = "chat.completion.chunk"
    return _chat_chunks(head, chunks, body if isinstance(body, dict) else {}, top)


def _chat_chunks(
    head: dict[str, Any], chunks: list[dict[str, Any]], body: Mapping[str, Any], top: int
) -> list[dict[str, Any]]:
    """The generate chunks cut as vLLM's chat route (with a tool parser) streams them.

    Every choice opens with ``{"role": "assistant", "content": ""}`` at the first engine
    output; then one chunk per generate choice, an empty text giving ``{}`` and no chunk at all
    unless it finishes or carries logprobs; ``stop_reason`` on the finishing chunk only;
    ``weight_versions`` (null) on the finishing chunk only, as vLLM 0.33 writes it; continuous
    usage counted per choice; the usage chunk as the generate stream's last.
    """
    n = body.get("n")
    token_ids = body.get("return_token_ids") is True
    running = [chunk for chunk in chunks if chunk["choices"]]
    continuous = bool(running) and running[0].get("usage") is not None
    out: list[dict[str, Any]] = []
    if chunks:
        prompt = running[0]["usage"]["prompt_tokens"] if continuous else 0
        for index in range(n if isinstance(n, int) and n > 1 else 1):
            opening: dict[str, Any] = {
                **head,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if continuous:
                opening["usage"] = _chat_usage(prompt, 0)
            prompt_ids = chunks[0].get("prompt_token_ids") if token_ids else None
            out.append({**opening, "prompt_token_ids": prompt_ids, "prompt_text": None})
    for chunk in chunks:
        if not chunk["choices"]:
            out.append({**head, "choices": [], "usage": _cache_counted(chunk["usage"])})
            continue
        for choice in chunk["choices"]:
            built = _chunk_choice(choice, top, token_ids=token_ids)
            if built is None:
                continue
            answer: dict[str, Any] = {**head, "choices": [built]}
            if continuous:
                usage = chunk["usage"]
                answer["usage"] = _chat_usage(usage["prompt_tokens"], usage["completion_tokens"])
            out.append(answer)
    return out


def _chunk_choice(choice: Mapping[str, Any], top: int, *, token_ids: bool) -> dict[str, Any] | None:
    """A generate chunk's choice as a chat chunk's (``None``: vLLM sends no chunk for it)."""
    logprobs = _chat_logprobs(choice["logprobs"], top)
    finished = choice["finish_reason"] is not None
    delta = {"content": choice["text"]} if choice["text"] else {}
    delta.update(choice.get("parsed") or {})  # a parsing server's reasoning and tool calls
    if not delta and not finished and logprobs is None and not token_ids:
        return None
    built: dict[str, Any] = {
        "index": choice["index"],
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": choice["finish_reason"],
    }
    if finished:
        built["stop_reason"] = choice["stop_reason"]
    built["token_ids"] = choice["token_ids"] if token_ids else None
    if finished:
        built["weight_versions"] = None  # vLLM 0.33's finishing chunk sets it
    return built


def _chat_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "completion_tokens_details": None,
    }


def _chat_logprobs(logprobs: Any, top: int) -> Any:  # noqa: ANN401 - JSON
    """The engine's logprobs as chat serves them: each top list cut to the request's count.

    vLLM's ``_get_top_logprobs`` keeps ``top_logprobs`` alternatives (0 when unset, every one
    for -1); the engine's list also holds the sampled token, which ``logprobs: true`` alone
    does not show.
    """
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return logprobs
    return {
        **logprobs,
        "content": [
            {**entry, "top_logprobs": entry["top_logprobs"][: None if top == -1 else top]}
            for entry in logprobs["content"]
        ],
    }


def _cache_counted(usage: Mapping[str, Any]) -> dict[str, Any]:
    """The usage as vLLM's chat serving writes it: ``created_cache_tokens`` an integer.

    The count of prompt tokens the prefill wrote to the prefix cache, which the generate route
    leaves null: the simulated engine writes none, 0.
    """
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return dict(usage)
    return {**usage, "prompt_tokens_details": {**details, "created_cache_tokens": 0}}


def _stream_chunk(
    head: Mapping[str, Any], choices: list[dict[str, Any]], chunk: Mapping[str, Any]
) -> dict[str, Any]:
    answer = {**head, "choices": choices}
    if chunk.get("usage") is not None:
        answer["usage"] = chunk["usage"]
    return answer


def completions(
    body: object, settings: WorkerSettings, call: _generate.Call
) -> dict[str, Any] | list[dict[str, Any]]:
    """``POST /v1/completions``: a ``text_completion``, or the chunks of its stream.

    Every prompt is generated in turn; prompt ``i``'s choices are numbered from ``i * n``.
    Arguments (``body``: the client's completions body) and result as :func:`chat`.
    """
    requests = _render.render_completions(body, call.header_id, settings)
    base = requests[0]["request_id"].rsplit("-", 1)[0]
    head = _head(base, "text_completion", requests[0]["model"], settings)
    choices: list[dict[str, Any]] = []
    usage = {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0}
    kv = details = None
    out: list[dict[str, Any]] = []
    for number, request in enumerate(requests):
        offset = number * request["sampling_params"].get("n", 1)
        whole, chunks = _generated(request, settings, call)
        for chunk in chunks:
            texts = [
                {
                    "index": offset + choice["index"],
                    "text": choice["text"],
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": choice["stop_reason"],
                }
                for choice in chunk["choices"]
            ]
            out.append(_stream_chunk(head, texts, chunk))
        if whole is None:
            continue
        kv = kv or whole["kv_transfer_params"]
        # vLLM reports the last prompt's cached tokens for them all.
        details = whole["usage"]["prompt_tokens_details"]
        for key in usage:
            usage[key] += whole["usage"][key]
        choices.extend(
            {
                "index": offset + choice["index"],
                "text": choice["text"],
                "logprobs": None,
                "finish_reason": choice["finish_reason"],
                "stop_reason": choice["stop_reason"],
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
            for choice in whole["choices"]
        )
    if out:
        return out
    return {
        **head,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**usage, "prompt_tokens_details": details},
        "kv_transfer_params": kv,
    }
