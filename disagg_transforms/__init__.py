"""Request and response transforms for disaggregated LLM serving in front of vLLM.

A router that splits a client request into encode / prefill / decode legs calls these functions
to build each leg's body and to turn the worker's answer back into the envelope the client asked
for. No I/O, no global state, no environment, no logging configuration.
"""

from __future__ import annotations

from importlib.metadata import version as _metadata_version

from disagg_transforms._config import (
    MIN_VLLM_VERSION,
    ConditionalDecodeParams,
    DecodeParams,
    EncodeParams,
    KvTransferPlacement,
    OutputMode,
    PrefillParams,
    Step,
    StepParams,
    parse_pipeline_params,
    parse_step_params,
    validate_output_mode,
    validate_vllm_version,
)
from disagg_transforms._coordinator import (
    CoordinatorConfig,
    EcConnector,
    KvConnector,
    parse_coordinator_config,
)
from disagg_transforms._request.caps import (
    TOP_LEVEL_CAPS,
    apply_sampling_caps,
    apply_single_token_cap,
)
from disagg_transforms._request.legs import (
    DecodeLeg,
    DecodeLegBytes,
    GenerateDecodeLeg,
    GenerateDecodeLegBytes,
    Leg,
    build_decode_request,
    build_decode_request_bytes,
    build_encode_request,
    build_prefill_request,
    strip_transfer_params,
)
from disagg_transforms._response.chat import (
    ChatStreamConverter,
    single_frame_chat_chunks,
    single_frame_chat_stream,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
)
from disagg_transforms._response.dispatch import (
    StreamConverter,
    single_frame_stream,
    stream_converter,
    wrap_envelope,
)
from disagg_transforms._response.echo import check_output_mode_echo
from disagg_transforms._response.messages import (
    THINKING_SIGNATURE,
    AnthropicStreamConverter,
    single_frame_anthropic_events,
    single_frame_anthropic_stream,
    wrap_anthropic_message,
)
from disagg_transforms._response.options import DEFAULT_MAX_CHOICES, EnvelopeOptions
from disagg_transforms._response.responses import (
    ResponsesStreamConverter,
    single_frame_responses_events,
    single_frame_responses_stream,
    wrap_responses_response,
)
from disagg_transforms._routes import Route, detect_route, resolve_format
from disagg_transforms._wire.limits import DEFAULT_LIMITS, Limits
from disagg_transforms._wire.sse import DEFAULT_MAX_EVENT_BYTES, SseParser
from disagg_transforms.errors import (
    ConfigError,
    DisaggTransformError,
    PluginLoadError,
    RequestError,
    RequestTooLargeError,
    TransformError,
    UpstreamContractError,
    WorkerNotAllowedError,
    anthropic_error_body,
    error_body,
    openai_error_body,
)
from disagg_transforms.exchange import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Driver,
    Engine,
    Event,
    Exchange,
    ExchangeSettings,
    ExchangeStateError,
    NeedData,
    Phase,
    SglangSettings,
    WorkerCall,
    pipeline_phases,
    pipeline_warnings,
    version_errors,
)
from disagg_transforms.hooks import (
    ENTRY_POINT_GROUP,
    LegInputs,
    Pipeline,
    RequestTransform,
    ResponseTransform,
    TransformContext,
    available_transforms,
    load_transforms,
)
from disagg_transforms.transforms import (
    SamplingCaps,
    decode_request,
    sampling_caps,
    strip_client_transfer_params,
    wrap_response,
)

__all__ = [
    "AnthropicStreamConverter",
    "ChatStreamConverter",
    "ClientReply",
    "ClientStream",
    "ConditionalDecodeParams",
    "ConfigError",
    "CoordinatorConfig",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_CHOICES",
    "DEFAULT_MAX_EVENT_BYTES",
    "DecodeLeg",
    "DecodeLegBytes",
    "DecodeParams",
    "DisaggTransformError",
    "Driver",
    "ENTRY_POINT_GROUP",
    "EcConnector",
    "EncodeParams",
    "Engine",
    "EnvelopeOptions",
    "Event",
    "Exchange",
    "ExchangeSettings",
    "ExchangeStateError",
    "GenerateDecodeLeg",
    "GenerateDecodeLegBytes",
    "KvConnector",
    "KvTransferPlacement",
    "Leg",
    "LegInputs",
    "Limits",
    "MIN_VLLM_VERSION",
    "NEED_DATA",
    "NeedData",
    "OutputMode",
    "Phase",
    "Pipeline",
    "PluginLoadError",
    "PrefillParams",
    "RequestError",
    "RequestTooLargeError",
    "RequestTransform",
    "ResponseTransform",
    "ResponsesStreamConverter",
    "Route",
    "SamplingCaps",
    "SglangSettings",
    "SseParser",
    "Step",
    "StepParams",
    "StreamConverter",
    "THINKING_SIGNATURE",
    "TOP_LEVEL_CAPS",
    "TransformContext",
    "TransformError",
    "UpstreamContractError",
    "WorkerCall",
    "WorkerNotAllowedError",
    "anthropic_error_body",
    "apply_sampling_caps",
    "apply_single_token_cap",
    "available_transforms",
    "build_decode_request",
    "build_decode_request_bytes",
    "build_encode_request",
    "build_prefill_request",
    "check_output_mode_echo",
    "decode_request",
    "detect_route",
    "error_body",
    "load_transforms",
    "openai_error_body",
    "parse_coordinator_config",
    "parse_pipeline_params",
    "parse_step_params",
    "pipeline_phases",
    "pipeline_warnings",
    "resolve_format",
    "sampling_caps",
    "single_frame_anthropic_events",
    "single_frame_anthropic_stream",
    "single_frame_chat_chunks",
    "single_frame_chat_stream",
    "single_frame_responses_events",
    "single_frame_responses_stream",
    "single_frame_stream",
    "stream_converter",
    "strip_client_transfer_params",
    "strip_transfer_params",
    "validate_output_mode",
    "validate_vllm_version",
    "version_errors",
    "wrap_anthropic_message",
    "wrap_chat_completion",
    "wrap_chat_completion_bytes",
    "wrap_envelope",
    "wrap_response",
    "wrap_responses_response",
]


def __getattr__(name: str) -> str:
    # The version lives in one place, the installed distribution's metadata.
    if name == "__version__":
        return _metadata_version("disagg_transforms")
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
