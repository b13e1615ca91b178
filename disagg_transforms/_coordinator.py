"""llm-d's coordinator config document, read into what the proxy would run (docs/llm-d.md).

The coordinator (llm-d-router's ``cmd/coordinator``) is configured by one YAML document:
``server``, ``gateway`` and ``pipeline`` (a list of ``{type, params}`` steps). A router that
takes the coordinator's seat reads the same document. This module reads it, already parsed into
a mapping (no file, no environment: llm-d's ``COORDINATOR_*`` overrides are the caller's), into
a frozen :class:`CoordinatorConfig`:

- what carries over: the steps (as :func:`parse_pipeline_params` gives them), the render and
  gateway URLs, the listen address, the body limit, the connectors and two timeouts;
- what only tunes the coordinator's own process (pool sizes, ``log_level``, TLS, ...): one
  warning each, naming the key;
- what would change an answer and is not carried out (a ``replace-media-urls`` step,
  ``kv-sglang``, an unknown step, connector or key): a :class:`ConfigError` whose ``param`` is
  the key's path in the document (``pipeline.steps[0].type``).
"""

from __future__ import annotations

import enum
import re
import types
from collections.abc import Mapping
from typing import Final, TypeVar

import msgspec

from disagg_transforms._config import (
    Step,
    StepParams,
    parse_pipeline_params,
    parse_step_params,
)
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError

__all__ = (
    "CoordinatorConfig",
    "EcConnector",
    "KvConnector",
    "coordinator_config_errors",
    "is_coordinator_document",
    "parse_coordinator_config",
    "unsubstituted",
)


class KvConnector(str, enum.Enum):
    """How prefill hands its KV cache to decode (``pipeline.kv_connector``)."""

    SHARED_STORAGE = "kv-shared-storage"
    """The coordinator's default: decode gets only the two flags, not prefill's params."""
    NIXL = "kv-nixl"
    """Decode gets the prefill answer's ``kv_transfer_params``, the two flags forced."""
    SGLANG = "kv-sglang"
    """SGLang's bootstrap rendezvous: prefill and decode sent together, no transfer params;
    only with ``Engine.SGLANG``, which it selects in ``serve`` (``docs/sglang.md``)."""


class EcConnector(str, enum.Enum):
    """How encode hands its encoder cache to prefill (``pipeline.ec_connector``)."""

    SHARED_STORAGE = "ec-shared-storage"
    """The coordinator's default: no ``ec_transfer_params`` on any leg."""
    NIXL = "ec-nixl"
    """Prefill gets the encode answers' ``ec_transfer_params``."""


