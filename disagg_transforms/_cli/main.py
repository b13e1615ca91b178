"""Command line: ``python -m disagg_transforms`` (also the ``disagg-transforms`` script).

``demo`` shows what the library does; ``check-config FILE|-`` validates a router's step params.
The command line may read files and stdin (the library itself never does); every failure, a
usage error included, is one line on stderr and exit code 2, never a traceback (docs/cli.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import msgspec

# The command line is a client of the public API (docs/cli.md): it imports what a router would.
from disagg_transforms import (
    CoordinatorConfig,
    DecodeLeg,
    DecodeParams,
    EncodeParams,
    Leg,
    LegInputs,
    OutputMode,
    PrefillParams,
    Step,
    StepParams,
    build_decode_request,
    build_encode_request,
    build_prefill_request,
    parse_coordinator_config,
    parse_pipeline_params,
    parse_step_params,
    pipeline_warnings,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_responses_response,
)
from disagg_transforms._cli.commands import EXIT_USAGE, PROG, CliError, Handler, add_command
from disagg_transforms._cli.demo import demo_text, indented_json, params_json
from disagg_transforms._coordinator import MIB, coordinator_config_errors, is_coordinator_document
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError, DisaggTransformError

_STDIN = "-"
_TOP_LEVEL_KEYS = ("steps", "use_openai_format")
# `--token-ids 1,2,3`: integers and commas only, so it can never be taken for a file name that
# needs reading (docs/cli.md: ./NAME reads a file named like that).
_INLINE_IDS = re.compile(r"\s*-?\d+(\s*,\s*-?\d+)*\s*")
_YAML_HINT = " (if it is YAML, pass --format yaml)"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (argparse prints usage and exits itself)."""

    def error(self, message: str) -> NoReturn:
        msg = f"{message} (see: {self.prog} --help)"
        raise CliError(msg)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _source_name(source: str) -> str:
    return "<stdin>" if source == _STDIN else source


def _read_bytes(source: str) -> bytes:
    """The bytes of a file, or of stdin when ``source`` is ``-``."""
    if source == _STDIN:
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        msg = f"cannot read {source}: {exc.strerror or _one_line(exc)}"
        raise CliError(msg) from None


def _decode(
    source: str,
    kind: str,
    loads: Callable[[bytes], object],
    errors: type[Exception],
    hint: str = "",
) -> object:
    return _parse(_source_name(source), kind, lambda: loads(_read_bytes(source)), errors, hint)


def _parse(
    name: str, kind: str, parse: Callable[[], object], errors: type[Exception], hint: str = ""
) -> object:
    """``parse()``'s document; a failure is a `CliError` naming ``name`` (a source or option).

    A document nested past the interpreter's stack is refused like any other (docs/cli.md).
    """
    try:
        return parse()
    except errors as exc:
        msg = f"{name}: not valid {kind}: {_one_line(exc)}{hint}"
    except RecursionError:
        msg = f"{name}: not valid {kind}: nested too deep"
    raise CliError(msg)


def _read_json(source: str, hint: str = "") -> object:
    """Parse the JSON document in a file or on stdin (``-``); a failure is a `CliError`.

    msgspec, not orjson: it reads an integer beyond 64 bits exactly (orjson makes it a float).
    ``hint`` ends the message of a document that does not parse.
    """
    return _decode(source, "JSON", msgspec.json.decode, msgspec.DecodeError, hint)


def _read_yaml(source: str) -> object:
    try:
        import yaml  # noqa: PLC0415 - optional: only this command, and only for YAML, needs it
    except ImportError:
        msg = (
            f"{_source_name(source)}: reading YAML needs PyYAML (pip install pyyaml); "
            "or give the config as JSON"
        )
        raise CliError(msg) from None
    return _decode(source, "YAML", yaml.safe_load, yaml.YAMLError)


def _read_config(source: str, fmt: str) -> object:
    if fmt != "auto":
        return _read_yaml(source) if fmt == "yaml" else _read_json(source)
    if Path(source).suffix.lower() in {".yaml", ".yml"}:
        return _read_yaml(source)
    # JSON is only the guess here (stdin, or a name without .yaml): say how to ask for YAML.
    return _read_json(source, _YAML_HINT)


def _collect(errors: list[ConfigError], steps: object, use_openai_format: object = None) -> bool:
    try:
        parse_pipeline_params(steps, use_openai_format=use_openai_format)  # type: ignore[arg-type]
    except ConfigError as error:
        errors.append(error)
        return False
    return True


