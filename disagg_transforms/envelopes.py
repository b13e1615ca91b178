"""Typed views of the wire envelopes: vLLM 0.33's generate route and OpenAI's chat completion.

The fields follow vLLM 0.33's own protocol classes. Every optional field defaults to ``UNSET``,
so a key that was absent stays absent and an explicit ``null`` stays ``None``; encoding writes
back exactly what was read. Unknown keys are tolerated on decode (never
``forbid_unknown_fields`` on a wire envelope: vLLM adds fields often), but a view only keeps
what it declares. Transforms therefore read through these views and patch the original body,
so a field the views do not model still reaches its destination.

Decode with :func:`msgspec.json.decode` (bytes) or :func:`msgspec.convert` (dicts)::

    msgspec.json.decode(body, type=GenerateRequest)
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

__all__ = (
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatDelta",
    "ChatLogprob",
    "ChatLogprobs",
    "ChatMessage",
    "ChatTopLogprob",
    "GenerateDerenderChoice",
    "GenerateDerenderResponse",
    "GenerateRequest",
    "GenerateResponse",
    "GenerateStreamChoice",
    "GenerateStreamChunk",
    "GenerateTextChoice",
    "GenerateTextResponse",
    "GenerateTokensChoice",
    "GenerateTokensResponse",
    "MultiModalFeatures",
    "ParseContext",
    "Placeholder",
    "SamplingParams",
    "StreamOptions",
    "TokenLogprob",
    "TokenLogprobs",
    "TokenTopLogprob",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFunction",
    "Usage",
    "WeightVersion",
)

JSON: TypeAlias = Any
"""An opaque JSON value the library carries without looking inside."""


class WireStruct(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every wire view: unknown keys ignored, ``UNSET`` fields omitted on encode.

    msgspec does not inherit ``kw_only``, so every subclass repeats it.
    """


# --------------------------------------------------------------------------------------------
# Generate request (POST /inference/v1/generate)


class SamplingParams(WireStruct, kw_only=True):
    """``sampling_params`` of a generate request (vLLM's ``SamplingParams``)."""

    n: int | UnsetType = UNSET
    presence_penalty: float | UnsetType = UNSET
    frequency_penalty: float | UnsetType = UNSET
    repetition_penalty: float | UnsetType = UNSET
    temperature: float | UnsetType = UNSET
    watermarking: bool | UnsetType | None = UNSET
    top_p: float | UnsetType = UNSET
    top_k: int | UnsetType = UNSET
    min_p: float | UnsetType = UNSET
    seed: int | UnsetType | None = UNSET
    stop: str | list[str] | UnsetType | None = UNSET
    stop_token_ids: list[int] | UnsetType | None = UNSET
    ignore_eos: bool | UnsetType = UNSET
    max_tokens: int | UnsetType | None = UNSET
    """Absent: the server picks (rest of the context); ``null``: rest of the context."""
    min_tokens: int | UnsetType = UNSET
    logprobs: int | UnsetType | None = UNSET
    prompt_logprobs: int | UnsetType | None = UNSET
    prompt_logprob_token_ids: list[list[int]] | UnsetType | None = UNSET
    prompt_logprob_start: int | UnsetType | None = UNSET
    logprob_token_ids: list[int] | UnsetType | None = UNSET
    flat_logprobs: bool | UnsetType = UNSET
    detokenize: bool | UnsetType = UNSET
    skip_special_tokens: bool | UnsetType = UNSET
    spaces_between_special_tokens: bool | UnsetType = UNSET
    include_stop_str_in_output: bool | UnsetType = UNSET
    output_kind: int | UnsetType = UNSET
    stream_interval: int | UnsetType | None = UNSET
    skip_clone: bool | UnsetType = UNSET
    output_text_buffer_length: int | UnsetType = UNSET
    structured_outputs: dict[str, JSON] | UnsetType | None = UNSET
    logit_bias: dict[str, float] | UnsetType | None = UNSET
    allowed_token_ids: list[int] | UnsetType | None = UNSET
    extra_args: dict[str, JSON] | UnsetType | None = UNSET
    """Free-form; the engine reads ``kv_transfer_params`` / ``ec_transfer_params`` here."""
    bad_words: list[str] | UnsetType | None = UNSET
    skip_reading_prefix_cache: bool | UnsetType | None = UNSET
    thinking_token_budget: int | UnsetType | None = UNSET
    repetition_detection: dict[str, JSON] | UnsetType | None = UNSET
    routed_experts_prompt_start: int | UnsetType = UNSET
    trace_decode_token_ids: list[int] | UnsetType | None = UNSET


