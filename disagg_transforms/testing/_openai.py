"""``POST /v1/chat/completions`` and ``/v1/completions``: vLLM's coupled serving, in text mode.

A leg sent in OpenAI format (``use_openai_format: true``), and a completions client on any
pipeline, speak these routes. The request is rendered as ``/render`` would, generated as a
text-mode generate call would, and answered in the coupled envelope (the shapes of
``chat-completion-coupled.json`` and ``chat-completion-chunk-coupled.json``). No reasoning or
tool parser runs here; chat's logprobs are cut to the request's ``top_logprobs`` as vLLM's chat
serving cuts them, and completions answers carry no logprobs. :func:`text_turn` is the
same text-mode generation for the coupled Responses and Messages routes.
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


def _generated(
    request: dict[str, Any], settings: WorkerSettings, call: _generate.Call
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A rendered request run in text mode: the whole answer, or the stream's chunks."""
    request = {**request, "output_mode": "text"}
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
    if answer.events is None:
        return answer.body, []
    chunks = [orjson.loads(event[len(b"data: ") :]) for event in answer.events[:-1]]
    return None, chunks


@dataclasses.dataclass(frozen=True)
class TextTurn:
    """One choice generated in text mode, as the Responses and Messages routes read it."""

    deltas: tuple[str, ...]
    """The text's pieces as a stream sends them (empty ones left out); the whole text alone
    when the request does not stream."""
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens``, ``None`` when the usage has no details."""
    kv_transfer_params: Any
    """A prefill's NIXL params (a whole answer only: stream chunks carry none)."""

    @property
    def text(self) -> str:
        """The generated text."""
        return "".join(self.deltas)


def text_turn(
    request: dict[str, Any], body: object, settings: WorkerSettings, call: _generate.Call
) -> TextTurn:
    """Generate a rendered request's first choice in text mode, whole or streamed.

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
    whole, chunks = _generated(request, settings, call)
    if whole is not None:
        [choice] = whole["choices"][:1]
        usage, finish, deltas = whole["usage"], choice["finish_reason"], [choice["text"]]
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
                    "message": {
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
    if not choice["text"] and not finished and logprobs is None and not token_ids:
        return None
    built: dict[str, Any] = {
        "index": choice["index"],
        "delta": {"content": choice["text"]} if choice["text"] else {},
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
