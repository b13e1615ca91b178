"""Step configuration: the router's per-step params, checked once at startup.

``parse_step_params`` turns the YAML/JSON mapping of one step into a frozen, typed object and
refuses anything it would otherwise have to guess about: a bool spelled ``"true"`` or ``1``, an
unknown key (a typo must not pass silently), an output mode that would leave a client without
text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import ClassVar, Final, Literal, TypeAlias, TypeVar, overload

import msgspec

from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError

__all__ = (
    "AUTO_MODE",
    "DERENDER_MODE",
    "TEXT_MODE",
    "TOKENS_MODE",
    "TOP_LEVEL_PLACEMENT",
    "ConditionalDecodeParams",
    "DecodeParams",
    "EncodeParams",
    "KvTransferPlacement",
    "MIN_VLLM_VERSION",
    "OutputMode",
    "PrefillParams",
    "Step",
    "StepParams",
    "parse_pipeline_params",
    "parse_step_params",
    "validate_output_mode",
    "validate_vllm_version",
    "vllm_honours",
)


class OutputMode(str, enum.Enum):
    """What a generate worker returns beside the token IDs; the value is the wire string."""

    TOKENS = "tokens"
    """Token IDs only (the worker's default, and all a worker older than the field returns)."""
    TEXT = "text"
    """Detokenized text; needs vLLM >= 0.32.0."""
    DERENDER = "derender"
    """The parsed assistant message (content, reasoning, tool_calls); needs vLLM >= 0.33.0."""
    AUTO = "auto"
    """A decode step's setting, never sent: per request ``derender`` when the client asks for
    tools, else ``text``; on a worker older than ``derender`` (vLLM 0.32) a request with tools
    is decoded on the client's own route instead (``docs/routes-and-config.md``). A leg carries
    the mode chosen."""


class Step(str, enum.Enum):
    """A leg of a disaggregated request; the value is the name used in router config."""

    ENCODE = "encode"
    PREFILL = "prefill"
    DECODE = "decode"
    CONDITIONAL_DECODE = "conditional-decode"


class KvTransferPlacement(str, enum.Enum):
    """Where a generate leg carries ``kv_transfer_params`` / ``ec_transfer_params``."""

    BOTH = "both"
    """Top level and ``sampling_params.extra_args``: works on every vLLM."""
    TOP_LEVEL = "top_level"
    """Top level only: vLLM >= 0.29 copies it into ``extra_args`` itself."""
    EXTRA_ARGS = "extra_args"
    """``sampling_params.extra_args`` only: what vLLM <= 0.28 reads."""


# As plain names for the code every leg runs: on Python 3.10 and 3.11 each read of an enum
# class's attribute goes through EnumType.__getattr__'s hook, a bound method built and called
# (docs/performance.md, "Calls that parse their arguments").
TOKENS_MODE: Final = OutputMode.TOKENS
TEXT_MODE: Final = OutputMode.TEXT
DERENDER_MODE: Final = OutputMode.DERENDER
AUTO_MODE: Final = OutputMode.AUTO
TOP_LEVEL_PLACEMENT: Final = KvTransferPlacement.TOP_LEVEL


class _StepParamsBase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    step: ClassVar[Step]
    trust_client_transfer_params: bool = False
    """Keep transfer params the client put in its body (off: only the router's reach a leg)."""

    def __post_init__(self) -> None:
        # Built directly (not through parse_step_params), a struct is still checked, and a
        # wire string such as "top_level" becomes its enum member.
        for key, reader in _READERS[self.step].items():
            param = f"{self.step.value}.{key}"
            msgspec.structs.force_setattr(self, key, reader(getattr(self, key), param))


class EncodeParams(_StepParamsBase, frozen=True, kw_only=True):
    """Params of the encode step."""

    step: ClassVar[Step] = Step.ENCODE
    use_openai_format: bool = True


class PrefillParams(_StepParamsBase, frozen=True, kw_only=True):
    """Params of the prefill step."""

    step: ClassVar[Step] = Step.PREFILL
    use_openai_format: bool = True
    kv_transfer_placement: KvTransferPlacement = KvTransferPlacement.BOTH


class DecodeParams(_StepParamsBase, frozen=True, kw_only=True):
    """Params of the decode step."""

    step: ClassVar[Step] = Step.DECODE
    use_openai_format: bool = True
    output_mode: OutputMode = OutputMode.TEXT
    wrap_chat_completion: bool = False
    kv_transfer_placement: KvTransferPlacement = KvTransferPlacement.BOTH


class ConditionalDecodeParams(_StepParamsBase, frozen=True, kw_only=True):
    """Params of the conditional-decode step (it always speaks the client's own route)."""

    step: ClassVar[Step] = Step.CONDITIONAL_DECODE


StepParams: TypeAlias = EncodeParams | PrefillParams | DecodeParams | ConditionalDecodeParams

_PARAMS_CLASS: Mapping[Step, type[StepParams]] = {
    Step.ENCODE: EncodeParams,
    Step.PREFILL: PrefillParams,
    Step.DECODE: DecodeParams,
    Step.CONDITIONAL_DECODE: ConditionalDecodeParams,
}

MIN_VLLM_VERSION: Mapping[OutputMode, str] = {
    OutputMode.TEXT: "0.32.0",
    OutputMode.DERENDER: "0.33.0",
    OutputMode.AUTO: "0.32.0",
}
"""The first vLLM release whose generate route honours each ``output_mode`` value (``auto``:
the first that serves it, tools on the client's own route before ``derender``)."""

# A release as vLLM's `GET /version` writes it: "0.32.0", "0.33.1rc1", "0.32.0+cpu", ...
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-a-z][0-9A-Za-z.+\-]*)?")