class Placeholder(WireStruct, kw_only=True):
    """Where one multimodal item sits in the prompt's token IDs."""

    offset: int
    length: int


class MultiModalFeatures(WireStruct, kw_only=True):
    """``features``: per modality, parallel lists of hashes, placeholders and kwargs data."""

    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[Placeholder]]
    kwargs_data: dict[str, list[str | None]] | UnsetType | None = UNSET
    mm_metadata: dict[str, list[str | None]] | UnsetType | None = UNSET


class ParseContext(WireStruct, kw_only=True):
    """``parse_context``: what a derender worker's tool and reasoning parsers need."""

    tools: list[dict[str, JSON]] | UnsetType | None = UNSET
    tool_choice: str | dict[str, JSON] | UnsetType | None = UNSET
    parallel_tool_calls: bool | UnsetType | None = UNSET
    include_reasoning: bool | UnsetType = UNSET
    chat_template_kwargs: dict[str, JSON] | UnsetType = UNSET
    history_tool_call_cnt: int | UnsetType = UNSET


class StreamOptions(WireStruct, kw_only=True):
    """``stream_options`` of a generate or chat request."""

    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET


class GenerateRequest(WireStruct, kw_only=True):
    """A generate request (vLLM's ``GenerateRequest``)."""

    request_id: str | UnsetType = UNSET
    token_ids: list[int]
    token_offsets: list[list[int]] | UnsetType | None = UNSET
    features: MultiModalFeatures | UnsetType | None = UNSET
    content_parts: list[dict[str, JSON]] | UnsetType | None = UNSET
    sampling_params: SamplingParams
    model: str | UnsetType | None = UNSET
    reasoning_ended: bool | UnsetType | None = UNSET
    reasoning_parser_kwargs: dict[str, JSON] | UnsetType | None = UNSET
    return_token_ids: bool | UnsetType | None = UNSET
    output_mode: Literal["tokens", "text", "derender"] | UnsetType = UNSET
    parse_context: ParseContext | UnsetType | None = UNSET
    stream: bool | UnsetType | None = UNSET
    stream_options: StreamOptions | UnsetType | None = UNSET
    cache_salt: str | UnsetType | None = UNSET
    priority: int | UnsetType = UNSET
    kv_transfer_params: dict[str, JSON] | UnsetType | None = UNSET
    ec_transfer_params: dict[str, JSON] | UnsetType | None = UNSET


# --------------------------------------------------------------------------------------------
# Shared response pieces


class Usage(WireStruct, kw_only=True):
    """Token counts (vLLM's ``UsageInfo``)."""

    prompt_tokens: int | UnsetType = UNSET
    total_tokens: int | UnsetType = UNSET
    completion_tokens: int | UnsetType | None = UNSET
    prompt_tokens_details: dict[str, JSON] | UnsetType | None = UNSET
    completion_tokens_details: dict[str, JSON] | UnsetType | None = UNSET


class ToolCallFunction(WireStruct, kw_only=True):
    """The function a tool call names, with its arguments as JSON text."""

    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCall(WireStruct, kw_only=True):
    """A tool call of an assistant message."""

    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: ToolCallFunction | UnsetType = UNSET


