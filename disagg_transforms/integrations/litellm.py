"""LiteLLM integration: a custom provider over vLLM's generate route, and request callbacks.

Install with ``pip install 'disagg_transforms[litellm]'``; the core never imports this module.

- :class:`VllmGenerateLLM` is a LiteLLM ``CustomLLM`` that serves chat completions from a vLLM
  worker's ``/inference/v1/generate``: it asks the worker's ``/v1/chat/completions/render``
  for the prompt, builds one decode leg with :func:`~disagg_transforms.build_decode_request`
  (``output_mode`` from its :class:`~disagg_transforms.DecodeParams`), checks the
  ``output_mode`` echo, and answers with LiteLLM's own types (text, ``tool_calls``, reasoning as
  ``reasoning_content``), streaming included.
- :class:`SamplingCapsCallback` and :class:`StripTransferParamsCallback` are LiteLLM callbacks
  that relocate the client's output cap and remove client-supplied transfer params from a
  request dict, without mutating it.

**Compose, don't subclass.** LiteLLM calls some hooks only when they are defined in the
registered object's own class body (a subclass that adds nothing silently turns them off), so
these classes are concrete and final: register an instance, or hold one in your own class and
call it. The callbacks refuse to be subclassed. ``docs/litellm.md`` shows the registration.

Unlike the core, this module does I/O: HTTP to the worker, through ``httpx``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Final, NoReturn, final

import httpx
import orjson
from litellm.integrations.custom_logger import CustomLogger
from litellm.llms.custom_llm import CustomLLM, CustomLLMError
from litellm.types.utils import GenericStreamingChunk, ModelResponse
from typing_extensions import override

from disagg_transforms._config import DecodeParams, OutputMode
from disagg_transforms._request.caps import apply_sampling_caps
from disagg_transforms._request.legs import DecodeLeg, build_decode_request, strip_transfer_params
from disagg_transforms._response.chat_stream import ChatStreamConverter, single_frame_chat_chunks
from disagg_transforms._response.chat_wrap import wrap_chat_completion
from disagg_transforms._response.options import EnvelopeOptions
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.sse import SseParser
from disagg_transforms.errors import ConfigError, DisaggTransformError

__all__ = (
    "RENDER_PATH",
    "SamplingCapsCallback",
    "StripTransferParamsCallback",
    "VllmGenerateLLM",
    "derender_provider",
    "sampling_caps_callback",
    "strip_transfer_params_callback",
    "text_provider",
)

RENDER_PATH: Final = "/v1/chat/completions/render"
"""The worker route that renders a chat body into a ``GenerateRequest``."""

_DEFAULT_TIMEOUT: Final = 600.0
_MAX_ERROR_TEXT: Final = 500
_LITELLM_ONLY: Final = ("extra_body",)  # merged into the body, as the openai SDK does

# LiteLLM call types → the client route whose cap keys the request dict carries.
_CALL_ROUTES: Final[Mapping[str, Route]] = {
    "completion": Route.CHAT_COMPLETIONS,
    "acompletion": Route.CHAT_COMPLETIONS,
    "text_completion": Route.COMPLETIONS,
    "atext_completion": Route.COMPLETIONS,
    "responses": Route.RESPONSES,
    "aresponses": Route.RESPONSES,
    "anthropic_messages": Route.MESSAGES,
}


def _llm_error(status: int, message: str) -> CustomLLMError:
    # LiteLLM maps CustomLLMError's status_code onto its own exception classes.
    return CustomLLMError(status_code=status, message=message)  # type: ignore[no-untyped-call]  # LiteLLM leaves it unannotated


def _litellm_error(error: DisaggTransformError) -> CustomLLMError:
    return _llm_error(error.status_hint, str(error))


def _json_default(value: object) -> object:
    # LiteLLM users pass earlier answers back (pydantic Message objects) in `messages`.
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    msg = f"not JSON: {describe(value)}"
    raise TypeError(msg)


def _chat_body(
    model: str, messages: list[Any], optional_params: Mapping[str, Any], *, stream: bool
) -> dict[str, Any]:
    """The chat request LiteLLM was asked for, as the plain JSON a client would have sent."""
    body: dict[str, Any] = {w.MODEL: model, w.MESSAGES: messages}
    body.update((k, v) for k, v in optional_params.items() if k not in _LITELLM_ONLY)
    extra = optional_params.get("extra_body")
    if isinstance(extra, Mapping):
        body.update(extra)
    if stream:
        body[w.STREAM] = True
    else:
        body.pop(w.STREAM, None)
    try:
        parsed: dict[str, Any] = orjson.loads(orjson.dumps(body, default=_json_default))
    except TypeError as error:
        raise _llm_error(400, f"the chat request: {error}") from None
    return parsed


def _base_url(api_base: object) -> str:
    if not isinstance(api_base, str) or not api_base.strip():
        msg = f"api_base: the vLLM worker's URL is required, got {describe(api_base)}"
        raise _llm_error(400, msg)
    return api_base.strip().rstrip("/")


def _headers(headers: Mapping[str, str] | None, api_key: object) -> dict[str, str]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if isinstance(api_key, str) and api_key:
        sent.setdefault("Authorization", f"Bearer {api_key}")
    return sent


def _error_text(response: httpx.Response) -> str:
    try:
        payload = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return " ".join(response.text.split())[:_MAX_ERROR_TEXT]
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message is not None else describe(payload)


def _raise_http(response: httpx.Response, what: str) -> NoReturn:
    status = response.status_code
    msg = f"{what}: the worker answered HTTP {status}: {_error_text(response)}"
    raise _llm_error(status, msg)


def _json_object(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= httpx.codes.BAD_REQUEST:
        _raise_http(response, what)
    try:
        payload = orjson.loads(response.content)
    except orjson.JSONDecodeError as error:
        msg = f"{what}: the worker's answer is not JSON: {error}"
        raise _llm_error(502, msg) from None
    if not isinstance(payload, dict):
        msg = f"{what}: the worker's answer is not a JSON object: {describe(payload)}"
        raise _llm_error(502, msg)
    return payload


def _generic_chunks(chunk: Mapping[str, Any]) -> list[GenericStreamingChunk]:
    """One ``chat.completion.chunk`` as LiteLLM's streaming chunks (one per choice, tool call)."""
    usage = chunk.get(w.USAGE)
    choices: list[Mapping[str, Any]] = chunk.get(w.CHOICES) or []
    if not choices:  # the usage-only chunk
        return [GenericStreamingChunk(text="", is_finished=False, finish_reason="", usage=usage)]
    out: list[GenericStreamingChunk] = []
    for choice in choices:
        delta: Mapping[str, Any] = choice.get(w.DELTA) or {}
        finish = choice.get(w.FINISH_REASON)
        calls: list[Any] = delta.get(w.TOOL_CALLS) or [None]
        for position, call in enumerate(calls):
            last = position == len(calls) - 1
            item = GenericStreamingChunk(
                text=(delta.get(w.CONTENT) or "") if position == 0 else "",
                tool_use=call,
                is_finished=last and finish is not None,
                finish_reason=(finish or "") if last else "",
                usage=usage if last else None,
                index=choice.get(w.INDEX, 0),
            )
            reasoning = delta.get(w.REASONING_CONTENT)
            if position == 0 and reasoning:
                item["provider_specific_fields"] = {w.REASONING_CONTENT: reasoning}
            out.append(item)
    return out