MIB: Final = 1024 * 1024
_DEFAULT_BODY_MIB: Final = 64
_MAX_INT64: Final = 2**63 - 1


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a coordinator config document asks for, in the proxy's terms.

    Attributes:
        pipeline: The steps, as :func:`parse_pipeline_params` returns them (render is not a
            step here: its address is ``render_url``). Read-only.
        render_url: ``render.params.address``; ``None`` without a render step.
        gateway_url: ``gateway.address``; ``None`` when the document has none.
        host: The host of ``server.listen_addr`` (``0.0.0.0`` for ``":8080"``, as Go listens
            on every address).
        port: Its port (default 8080).
        max_request_body_bytes: ``server.max_request_body_size`` (MiB, default 64) in bytes.
        kv_connector: The KV connector of the prefill and decode steps.
        ec_connector: The EC connector of the encode and prefill steps.
        drain_timeout: ``server.shutdown_timeout`` in seconds (default 25).
        first_byte_timeout: ``gateway.timeout`` in seconds (default 60); ``None`` for ``0s``,
            which the coordinator reads as no limit.
        warnings: One line per key that has no equivalent in the proxy, naming it.
        render_first: Whether the render step is listed before the conditional-decode step
            (or there is no conditional-decode step): the steps run in the order listed, so
            render is then called first (:attr:`ExchangeSettings.render_first`).
    """

    pipeline: Mapping[Step, StepParams]
    render_url: str | None
    gateway_url: str | None
    host: str
    port: int
    max_request_body_bytes: int
    kv_connector: KvConnector
    ec_connector: EcConnector
    drain_timeout: float
    first_byte_timeout: float | None
    warnings: tuple[str, ...]
    render_first: bool = False


# Keys that only tune the coordinator's own process, and why the proxy has nothing for them.
_PROCESS_KEYS: Mapping[str, str] = {
    "log_level": "the proxy logs at INFO, one access line per request",
    "tracing": "the proxy exports no OpenTelemetry spans",
    "server.read_timeout": "the proxy has no timeout on reading the client's body",
    "server.write_timeout": "the proxy has no timeout on the whole reply",
    "server.metrics_port": "the proxy has no separate metrics listener",
    "server.metrics_cert_dir": "the proxy serves plain HTTP",
    "server.secure_serving": "the proxy serves plain HTTP: terminate TLS in front of it",
    "server.cert_path": "the proxy serves plain HTTP",
    "server.tls_min_version": "the proxy serves plain HTTP",
    "server.tls_cipher_suites": "the proxy serves plain HTTP",
    "gateway.max_idle_conns_per_host": "the proxy's connection pool is not sized per host",
    "gateway.idle_conn_timeout": "the proxy's pool keeps its own idle timeout",
    "pipeline.kv_connector_params": "it tunes kv-sglang only",
}
_RENDER_PROCESS_KEYS: Mapping[str, str] = {
    "timeout": "render calls share the proxy's worker timeouts",
    "max_idle_conns_per_host": "the proxy's connection pool is not sized per host",
    "idle_conn_timeout": "the proxy's pool keeps its own idle timeout",
}
_RENDER_LIMITS: Final = ("max_total_tokens", "max_total_placeholder_tokens")
_ENCODE_PROCESS_KEYS: Mapping[str, str] = {
    "max_parallel": "the proxy sends one encode leg per request",
}

_SECTIONS: Mapping[str, frozenset[str]] = {
    "server": frozenset(
        {"listen_addr", "shutdown_timeout", "max_request_body_size"}
        | {key.split(".", 1)[1] for key in _PROCESS_KEYS if key.startswith("server.")}
    ),
    "gateway": frozenset(
        {"address", "timeout"}
        | {key.split(".", 1)[1] for key in _PROCESS_KEYS if key.startswith("gateway.")}
    ),
    "pipeline": frozenset(
        {"kv_connector", "ec_connector", "use_openai_format", "steps"}
        | {"forward_response_headers", "kv_connector_params"}
    ),
}
_TOP_LEVEL: Final = frozenset({*_SECTIONS, "log_level", "tracing"})

# The steps a document may list, and the order it must list them in: render and
# conditional-decode in either order (they run as listed), then encode, prefill, decode.
_STEP_ORDER: Final = ("render", "conditional-decode", "encode", "prefill", "decode")
_STEP_RANK: Mapping[str, int] = {"render": 0, "conditional-decode": 0, "encode": 1, "prefill": 2}
# Connector keys a step may set for itself, overriding the pipeline's.
_STEP_CONNECTORS: Mapping[str, tuple[str, ...]] = {
    "encode": ("ec_connector",),
    "prefill": ("kv_connector", "ec_connector"),
    "decode": ("kv_connector",),
}
_NOT_CARRIED: Mapping[str, str] = {
    "replace-media-urls": (
        "the proxy downloads no images: a client's http(s) image URL would reach the workers "
        "as sent; remove the step (clients then send data: URLs)"
    ),
    "prefill-decode": (
        "list a prefill and a decode step with kv_connector: kv-sglang instead: the proxy "
        "sends the two together (docs/sglang.md)"
    ),
}

# A Go duration (time.ParseDuration): a sign, then number-unit pairs; "0" alone needs no unit.
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"[-+]?(?:0|(?:{_DURATION_PART.pattern})+)")
_UNIT_SECONDS: Mapping[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_LISTEN = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})")
_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
_URL = re.compile(r"https?://[^\s/?#]+(?:/[^\s?#]*)?", re.IGNORECASE)

_EnumT = TypeVar("_EnumT", bound=enum.Enum)


class _Reader:
    """Reads one document, collecting every error and warning (an operator wants them all)."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []
        self.warnings: list[str] = []

    def error(self, param: str, message: str) -> None:
        self.errors.append(ConfigError(f"{param}: {message}", param=param))

    def warn(self, param: str, reason: str) -> None:
        self.warnings.append(f"{param}: ignored, {reason}")

    def section(self, document: Mapping[object, object], name: str) -> Mapping[object, object]:
        value = document.get(name)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(name, f"expected a mapping, got {describe(value)}")
            return {}
        for key in value:
            if key not in _SECTIONS[name]:
                self.error(f"{name}.{key}", f"unknown key {describe(key)}")
            elif f"{name}.{key}" in _PROCESS_KEYS:
                self.process_key(f"{name}.{key}", value[key])
        return value

    def process_key(self, param: str, value: object) -> None:
        if param == "server.secure_serving" and value is False:
            return  # plain HTTP: what the proxy serves
        self.warn(param, _PROCESS_KEYS[param])

    def duration(self, section: Mapping[object, object], param: str, default: float) -> float:
        value = section.get(param.split(".", 1)[1])
        if value is None:
            return default
        if not isinstance(value, str) or _DURATION.fullmatch(value) is None:
            self.error(param, f'expected a Go duration such as "30s", got {describe(value)}')
            return default
        seconds = sum(
            float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(value)
        )
        if value.startswith("-") and seconds:
            self.error(param, f"expected a duration of zero or more, got {describe(value)}")
            return default
        return seconds

    def url(self, value: object, param: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, str) and (problem := unsubstituted(value)):
            self.error(param, problem)
            return None
        if not isinstance(value, str) or _URL.fullmatch(value) is None:
            self.error(param, f"expected an http:// or https:// URL, got {describe(value)}")
            return None
        return value

    def member(self, cls: type[_EnumT], value: object, param: str) -> _EnumT | None:
        if isinstance(value, str) and value in _NOT_CARRIED:
            self.error(param, f"{value} is not carried out: {_NOT_CARRIED[value]}")
            return None
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(member.value for member in cls)
            self.error(param, f"unknown connector {describe(value)}; accepted: {accepted}")
            return None


