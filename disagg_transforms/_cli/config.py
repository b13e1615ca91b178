"""Reading a pipeline config document (JSON, or YAML with PyYAML) for the commands that take one.

``check-config`` and ``serve`` read the same document the same way; every failure is a
:class:`CliError` of one line (``docs/cli.md``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import msgspec

from disagg_transforms import (
    Engine,
    SglangSettings,
    parse_pipeline_params,
    validate_vllm_version,
    version_errors,
)
from disagg_transforms._cli.commands import CliError
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError

__all__ = (
    "config_errors",
    "engine_settings",
    "one_line",
    "parse_document",
    "read_config",
    "read_json",
    "source_name",
)

_STDIN = "-"
_TOP_LEVEL_KEYS = ("steps", "use_openai_format", "vllm_version", "engine", "sglang")
_SGLANG_KEYS = ("stream_output", "bootstrap_port")
_YAML_HINT = " (if it is YAML, pass --format yaml)"
_CONFIGMAP_KEY = "coordinator.yaml"
# The other document check-config and serve read, named where a key is unknown to this one.
_COORDINATOR_FORMAT = "llm-d's coordinator document (server, gateway, pipeline.steps: a list)"


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def source_name(source: str) -> str:
    return "<stdin>" if source == _STDIN else source


def _read_bytes(source: str) -> bytes:
    """The bytes of a file, or of stdin when ``source`` is ``-``."""
    if source == _STDIN:
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        msg = f"cannot read {source}: {exc.strerror or one_line(exc)}"
        raise CliError(msg) from None


def _decode(
    source: str,
    kind: str,
    loads: Callable[[bytes], object],
    errors: type[Exception],
    hint: str = "",
) -> object:
    return parse_document(
        source_name(source), kind, lambda: loads(_read_bytes(source)), errors, hint
    )


def parse_document(
    name: str, kind: str, parse: Callable[[], object], errors: type[Exception], hint: str = ""
) -> object:
    """``parse()``'s document; a failure is a `CliError` naming ``name`` (a source or option).

    A document nested past the interpreter's stack is refused like any other (docs/cli.md).
    """
    try:
        return parse()
    except errors as exc:
        msg = f"{name}: not valid {kind}: {one_line(exc)}{hint}"
    except RecursionError:
        msg = f"{name}: not valid {kind}: nested too deep"
    raise CliError(msg)


def read_json(source: str, hint: str = "") -> object:
    """Parse the JSON document in a file or on stdin (``-``); a failure is a `CliError`.

    msgspec, not orjson: it reads an integer beyond 64 bits exactly (orjson makes it a float).
    ``hint`` ends the message of a document that does not parse.
    """
    return _decode(source, "JSON", msgspec.json.decode, msgspec.DecodeError, hint)


def _yaml(name: str) -> ModuleType:
    try:
        import yaml  # noqa: PLC0415 - optional: only these commands, and only for YAML, need it
    except ImportError:
        msg = f"{name}: reading YAML needs PyYAML (pip install pyyaml); or give the config as JSON"
        raise CliError(msg) from None
    return yaml


def _read_yaml(source: str) -> object:
    yaml = _yaml(source_name(source))
    return _decode(source, "YAML", yaml.safe_load, yaml.YAMLError)


def read_config(source: str, fmt: str) -> object:
    """The config document in a file or on stdin; a ConfigMap's embedded document unwrapped."""
    if fmt != "auto":
        document = _read_yaml(source) if fmt == "yaml" else read_json(source)
    elif Path(source).suffix.lower() in {".yaml", ".yml"}:
        document = _read_yaml(source)
    else:
        # JSON is only the guess here (stdin, or a name without .yaml): say how to ask for YAML.
        document = read_json(source, _YAML_HINT)
    return _embedded(document, source_name(source))