@final
class _TextStream:
    """A streamed text-mode leg: generate SSE bytes in, LiteLLM streaming chunks out."""

    def __init__(self, converter: ChatStreamConverter) -> None:
        self._converter = converter
        self._parser = SseParser()

    def feed(self, data: bytes) -> list[GenericStreamingChunk]:
        try:
            return self._chunks(self._converter.feed(data))
        except DisaggTransformError as error:
            raise _litellm_error(error) from error

    def close(self) -> list[GenericStreamingChunk]:
        try:
            return self._chunks(self._converter.close()) + self._chunks(b"", closing=True)
        except DisaggTransformError as error:
            raise _litellm_error(error) from error

    def _chunks(self, sse: bytes, *, closing: bool = False) -> list[GenericStreamingChunk]:
        payloads = self._parser.close() if closing else self._parser.feed(sse)
        out: list[GenericStreamingChunk] = []
        for payload in payloads:
            if payload == w.SSE_DONE:
                continue
            chunk = orjson.loads(payload)
            error = chunk.get(w.ERROR)
            if error is not None:  # the worker's in-stream error, passed on by the converter
                detail = error.get("message") if isinstance(error, dict) else error
                code = error.get("code") if isinstance(error, dict) else None
                status = code if isinstance(code, int) and code >= httpx.codes.BAD_REQUEST else 502
                msg = f"generate stream: the worker reported an error: {detail}"
                raise _llm_error(status, msg)
            out.extend(_generic_chunks(chunk))
        return out