def _release(version: str) -> tuple[int, int, int]:
    found = _RELEASE.fullmatch(version)
    assert found is not None  # noqa: S101 - validate_vllm_version checked it
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def validate_vllm_version(value: object, param: str = "vllm_version") -> str:
    """Check a vLLM release as its ``GET /version`` writes it (``"0.32.0"``); return it.

    Raises:
        ConfigError: ``value`` is not a string of the form ``MAJOR.MINOR[.PATCH][suffix]``.
    """
    if not isinstance(value, str) or _RELEASE.fullmatch(value) is None:
        msg = f'{param}: expected a vLLM release such as "0.32.0", got {describe(value)}'
        raise ConfigError(msg, param=param)
    return value


def vllm_honours(mode: OutputMode, vllm_version: str | None) -> bool:
    """Whether a generate worker of ``vllm_version`` honours ``mode`` (:data:`MIN_VLLM_VERSION`).

    ``None`` (the version is not known) is taken as a release that honours every mode.

    Raises:
        ConfigError: ``vllm_version`` is not a vLLM release (:func:`validate_vllm_version`).
    """
    if vllm_version is None:
        return True
    release = _release(validate_vllm_version(vllm_version))
    needed = MIN_VLLM_VERSION.get(mode)
    return needed is None or release >= _release(needed)


_EnumT = TypeVar("_EnumT", bound=enum.Enum)


def _member(cls: type[_EnumT], value: object) -> _EnumT | None:
    """The member of ``cls`` whose wire string ``value`` is; ``None`` for any other value."""
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    return None


def _output_mode(value: object, param: str) -> OutputMode:
    mode = _member(OutputMode, value)
    if mode is None:
        msg = f'{param}: expected "text", "derender" or "auto", got {describe(value)}'
        raise ConfigError(msg, param=param)
    if mode is OutputMode.TOKENS:
        text, derender = MIN_VLLM_VERSION[OutputMode.TEXT], MIN_VLLM_VERSION[OutputMode.DERENDER]
        msg = (
            f'{param}: "tokens" is refused: decode answers the client, and a tokens answer '
            f'carries token IDs and no text; use "text" or "auto" (vLLM >= {text}) '
            f'or "derender" (vLLM >= {derender})'
        )
        raise ConfigError(msg, param=param)
    return mode


def validate_output_mode(value: object = None) -> OutputMode:
    """Check a decode step's ``output_mode`` at startup; absent (``None``) means ``text``.

    ``"text"`` (vLLM >= 0.32.0), ``"derender"`` (vLLM >= 0.33.0) and ``"auto"`` (per request:
    ``derender`` when the client asks for tools, else ``text``; vLLM >= 0.32.0, see
    :attr:`OutputMode.AUTO`) are accepted.
    ``"tokens"`` is refused: the decode leg answers the client, and token IDs carry no text. Any
    other string or a non-string raises :class:`ConfigError`.
    """
    if value is None:
        return OutputMode.TEXT
    return _output_mode(value, "output_mode")


def _bool(value: object, param: str) -> bool:
    # `"true"` and `1` are refused: YAML quoting mistakes must not flip a leg's route.
    if not isinstance(value, bool):
        msg = f"{param}: expected true or false, got {describe(value)}"
        raise ConfigError(msg, param=param)
    return value


def _placement(value: object, param: str) -> KvTransferPlacement:
    placement = _member(KvTransferPlacement, value)
    if placement is None:
        accepted = ", ".join(f'"{p.value}"' for p in KvTransferPlacement)
        msg = f"{param}: expected one of {accepted}, got {describe(value)}"
        raise ConfigError(msg, param=param)
    return placement


_Reader: TypeAlias = Callable[[object, str], object]

# Each key's reader follows from its field's type, so a new key is declared once, on its struct.
_READER_OF_TYPE: Mapping[object, _Reader] = {
    bool: _bool,
    OutputMode: _output_mode,
    KvTransferPlacement: _placement,
}