def _embedded(document: object, name: str) -> object:
    """The coordinator document a Kubernetes ConfigMap holds, as llm-d ships it; else ``document``.

    llm-d mounts the coordinator's YAML from a ConfigMap's ``data.coordinator.yaml``
    (deploy/coordinator/configmap.yaml too): the same file is what an operator checks.
    """
    if not isinstance(document, Mapping) or document.get("kind") != "ConfigMap":
        return document
    data = document.get("data")
    if not isinstance(data, Mapping) or not isinstance(data.get(_CONFIGMAP_KEY), str):
        keys = ", ".join(map(str, data)) if isinstance(data, Mapping) and data else "none"
        msg = f"{name}: a ConfigMap whose data has no {_CONFIGMAP_KEY} (it has: {keys})"
        raise CliError(msg)
    text: str = data[_CONFIGMAP_KEY]
    yaml = _yaml(name)
    where = f"{name}: data.{_CONFIGMAP_KEY}"
    return parse_document(where, "YAML", lambda: yaml.safe_load(text), yaml.YAMLError)


def _collect(errors: list[ConfigError], steps: object, use_openai_format: object = None) -> bool:
    try:
        parse_pipeline_params(steps, use_openai_format=use_openai_format)  # type: ignore[arg-type]
    except ConfigError as error:
        errors.append(error)
        return False
    return True


def _top_level_errors(document: Mapping[str, object]) -> list[ConfigError]:
    """Unknown top-level keys, and a ``vllm_version`` that is not a release."""
    accepted = ", ".join(_TOP_LEVEL_KEYS)
    errors = [
        ConfigError(
            f"{key}: unknown top-level key {describe(key)}; accepted: {accepted}; "
            f"or {_COORDINATOR_FORMAT}",
            param=str(key),
        )
        for key in document
        if key not in _TOP_LEVEL_KEYS
    ]
    if document.get("vllm_version") is not None:
        try:
            validate_vllm_version(document["vllm_version"])
        except ConfigError as error:
            errors.append(error)
    try:
        engine_settings(document)
    except ConfigError as error:
        errors.append(error)
    return errors


def engine_settings(document: Mapping[str, object]) -> tuple[Engine, SglangSettings]:
    """A pipeline document's ``engine`` and its ``sglang`` settings (docs/sglang.md).

    Raises:
        ConfigError: an engine that is not ``vllm`` or ``sglang``, an ``sglang`` key that is
            unknown or not valid, or ``sglang`` settings for another engine.
    """
    name = document.get("engine", Engine.VLLM.value)
    engines = ", ".join(engine.value for engine in Engine)
    if name not in {engine.value for engine in Engine}:
        msg = f"engine: expected one of {engines}, got {describe(name)}"
        raise ConfigError(msg, param="engine")
    engine = Engine(name)
    given = document.get("sglang")
    if given is None:
        return engine, SglangSettings()
    if engine is not Engine.SGLANG:
        msg = "sglang: settings for SGLang workers need engine: sglang"
        raise ConfigError(msg, param="sglang")
    if not isinstance(given, Mapping):
        msg = f"sglang: expected an object, got {describe(given)}"
        raise ConfigError(msg, param="sglang")
    for key in given:
        if key not in _SGLANG_KEYS:
            msg = f"sglang.{key}: unknown key; accepted: {', '.join(_SGLANG_KEYS)}"
            raise ConfigError(msg, param=f"sglang.{key}")
    return engine, SglangSettings(**{str(key): value for key, value in given.items()})


def config_errors(document: object) -> list[ConfigError]:
    """Every error in a pipeline config document, each key checked on its own.

    ``parse_pipeline_params`` stops at the first error; an operator fixing a file wants them
    all, so each step name and each key is run through it separately (no rule spans two keys).
    """
    if not isinstance(document, Mapping):
        msg = f'$: expected an object with a "steps" key, got {describe(document)}'
        return [ConfigError(msg, param="$")]
    errors = _top_level_errors(document)
    _collect(errors, {}, document.get("use_openai_format"))
    if "steps" not in document:
        errors.append(ConfigError('steps: the "steps" key is missing', param="steps"))
        return errors
    steps = document["steps"]
    if not isinstance(steps, Mapping):
        _collect(errors, steps)
        return errors
    for name, params in steps.items():
        if not _collect(errors, {name: {}}):
            continue  # an unknown step name: its keys mean nothing
        if not isinstance(params, Mapping):
            _collect(errors, {name: params})
            continue
        for key, value in params.items():
            _collect(errors, {name: {key: value}})
    version = document.get("vllm_version")
    if not errors and version is not None:  # a rule across keys: a step's mode, the release
        config = parse_pipeline_params(steps, use_openai_format=document.get("use_openai_format"))
        errors.extend(version_errors(config, version))
    return errors