@final
class VllmGenerateLLM(CustomLLM):
    """A LiteLLM provider serving chat completions from a vLLM worker's generate route.

    Each call POSTs the chat body to ``{api_base}/v1/chat/completions/render``, builds the
    decode leg from the answer (:func:`~disagg_transforms.build_decode_request` with
    ``rendered=``; the client's cap ends up in ``sampling_params.max_tokens``), POSTs it to
    ``{api_base}/inference/v1/generate`` and rebuilds the answer as a ``ModelResponse``: text
    mode streams through :class:`~disagg_transforms.ChatStreamConverter`; derender
    mode carries ``tool_calls`` and ``reasoning_content`` and streams as one single frame.

    A worker that ignores ``output_mode`` (vLLM older than 0.32 / 0.33) fails the echo check:
    LiteLLM raises its error for status 502 with the library's message. Any library error
    reaches LiteLLM as a ``CustomLLMError`` carrying its ``status_hint`` and message.

    Register an instance (``litellm.custom_provider_map``); do not subclass it (see the module
    docstring). A new ``httpx`` client is used per call; LiteLLM's ``client`` argument is
    ignored.

    Args:
        params: the decode step's params; ``use_openai_format`` must be false (this provider
            exists to use the generate route). Defaults to text mode.
        timeout: seconds per HTTP request when LiteLLM passes none.

    Raises:
        ConfigError: ``params`` is not a ``DecodeParams`` with ``use_openai_format`` false.
    """

    def __init__(
        self, *, params: DecodeParams | None = None, timeout: float = _DEFAULT_TIMEOUT
    ) -> None:
        super().__init__()
        params = DecodeParams(use_openai_format=False) if params is None else params
        if not isinstance(params, DecodeParams) or params.use_openai_format:
            msg = (
                "VllmGenerateLLM: params must be DecodeParams with use_openai_format false, "
                f"got {params!r}"
            )
            raise ConfigError(msg, param="params")
        self._params = params
        self._timeout = timeout

    @property
    def params(self) -> DecodeParams:
        """The decode step's params (its ``output_mode`` is what the leg asks for)."""
        return self._params

    # -- the steps every call shares (no I/O) ----------------------------------------------

    def _leg(self, chat: Mapping[str, Any], rendered: Mapping[str, Any]) -> DecodeLeg:
        try:
            return build_decode_request(
                chat,
                client_path=Route.CHAT_COMPLETIONS.value,
                params=self._params,
                rendered=rendered,
            )
        except DisaggTransformError as error:
            raise _litellm_error(error) from error

    def _model_response(
        self, response: Mapping[str, Any], chat: Mapping[str, Any], model: str
    ) -> ModelResponse:
        try:
            completion = wrap_chat_completion(
                response,
                requested=self._params.output_mode,
                client_body=chat,
                model=model,
                reasoning_content=True,
            )
        except DisaggTransformError as error:
            raise _litellm_error(error) from error
        return ModelResponse(**completion)

    def _single_frame(
        self, response: Mapping[str, Any], chat: Mapping[str, Any], model: str
    ) -> list[GenericStreamingChunk]:
        try:
            chunks = single_frame_chat_chunks(
                response,
                requested=self._params.output_mode,
                client_body=chat,
                model=model,
                reasoning_content=True,
            )
        except DisaggTransformError as error:
            raise _litellm_error(error) from error
        return [item for chunk in chunks for item in _generic_chunks(chunk)]

    def _text_stream(self, chat: Mapping[str, Any]) -> _TextStream:
        # The chunks' id comes from the generate stream's request_id, as the wrap's does.
        try:
            converter = ChatStreamConverter(
                requested=OutputMode.TEXT,
                client_body=chat,
                options=EnvelopeOptions(model=str(chat.get(w.MODEL, ""))),
                created=0,  # LiteLLM stamps its own id / created on the chunks it yields
            )
        except DisaggTransformError as error:
            raise _litellm_error(error) from error
        return _TextStream(converter)

    def _timeout_for(self, timeout: float | httpx.Timeout | None) -> float | httpx.Timeout:
        return self._timeout if timeout is None else timeout

    # -- LiteLLM's entry points ----------------------------------------------------------------

    @override
    def completion(
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        client: Any = None,
    ) -> ModelResponse:
        """Serve one non-streaming chat completion (synchronous)."""
        base, chat = _base_url(api_base), _chat_body(model, messages, optional_params, stream=False)
        sent = _headers(headers, api_key)
        with httpx.Client(timeout=self._timeout_for(timeout), headers=sent) as http:
            rendered = _json_object(http.post(base + RENDER_PATH, json=chat), "render")
            leg = self._leg(chat, rendered)
            answer = _json_object(http.post(base + leg.path, json=leg.body), "generate")
        return self._model_response(answer, chat, model)

    @override
    async def acompletion(
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        client: Any = None,
    ) -> ModelResponse:
        """Serve one non-streaming chat completion."""
        base, chat = _base_url(api_base), _chat_body(model, messages, optional_params, stream=False)
        sent = _headers(headers, api_key)
        async with httpx.AsyncClient(timeout=self._timeout_for(timeout), headers=sent) as http:
            rendered = _json_object(await http.post(base + RENDER_PATH, json=chat), "render")
            leg = self._leg(chat, rendered)
            answer = _json_object(await http.post(base + leg.path, json=leg.body), "generate")
        return self._model_response(answer, chat, model)

    @override
    def streaming(
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        client: Any = None,
    ) -> Iterator[GenericStreamingChunk]:
        """Serve one streaming chat completion (synchronous)."""
        base, chat = _base_url(api_base), _chat_body(model, messages, optional_params, stream=True)
        sent = _headers(headers, api_key)
        with httpx.Client(timeout=self._timeout_for(timeout), headers=sent) as http:
            rendered = _json_object(http.post(base + RENDER_PATH, json=chat), "render")
            leg = self._leg(chat, rendered)
            if not leg.stream:  # derender: one unstreamed answer, sent on as a single frame
                answer = _json_object(http.post(base + leg.path, json=leg.body), "generate")
                yield from self._single_frame(answer, chat, model)
                return
            stream = self._text_stream(chat)
            with http.stream("POST", base + leg.path, json=leg.body) as response:
                if response.status_code >= httpx.codes.BAD_REQUEST:
                    response.read()
                    _raise_http(response, "generate")
                for data in response.iter_bytes():
                    yield from stream.feed(data)
            yield from stream.close()

    @override
    async def astreaming(  # type: ignore[override]  # LiteLLM types it a coroutine, iterates it
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        client: Any = None,
    ) -> AsyncIterator[GenericStreamingChunk]:
        """Serve one streaming chat completion."""
        base, chat = _base_url(api_base), _chat_body(model, messages, optional_params, stream=True)
        sent = _headers(headers, api_key)
        async with httpx.AsyncClient(timeout=self._timeout_for(timeout), headers=sent) as http:
            rendered = _json_object(await http.post(base + RENDER_PATH, json=chat), "render")
            leg = self._leg(chat, rendered)
            if not leg.stream:  # derender: one unstreamed answer, sent on as a single frame
                answer = _json_object(await http.post(base + leg.path, json=leg.body), "generate")
                for item in self._single_frame(answer, chat, model):
                    yield item
                return
            stream = self._text_stream(chat)
            async with http.stream("POST", base + leg.path, json=leg.body) as response:
                if response.status_code >= httpx.codes.BAD_REQUEST:
                    await response.aread()
                    _raise_http(response, "generate")
                async for data in response.aiter_bytes():
                    for item in stream.feed(data):
                        yield item
            for item in stream.close():
                yield item


