"""Request and response transforms for disaggregated LLM serving in front of vLLM.

A router that splits a client request into encode / prefill / decode legs calls these functions
to build each leg's body and to turn the worker's answer back into the envelope the client asked
for. No I/O, no global state, no environment, no logging configuration.
"""

from __future__ import annotations

from importlib.metadata import version as _metadata_version

from disagg_transforms.caps import TOP_LEVEL_CAPS, apply_sampling_caps, apply_single_token_cap
from disagg_transforms.config import (
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
)
from disagg_transforms.errors import (
    ConfigError,
    DisaggTransformError,
    RequestError,
    UpstreamContractError,
    openai_error_body,
)
from disagg_transforms.legs import (
    DecodeLeg,
    Leg,
    build_decode_request,
    build_encode_request,
    build_prefill_request,
)
from disagg_transforms.routes import Route, detect_route, resolve_format

__all__ = [
    "ConditionalDecodeParams",
    "ConfigError",
    "DecodeLeg",
    "DecodeParams",
    "DisaggTransformError",
    "EncodeParams",
    "KvTransferPlacement",
    "Leg",
    "MIN_VLLM_VERSION",
    "OutputMode",
    "PrefillParams",
    "RequestError",
    "Route",
    "Step",
    "StepParams",
    "TOP_LEVEL_CAPS",
    "UpstreamContractError",
    "apply_sampling_caps",
    "apply_single_token_cap",
    "build_decode_request",
    "build_encode_request",
    "build_prefill_request",
    "detect_route",
    "openai_error_body",
    "parse_pipeline_params",
    "parse_step_params",
    "resolve_format",
    "validate_output_mode",
]


def __getattr__(name: str) -> str:
    # The version lives in one place, the installed distribution's metadata.
    if name == "__version__":
        return _metadata_version("disagg_transforms")
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