def unsubstituted(url: str) -> str:
    """Why ``url`` cannot be called because it still holds a ``${...}`` placeholder, or ``""``.

    llm-d's guides write ``http://${GATEWAY_SERVICE}.${NAMESPACE}.svc:80`` for ``envsubst`` to
    fill in; sent as it is, every call fails on the name while the probes still answer 200.
    """
    found = _PLACEHOLDER.findall(url)
    if not found:
        return ""
    return (
        f"{url!r} still holds the placeholder {', '.join(found)}: substitute it (envsubst) or "
        "write the address"
    )


def is_coordinator_document(document: object) -> bool:
    """Whether ``document`` is shaped like llm-d's coordinator config.

    It is when its top level has a ``pipeline`` mapping holding a ``steps`` list (the project's
    own pipeline document has a ``steps`` mapping at the top level instead).
    """
    if not isinstance(document, Mapping):
        return False
    pipeline = document.get("pipeline")
    return isinstance(pipeline, Mapping) and isinstance(pipeline.get("steps"), list)


def parse_coordinator_config(document: Mapping[str, object]) -> CoordinatorConfig:
    """Read llm-d's coordinator config document (already parsed from YAML).

    Args:
        document: The whole document: ``log_level``, ``server``, ``gateway``, ``pipeline``.

    Returns:
        What the proxy would run, with one warning per key it has no equivalent for.

    Raises:
        ConfigError: The first problem (``param`` is the key's path, e.g.
            ``pipeline.steps[0].type``); :func:`coordinator_config_errors` lists them all.
    """
    reader = _Reader()
    config = _read(reader, document)
    if reader.errors or config is None:
        raise reader.errors[0]
    return config