def _route_for(call_type: object, fixed: Route | None) -> Route | None:
    if fixed is not None:
        return fixed
    name = getattr(call_type, "value", call_type)
    return _CALL_ROUTES.get(name) if isinstance(name, str) else None


def _no_subclass(cls: type) -> NoReturn:
    msg = (
        f"{cls.__name__} must not be subclassed: LiteLLM calls async_pre_call_hook only when the "
        "registered class defines it itself, so a subclass would silently turn it off. Compose: "
        "hold an instance and call its hooks from your own CustomLogger."
    )
    raise TypeError(msg)


@final
class SamplingCapsCallback(CustomLogger):
    """LiteLLM callback: move the request's output cap under ``sampling_params.max_tokens``.

    :func:`~disagg_transforms.apply_sampling_caps` on the request dict, for requests a
    deployment sends to a vLLM generate route (which reads the cap only there). Both hooks
    return a new dict and leave LiteLLM's untouched; a bad cap raises
    :class:`~disagg_transforms.errors.RequestError` (status hint 400).

    Args:
        route: the route whose cap keys the request carries; ``None`` (the default) derives it
            from LiteLLM's call type (chat for ``completion``, completions for
            ``text_completion``, Responses for ``responses``, Messages for
            ``anthropic_messages``) and leaves other calls alone.
    """

    def __init__(self, route: Route | None = None) -> None:
        super().__init__()
        untyped: object = route  # a proxy YAML may hand over anything
        if untyped is not None and not isinstance(untyped, Route):
            msg = f"SamplingCapsCallback: route must be a Route or None, got {describe(route)}"
            raise ConfigError(msg, param="route")
        self._route = route

    def __init_subclass__(cls, **kwargs: object) -> None:
        _no_subclass(cls)

    def _apply(self, data: Mapping[str, Any], call_type: object) -> dict[str, Any] | None:
        route = _route_for(call_type, self._route)
        return None if route is None else apply_sampling_caps(data, route)

    @override
    async def async_pre_call_hook(
        self,
        user_api_key_dict: Any,
        cache: Any,
        data: dict[str, Any],
        call_type: Any,
    ) -> dict[str, Any] | None:
        """Proxy hook: the request dict with its cap relocated (``None``: not a call it knows)."""
        return self._apply(data, call_type)

    @override
    async def async_pre_call_deployment_hook(
        self,
        kwargs: dict[str, Any],
        call_type: Any,
    ) -> dict[str, Any] | None:
        """SDK and proxy hook (async calls): the call's kwargs with the cap relocated."""
        return self._apply(kwargs, call_type)