class ToolCallDelta(WireStruct, kw_only=True):
    """A tool call as it appears in a streamed delta (``index`` required)."""

    index: int
    id: str | UnsetType | None = UNSET
    type: str | UnsetType | None = UNSET
    function: ToolCallFunction | UnsetType | None = UNSET


class ChatMessage(WireStruct, kw_only=True):
    """An assistant message (vLLM's ``ChatMessage``; ``reasoning``, not ``reasoning_content``)."""

    role: str
    content: str | UnsetType | None = UNSET
    refusal: str | UnsetType | None = UNSET
    annotations: JSON | UnsetType = UNSET
    audio: JSON | UnsetType = UNSET
    function_call: dict[str, JSON] | UnsetType | None = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET
    reasoning: str | UnsetType | None = UNSET


class ChatDelta(WireStruct, kw_only=True):
    """The ``delta`` of a streamed chat choice."""

    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    reasoning: str | UnsetType | None = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType | None = UNSET
    refusal: str | UnsetType | None = UNSET
    function_call: dict[str, JSON] | UnsetType | None = UNSET


class ChatTopLogprob(WireStruct, kw_only=True):
    """One alternative token with its logprob (text and chat logprobs)."""

    token: str
    logprob: float | UnsetType = UNSET
    bytes: list[int] | UnsetType | None = UNSET


class ChatLogprob(ChatTopLogprob, kw_only=True):
    """One output token's logprob, with its alternatives."""

    top_logprobs: list[ChatTopLogprob] | UnsetType = UNSET


class ChatLogprobs(WireStruct, kw_only=True):
    """``logprobs`` of a text, derender or chat choice."""

    content: list[ChatLogprob] | UnsetType | None = UNSET


class TokenTopLogprob(WireStruct, kw_only=True):
    """One alternative token ID with its logprob (tokens mode)."""

    token_id: int
    logprob: float
    rank: int | UnsetType | None = UNSET


class TokenLogprob(TokenTopLogprob, kw_only=True):
    """One output token ID's logprob, with its alternatives (tokens mode)."""

    top_logprobs: list[TokenTopLogprob] | UnsetType = UNSET


class TokenLogprobs(WireStruct, kw_only=True):
    """``logprobs`` of a tokens-mode choice."""

    content: list[TokenLogprob] | UnsetType | None = UNSET


class WeightVersion(WireStruct, kw_only=True):
    """Which weights produced a half-open range of output tokens."""

    version: str
    start: int
    end: int


# --------------------------------------------------------------------------------------------
# Generate responses, one class per output mode


class _GenerateChoiceBase(WireStruct, kw_only=True):
    index: int
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType | None = UNSET
    routed_experts: str | UnsetType | None = UNSET
    sampling_mask: list[list[int]] | UnsetType | None = UNSET
    weight_versions: list[WeightVersion] | UnsetType | None = UNSET


class GenerateTokensChoice(_GenerateChoiceBase, kw_only=True):
    """A choice of a tokens-mode response."""

    logprobs: TokenLogprobs | UnsetType | None = UNSET


class GenerateTextChoice(_GenerateChoiceBase, kw_only=True):
    """A choice of a text-mode response: ``text`` is the detokenized output."""

    text: str
    logprobs: ChatLogprobs | UnsetType | None = UNSET


class GenerateDerenderChoice(_GenerateChoiceBase, kw_only=True):
    """A choice of a derender-mode response: ``message`` is the parsed assistant message."""

    message: ChatMessage
    logprobs: ChatLogprobs | UnsetType | None = UNSET