def coordinator_config_errors(document: object) -> list[ConfigError]:
    """Every problem of a coordinator config document, one error each (empty: it is valid)."""
    reader = _Reader()
    _read(reader, document)
    return reader.errors


def _read(reader: _Reader, document: object) -> CoordinatorConfig | None:
    if not isinstance(document, Mapping):
        reader.error("$", f"expected a mapping, got {describe(document)}")
        return None
    for key in document:
        if key not in _TOP_LEVEL:
            reader.error(str(key), f"unknown top-level key {describe(key)}")
        elif key in _PROCESS_KEYS:
            reader.process_key(key, document[key])
    server = reader.section(document, "server")
    gateway = reader.section(document, "gateway")
    pipeline = reader.section(document, "pipeline")
    host, port = _listen(reader, server.get("listen_addr"))
    body_bytes = _body_bytes(reader, server.get("max_request_body_size"))
    drain = reader.duration(server, "server.shutdown_timeout", 25.0)
    first_byte = reader.duration(gateway, "gateway.timeout", 60.0)
    gateway_url = reader.url(gateway.get("address"), "gateway.address")
    steps = _Steps(reader, pipeline)
    if reader.errors:
        return None
    return CoordinatorConfig(
        pipeline=steps.parsed,
        render_url=steps.render_url,
        gateway_url=gateway_url,
        host=host,
        port=port,
        max_request_body_bytes=body_bytes,
        kv_connector=steps.kv_connector,
        ec_connector=steps.ec_connector,
        drain_timeout=drain,
        first_byte_timeout=first_byte or None,
        warnings=tuple(reader.warnings),
        render_first=steps.render_first,
    )


def _type_problem(kind: object, seen: Mapping[str, int]) -> str | None:
    """Why a step's type cannot run where it stands; ``None`` when it can."""
    if isinstance(kind, str) and kind in _NOT_CARRIED:
        return f"{kind} is not carried out: {_NOT_CARRIED[kind]}"
    if not isinstance(kind, str) or kind not in _STEP_ORDER:
        return f"unknown step type {describe(kind)}; accepted: {', '.join(_STEP_ORDER)}"
    if kind in seen:
        return f"a second {kind} step (the first is steps[{seen[kind]}])"
    later = [name for name in seen if _STEP_RANK.get(name, 3) > _STEP_RANK.get(kind, 3)]
    if later:
        return (
            f"{kind} after {later[0]}: the steps run in the order render and conditional-decode "
            "(either first), encode, prefill, decode"
        )
    return None


def _listen(reader: _Reader, value: object) -> tuple[str, int]:
    param = "server.listen_addr"
    if value is None:
        value = ":8080"
    match = _LISTEN.fullmatch(value) if isinstance(value, str) else None
    if match is None or int(match["port"]) > 65535:
        reader.error(param, f'expected "host:port" such as ":8080", got {describe(value)}')
        return "0.0.0.0", 8080  # noqa: S104 - unused: the error stops the reading
    host = match["v6"] if match["v6"] is not None else match["host"]
    return host or "0.0.0.0", int(match["port"])  # noqa: S104 - Go's ":port" listens everywhere


def _body_bytes(reader: _Reader, value: object) -> int:
    param = "server.max_request_body_size"
    if value is None or (type(value) is int and value == 0):
        return _DEFAULT_BODY_MIB * MIB  # the coordinator reads 0 as its default too
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        reader.error(param, f"expected a positive number of MiB, got {describe(value)}")
        return 0
    if value > _MAX_INT64 // MIB:
        reader.error(param, f"{value} MiB is too large, got {describe(value)}")
        return 0
    return value * MIB