def _config_errors(document: object) -> list[ConfigError]:
    """Every error in a pipeline config document, each key checked on its own.

    ``parse_pipeline_params`` stops at the first error; an operator fixing a file wants them
    all, so each step name and each key is run through it separately (no rule spans two keys).
    """
    if not isinstance(document, Mapping):
        msg = f'$: expected an object with a "steps" key, got {describe(document)}'
        return [ConfigError(msg, param="$")]
    errors: list[ConfigError] = []
    for key in document:
        if key not in _TOP_LEVEL_KEYS:
            msg = (
                f"{key}: unknown top-level key {describe(key)}; accepted: steps, use_openai_format"
            )
            errors.append(ConfigError(msg, param=str(key)))
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
    return errors


def _check_config(args: argparse.Namespace) -> int:
    """Validate a pipeline's step params (JSON, or YAML with PyYAML).

    Validate {"use_openai_format": <bool, optional>, "steps": {"<step>": {...}}} and print every
    error with its key. Exit code 0 when valid, 2 when not.
    """
    source: str = args.file
    document = _read_config(source, args.format)
    if is_coordinator_document(document):
        return _check_coordinator(document, _source_name(source))
    errors = _config_errors(document)
    if not errors and isinstance(document, Mapping):
        try:
            parsed = parse_pipeline_params(
                document["steps"], use_openai_format=document.get("use_openai_format")
            )
        except ConfigError as error:  # a rule spanning keys would surface only here
            errors = [error]
        else:
            _print_steps(parsed)
            name = _source_name(source)
            sys.stderr.writelines(
                f"{name}: warning: {line}\n" for line in pipeline_warnings(parsed)
            )
            return 0
    name = _source_name(source)
    sys.stderr.writelines(f"{name}: {error.message}\n" for error in errors)
    return EXIT_USAGE


def _check_coordinator(document: object, name: str) -> int:
    """check-config on llm-d's coordinator document: what would run, or every error."""
    errors = coordinator_config_errors(document)
    if errors:
        sys.stderr.writelines(f"{name}: {error.message}\n" for error in errors)
        return EXIT_USAGE
    config = parse_coordinator_config(document)  # type: ignore[arg-type]
    _print_steps(config.pipeline, _coordinator_lines(config))
    warnings = [*config.warnings, *pipeline_warnings(config.pipeline)]
    sys.stderr.writelines(f"{name}: warning: {line}\n" for line in warnings)
    return 0


def _coordinator_lines(config: CoordinatorConfig) -> list[str]:
    def seconds(value: float | None) -> str:
        return "none" if value is None else f"{value:g}s"

    rows = {
        "document": "llm-d coordinator config",
        "listen": f"{config.host}:{config.port}",
        "gateway": config.gateway_url or "none",
        "render": config.render_url or "none",
        "body limit": f"{config.max_request_body_bytes // MIB} MiB",
        "kv_connector": config.kv_connector.value,
        "ec_connector": config.ec_connector.value,
        "drain timeout": seconds(config.drain_timeout),
        "first-byte timeout": seconds(config.first_byte_timeout),
    }
    return [f"{key:<20} {value}" for key, value in rows.items()]


def _print_steps(parsed: Mapping[Step, StepParams], head: Sequence[str] = ()) -> None:
    lines = [f"{step.value:<20} {params_json(params)}" for step, params in parsed.items()]
    sys.stdout.write("\n".join(["valid", *head, *lines]) + "\n")


def _run_demo(args: argparse.Namespace) -> int:
    """Run one request per client API through the exchange and a simulated worker.

    Trace chat, streaming chat, Responses, Messages and a tool call through the exchange
    (render, prefill, decode) against a simulated vLLM worker, in process.
    """
    sys.stdout.write(demo_text(full=args.full))
    return 0


def _json_option(text: str, option: str) -> object:
    return _parse(option, "JSON", lambda: msgspec.json.decode(text), msgspec.DecodeError)


def _token_ids(value: str | None) -> object:
    """``--token-ids``: ``1,2,3`` or a JSON list given inline, or the name of a file holding one."""
    if value is None:
        return None
    if _INLINE_IDS.fullmatch(value):
        return [int(item) for item in value.split(",")]
    if value.lstrip().startswith("["):
        return _json_option(value, "--token-ids")
    return _read_json(value)