@final
class StripTransferParamsCallback(CustomLogger):
    """LiteLLM callback: remove client-supplied ``kv_transfer_params`` / ``ec_transfer_params``.

    A client that sets them (top level, ``sampling_params.extra_args`` or ``vllm_xargs``) could
    point a worker at any host (SPEC §4.6); only the router should set them. Both hooks return
    a new dict and leave LiteLLM's untouched.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        _no_subclass(cls)

    @override
    async def async_pre_call_hook(
        self,
        user_api_key_dict: Any,
        cache: Any,
        data: dict[str, Any],
        call_type: Any,
    ) -> dict[str, Any]:
        """Proxy hook: the request dict without client transfer params."""
        return strip_transfer_params(data)

    @override
    async def async_pre_call_deployment_hook(
        self,
        kwargs: dict[str, Any],
        call_type: Any,
    ) -> dict[str, Any]:
        """SDK and proxy hook (async calls): the call's kwargs without client transfer params."""
        return strip_transfer_params(kwargs)


text_provider: Final = VllmGenerateLLM()
"""A provider in text mode (vLLM >= 0.32), for ``custom_provider_map`` in a proxy YAML."""
derender_provider: Final = VllmGenerateLLM(
    params=DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
)
"""A provider in derender mode (vLLM >= 0.33): tool calls and reasoning parsed by the worker."""
sampling_caps_callback: Final = SamplingCapsCallback()
"""A :class:`SamplingCapsCallback` for ``litellm_settings.callbacks`` in a proxy YAML."""
strip_transfer_params_callback: Final = StripTransferParamsCallback()
"""A :class:`StripTransferParamsCallback` for ``litellm_settings.callbacks`` in a proxy YAML."""