class _Steps:
    """``pipeline.steps`` read into the proxy's pipeline, render URL and connectors."""

    def __init__(self, reader: _Reader, pipeline: Mapping[object, object]) -> None:
        self.reader = reader
        self.render_url: str | None = None
        self.render_first = False
        self.parsed: Mapping[Step, StepParams] = types.MappingProxyType({})
        use_openai_format = pipeline.get("use_openai_format")
        if use_openai_format is not None and not isinstance(use_openai_format, bool):
            reader.error(
                "pipeline.use_openai_format",
                f"expected true or false, got {describe(use_openai_format)}",
            )
            use_openai_format = None  # reported once here, not again in every step
        kv = self._connector(KvConnector, pipeline, "kv_connector", "pipeline.kv_connector")
        ec = self._connector(EcConnector, pipeline, "ec_connector", "pipeline.ec_connector")
        self.kv_connector = kv or KvConnector.SHARED_STORAGE
        self.ec_connector = ec or EcConnector.SHARED_STORAGE
        headers = pipeline.get("forward_response_headers")
        if headers is not None and headers != []:
            reader.error(
                "pipeline.forward_response_headers",
                "the proxy forwards no worker's response headers to later legs; "
                "remove the key or set it to []",
            )
        raw_steps = pipeline.get("steps")
        if not isinstance(raw_steps, list):
            reader.error("pipeline.steps", f"expected a list of steps, got {describe(raw_steps)}")
            return
        self._read_steps(raw_steps, use_openai_format)

    def _connector(
        self,
        cls: type[_EnumT],
        params: Mapping[object, object],
        key: str,
        param: str,
    ) -> _EnumT | None:
        value = params.get(key)
        return None if value is None else self.reader.member(cls, value, param)

    def _read_steps(self, raw_steps: list[object], use_openai_format: object) -> None:
        reader = self.reader
        seen: dict[str, int] = {}
        params_of: dict[str, Mapping[str, object]] = {}
        kv_of: dict[str, KvConnector] = {}
        ec_of: dict[str, EcConnector] = {}
        for index, item in enumerate(raw_steps):
            where = f"pipeline.steps[{index}]"
            kind, params = self._step(item, where, seen)
            if kind is None:
                continue
            seen[kind] = index
            connectors = _STEP_CONNECTORS.get(kind, ())
            kv_param, ec_param = f"{where}.params.kv_connector", f"{where}.params.ec_connector"
            if "kv_connector" in connectors and (
                (kv := self._connector(KvConnector, params, "kv_connector", kv_param)) is not None
            ):
                kv_of[kind] = kv
            if "ec_connector" in connectors and (
                (ec := self._connector(EcConnector, params, "ec_connector", ec_param)) is not None
            ):
                ec_of[kind] = ec
            own = self._own_params(kind, params, where)
            if kind == "render":
                self._render(own, where)
            else:
                self._check_params(kind, own, where, use_openai_format)
                params_of[kind] = own
        if "decode" not in seen:
            reader.error("pipeline.steps", "the pipeline has no decode step")
        unlisted = len(raw_steps)
        self.render_first = seen.get("render", unlisted) < seen.get("conditional-decode", unlisted)
        self._agree(kv_of, ec_of, seen)
        if reader.errors:
            return
        self.parsed = types.MappingProxyType(
            parse_pipeline_params(params_of, use_openai_format=use_openai_format)
        )
        self._need_render(seen)

    def _own_params(
        self, kind: str, params: Mapping[object, object], where: str
    ) -> dict[str, object]:
        """A step's params less its connectors and the keys that only tune the coordinator."""
        own: dict[str, object] = {}
        for key, value in params.items():
            if key in _STEP_CONNECTORS.get(kind, ()):
                continue
            if kind == "encode" and key in _ENCODE_PROCESS_KEYS:
                self.reader.warn(f"{where}.params.{key}", _ENCODE_PROCESS_KEYS[str(key)])
            else:
                own[str(key)] = value
        return own

    def _step(
        self, item: object, where: str, seen: Mapping[str, int]
    ) -> tuple[str | None, Mapping[object, object]]:
        reader = self.reader
        if not isinstance(item, Mapping):
            reader.error(where, f"expected a mapping with a type, got {describe(item)}")
            return None, {}
        for key in item:
            if key not in ("type", "params"):
                reader.error(
                    f"{where}.{key}", f"unknown key {describe(key)}; a step has type, params"
                )
        kind = item.get("type")
        params = item.get("params")
        if params is None:
            params = {}
        if not isinstance(params, Mapping):
            reader.error(f"{where}.params", f"expected a mapping, got {describe(params)}")
            return None, {}
        problem = _type_problem(kind, seen)
        if problem is not None:
            reader.error(f"{where}.type", problem)
            return None, {}
        assert isinstance(kind, str)  # noqa: S101 - _type_problem accepts step names only
        return kind, params

    def _render(self, params: Mapping[str, object], where: str) -> None:
        reader = self.reader
        for key, value in params.items():
            param = f"{where}.params.{key}"
            if key == "address":
                continue
            if key in _RENDER_PROCESS_KEYS:
                reader.warn(param, _RENDER_PROCESS_KEYS[key])
            elif key in _RENDER_LIMITS:
                if value not in (None, 0) or isinstance(value, bool):
                    reader.error(
                        param,
                        f"the proxy does not refuse a prompt by its token count "
                        f"(got {describe(value)}); remove the key or set it to 0",
                    )
            else:
                reader.error(param, f"unknown key {describe(key)} of the render step")
        address = params.get("address")
        if address is None:
            reader.error(f"{where}.params.address", "the render step needs its address")
        self.render_url = reader.url(address, f"{where}.params.address")

    def _check_params(
        self, kind: str, params: Mapping[str, object], where: str, use_openai_format: object
    ) -> None:
        merged = dict(params)
        if (
            kind != "conditional-decode"
            and use_openai_format is not None
            and "use_openai_format" not in merged
        ):
            merged["use_openai_format"] = use_openai_format
        try:
            parse_step_params(kind, merged)
        except ConfigError as error:
            key = (error.param or kind).split(".", 1)[-1]
            param = f"{where}.params.{key}" if error.param != kind else f"{where}.params"
            text = error.message.split(": ", 1)[-1]
            self.reader.errors.append(ConfigError(f"{param}: {text}", param=param))

    def _agree(
        self,
        kv_of: Mapping[str, KvConnector],
        ec_of: Mapping[str, EcConnector],
        seen: Mapping[str, int],
    ) -> None:
        self.kv_connector = self._handoff(kv_of, self.kv_connector, ("prefill", "decode"), seen)
        self.ec_connector = self._handoff(ec_of, self.ec_connector, ("encode", "prefill"), seen)

    def _handoff(
        self,
        of: Mapping[str, _EnumT],
        default: _EnumT,
        ends: tuple[str, str],
        seen: Mapping[str, int],
    ) -> _EnumT:
        """The one connector both ends of a handoff use (a step may override the pipeline's)."""
        chosen = {end: of.get(end, default) for end in ends if end in seen}
        first, last = (chosen.get(end, default) for end in ends)
        if first is not last and len(chosen) == len(ends):
            key = "kv_connector" if isinstance(first, KvConnector) else "ec_connector"
            self.reader.error(
                f"pipeline.steps[{seen[ends[1]]}].params.{key}",
                f"{ends[0]} uses {first.value} and {ends[1]} {last.value}: "
                "both ends of the handoff need the same connector",
            )
        return next(iter(chosen.values()), default)

    def _need_render(self, seen: Mapping[str, int]) -> None:
        if "render" in seen:
            return
        generate = [
            step.value
            for step, params in self.parsed.items()
            if not getattr(params, "use_openai_format", True)
        ]
        if generate:
            self.reader.error(
                "pipeline.steps",
                f"{generate[0]} speaks the generate route (use_openai_format: false), which "
                "needs the token IDs a render step makes; add a render step",
            )