def _build_leg(args: argparse.Namespace) -> Leg:
    body: object = _read_json(args.file)
    step = Step(args.step)
    params = parse_step_params(step.value, _params_option(args.params))
    common: dict[str, object] = {
        "client_path": args.path,
        # The builder checks what was read (a RequestError at $.token_ids), as for the body.
        "inputs": LegInputs(token_ids=_token_ids(args.token_ids)),  # type: ignore[arg-type]
    }
    # parse_step_params returns the step's own params class; the isinstance checks tell mypy.
    if isinstance(params, DecodeParams):
        return build_decode_request(body, params=params, **common)  # type: ignore[arg-type]
    if isinstance(params, PrefillParams):
        return build_prefill_request(body, params=params, **common)  # type: ignore[arg-type]
    if isinstance(params, EncodeParams):
        return build_encode_request(body, params=params, **common)  # type: ignore[arg-type]
    msg = f"--step: {step.value} has no leg to build"  # pragma: no cover - choices exclude it
    raise CliError(msg)  # pragma: no cover


def _params_option(text: str | None) -> dict[str, object]:
    if text is None:
        return {}
    params = _json_option(text, "--params")
    if not isinstance(params, dict):
        msg = f"--params: expected a JSON object of step params, got {describe(params)}"
        raise CliError(msg)
    return params


def _request(args: argparse.Namespace) -> int:
    """Print the leg a router would send for a client body.

    Read a client's JSON body; print the leg's path, then its body.
    """
    leg = _build_leg(args)
    # On stderr, so stdout stays the leg alone: a key the leg cannot carry must not vanish quietly.
    if isinstance(leg, DecodeLeg) and leg.dropped:
        sys.stderr.write(f"{PROG}: dropped from the client's body: {', '.join(leg.dropped)}\n")
    sys.stdout.write(f"POST {leg.path}\n{indented_json(leg.body)}\n")
    return 0


_ENVELOPES: Mapping[str, Callable[..., dict[str, object]]] = {
    "chat": wrap_chat_completion,
    "responses": wrap_responses_response,
    "anthropic": wrap_anthropic_message,
}


def _response(args: argparse.Namespace) -> int:
    """Print the envelope a client gets for a generate response.

    Read a generate response (JSON); print the envelope rebuilt from it.
    """
    response = _read_json(args.file)
    client_body = None if args.client_body is None else _read_json(args.client_body)
    wrap = _ENVELOPES[args.envelope]
    envelope = wrap(response, requested=OutputMode(args.mode), client_body=client_body)
    sys.stdout.write(indented_json(envelope) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Build disaggregated-serving leg bodies for vLLM, and read them back.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = add_command(commands, "demo", _run_demo)
    demo.add_argument("--full", action="store_true", help="also print every body")
    request = add_command(commands, "request", _request)
    request.add_argument("file", help="the client's JSON body, or - for stdin")
    request.add_argument(
        "--path", default="/v1/chat/completions", help="the path the client called"
    )
    request.add_argument(
        "--step", choices=("prefill", "decode", "encode"), default="decode", help="the leg"
    )
    request.add_argument(
        "--params", help='the step\'s params as JSON, e.g. \'{"output_mode": "derender"}\''
    )
    request.add_argument(
        "--token-ids",
        help="the rendered prompt: 1,2,3 or a JSON list, or a file holding a JSON list",
    )
    response = add_command(commands, "response", _response)
    response.add_argument("file", help="the worker's JSON answer, or - for stdin")
    response.add_argument(
        "--mode", choices=("text", "derender"), default="text", help="the requested output_mode"
    )
    response.add_argument("--client-body", help="the client's JSON request (a file)")
    response.add_argument(
        "--envelope", choices=tuple(_ENVELOPES), default="chat", help="the client's API"
    )
    check = add_command(commands, "check-config", _check_config)
    check.add_argument("file", help="the config file, or - for stdin")
    check.add_argument(
        "--format",
        choices=("auto", "json", "yaml"),
        default="auto",
        help="auto (the default): YAML for .yaml/.yml files, JSON otherwise",
    )
    # serve and simulate (the proxy extra) live in their own module.
    from disagg_transforms._cli.serve import add_commands  # noqa: PLC0415 - it imports this one

    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    try:
        args = _parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except (CliError, DisaggTransformError) as error:
        sys.stderr.write(f"{PROG}: error: {_one_line(error)}\n")
        return EXIT_USAGE