class _GenerateResponseBase(WireStruct, kw_only=True):
    request_id: str | UnsetType = UNSET
    model: str | UnsetType | None = UNSET
    created: int | UnsetType | None = UNSET
    usage: Usage | UnsetType | None = UNSET
    prompt_logprobs: list[dict[str, JSON] | None] | UnsetType | None = UNSET
    prompt_token_id_logprobs: str | UnsetType | None = UNSET
    prompt_token_ids: list[int] | UnsetType | None = UNSET
    mm_placeholders: dict[str, list[Placeholder]] | UnsetType | None = UNSET
    metrics: dict[str, JSON] | UnsetType | None = UNSET
    kv_transfer_params: dict[str, JSON] | UnsetType | None = UNSET
    ec_transfer_params: dict[str, JSON] | UnsetType | None = UNSET


class GenerateTokensResponse(_GenerateResponseBase, kw_only=True):
    """A generate response in ``tokens`` mode (also what a worker without the field sends)."""

    output_mode: Literal["tokens"] | UnsetType = UNSET
    choices: list[GenerateTokensChoice]


class GenerateTextResponse(_GenerateResponseBase, kw_only=True):
    """A generate response in ``text`` mode."""

    output_mode: Literal["text"]
    choices: list[GenerateTextChoice]


class GenerateDerenderResponse(_GenerateResponseBase, kw_only=True):
    """A generate response in ``derender`` mode."""

    output_mode: Literal["derender"]
    choices: list[GenerateDerenderChoice]


GenerateResponse: TypeAlias = (
    GenerateTokensResponse | GenerateTextResponse | GenerateDerenderResponse
)
"""A non-streaming generate response; pick the class by its ``output_mode`` (absent: tokens)."""


class GenerateStreamChoice(_GenerateChoiceBase, kw_only=True):
    """A choice of a generate stream chunk: ``token_ids`` and ``text`` are deltas."""

    text: str | UnsetType = UNSET
    logprobs: JSON | UnsetType = UNSET


class GenerateStreamChunk(WireStruct, kw_only=True):
    """One ``data:`` event of a streamed generate response (tokens or text mode).

    Chunks carry no ``model``, ``created`` or ``kv_transfer_params``; the last chunk before
    ``[DONE]`` is a usage-only chunk with ``choices: []`` when usage was asked for.
    """

    request_id: str | UnsetType = UNSET
    usage: Usage | UnsetType | None = UNSET
    prompt_token_ids: list[int] | UnsetType | None = UNSET
    mm_placeholders: dict[str, list[Placeholder]] | UnsetType | None = UNSET
    metrics: dict[str, JSON] | UnsetType | None = UNSET
    output_mode: Literal["tokens", "text"] | UnsetType = UNSET
    choices: list[GenerateStreamChoice]


# --------------------------------------------------------------------------------------------
# OpenAI chat completion envelopes


class ChatCompletionChoice(WireStruct, kw_only=True):
    """A choice of a ``chat.completion``."""

    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType | None = UNSET
    routed_experts: str | UnsetType | None = UNSET
    weight_versions: list[WeightVersion] | UnsetType | None = UNSET


class ChatCompletion(WireStruct, kw_only=True):
    """An OpenAI ``chat.completion`` (as vLLM's coupled chat route writes it)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    service_tier: str | UnsetType | None = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
    usage: Usage | UnsetType | None = UNSET
    prompt_logprobs: list[dict[str, JSON] | None] | UnsetType | None = UNSET
    prompt_token_ids: list[int] | UnsetType | None = UNSET
    prompt_text: str | UnsetType | None = UNSET
    kv_transfer_params: dict[str, JSON] | UnsetType | None = UNSET
    ec_transfer_params: dict[str, JSON] | UnsetType | None = UNSET
    metrics: dict[str, JSON] | UnsetType | None = UNSET


class ChatCompletionChunkChoice(WireStruct, kw_only=True):
    """A choice of a ``chat.completion.chunk``."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType | None = UNSET


class ChatCompletionChunk(WireStruct, kw_only=True):
    """An OpenAI ``chat.completion.chunk`` (one streamed event)."""

    id: str
    object: Literal["chat.completion.chunk"] | UnsetType = UNSET
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: Usage | UnsetType | None = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