def _readers(cls: type[StepParams]) -> Mapping[str, _Reader]:
    # A step's own keys first, the shared ones last: the order keys are checked (and the first
    # bad one reported) in.
    shared = _StepParamsBase.__struct_fields__
    fields = sorted(msgspec.structs.fields(cls), key=lambda field: field.name in shared)
    return {field.name: _READER_OF_TYPE[field.type] for field in fields}


_READERS: Mapping[Step, Mapping[str, _Reader]] = {
    step: _readers(cls) for step, cls in _PARAMS_CLASS.items()
}


def _step(step: object) -> Step:
    parsed = _member(Step, step)
    if parsed is None:
        accepted = ", ".join(f'"{s.value}"' for s in Step)
        msg = f"step: expected one of {accepted}, got {describe(step)}"
        raise ConfigError(msg, param="step")
    return parsed


# The overloads give a router the step's own class without a cast (see docs/routes-and-config.md).
@overload
def parse_step_params(
    step: Literal["encode", Step.ENCODE], params: Mapping[str, object]
) -> EncodeParams: ...
@overload
def parse_step_params(
    step: Literal["prefill", Step.PREFILL], params: Mapping[str, object]
) -> PrefillParams: ...
@overload
def parse_step_params(
    step: Literal["decode", Step.DECODE], params: Mapping[str, object]
) -> DecodeParams: ...
@overload
def parse_step_params(
    step: Literal["conditional-decode", Step.CONDITIONAL_DECODE], params: Mapping[str, object]
) -> ConditionalDecodeParams: ...
@overload
def parse_step_params(step: str, params: Mapping[str, object]) -> StepParams: ...
def parse_step_params(step: str, params: Mapping[str, object]) -> StepParams:
    """Parse one step's params into a frozen :data:`StepParams`.

    Typed by overloads: a literal step name (or a :class:`Step` member) gives that step's own
    class, e.g. ``parse_step_params("decode", ...)`` is a :class:`DecodeParams`.

    Args:
        step: ``"encode"``, ``"prefill"``, ``"decode"`` or ``"conditional-decode"``.
        params: the step's mapping from the router's config (may be empty).

    Raises:
        ConfigError: naming the step, the key and the bad value; ``param`` is ``"<step>.<key>"``.
    """
    parsed_step = _step(step)
    untyped: object = params  # YAML loaders hand over anything; check before trusting the type
    if not isinstance(untyped, Mapping):
        msg = f"{parsed_step.value}: params must be a mapping, got {describe(params)}"
        raise ConfigError(msg, param=parsed_step.value)
    readers = _READERS[parsed_step]
    values: dict[str, object] = {}
    for key, value in untyped.items():
        param = f"{parsed_step.value}.{key}"
        if parsed_step is Step.CONDITIONAL_DECODE and key == "use_openai_format":
            msg = (
                f"{param}: conditional-decode takes no use_openai_format (got {describe(value)}): "
                "it probes the client's own route with the body the client sent"
            )
            raise ConfigError(msg, param=param)
        reader = readers.get(key) if isinstance(key, str) else None
        if reader is None:
            accepted = ", ".join(sorted(readers))
            msg = f"{param}: unknown key {describe(key)}; {parsed_step.value} accepts {accepted}"
            raise ConfigError(msg, param=param)
        values[key] = value
    # The struct's __post_init__ runs each key's reader.
    return _PARAMS_CLASS[parsed_step](**values)  # type: ignore[arg-type]


def parse_pipeline_params(
    steps: Mapping[str, Mapping[str, object]],
    *,
    use_openai_format: object = None,
) -> dict[Step, StepParams]:
    """Parse every step of a pipeline, applying a pipeline-level ``use_openai_format``.

    The pipeline-level flag fills encode, prefill and decode where the step does not set it
    itself, and is never copied into conditional-decode (which refuses the key).

    Args:
        steps: step name → that step's params.
        use_openai_format: the pipeline-level flag, or ``None`` when the config has none.
    """
    if use_openai_format is not None:
        _bool(use_openai_format, "pipeline.use_openai_format")
    untyped: object = steps  # YAML loaders hand over anything; check before trusting the type
    if not isinstance(untyped, Mapping):
        msg = f"pipeline: steps must be a mapping of step name to params, got {describe(steps)}"
        raise ConfigError(msg, param="pipeline")
    parsed: dict[Step, StepParams] = {}
    for name, params in untyped.items():
        step = _step(name)
        merged = params
        if (
            use_openai_format is not None
            and step is not Step.CONDITIONAL_DECODE
            and isinstance(params, Mapping)
            and "use_openai_format" not in params
        ):
            merged = {**params, "use_openai_format": use_openai_format}
        parsed[step] = parse_step_params(step.value, merged)
    return parsed
