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
from typing import NoReturn

import msgspec

import disagg_transforms

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
from disagg_transforms._cli.config import (
    config_errors,
    one_line,
    parse_document,
    read_config,
    read_json,
    source_name,
)
from disagg_transforms._cli.demo import demo_text, indented_json, params_json
from disagg_transforms._cli.serve import add_commands
from disagg_transforms._coordinator import MIB, coordinator_config_errors, is_coordinator_document
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError, DisaggTransformError

# `--token-ids 1,2,3`: integers and commas only, so it can never be taken for a file name that
# needs reading (docs/cli.md: ./NAME reads a file named like that).
_INLINE_IDS = re.compile(r"\s*-?\d+(\s*,\s*-?\d+)*\s*")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (argparse prints usage and exits itself)."""

    def error(self, message: str) -> NoReturn:
        msg = f"{message} (see: {self.prog} --help)"
        raise CliError(msg)


def _check_config(args: argparse.Namespace) -> int:
    """Validate a pipeline document, or llm-d's coordinator YAML (JSON, or YAML with PyYAML).

    Read this project's pipeline document, {"use_openai_format": <bool, optional>, "steps":
    {"<step>": {...}}}, or llm-d's coordinator YAML (server, gateway, pipeline.steps: a list of
    {type, params}; also inside the Kubernetes ConfigMap that ships it, under
    data.coordinator.yaml). Print what would run, or every error with its key. Exit code 0 when
    valid, 2 when not (docs/llm-d.md).
    """
    source: str = args.file
    document = read_config(source, args.format)
    if is_coordinator_document(document):
        return _check_coordinator(document, source_name(source))
    errors = config_errors(document)
    if not errors and isinstance(document, Mapping):
        try:
            parsed = parse_pipeline_params(
                document["steps"], use_openai_format=document.get("use_openai_format")
            )
        except ConfigError as error:  # a rule spanning keys would surface only here
            errors = [error]
        else:
            _print_steps(parsed)
            name = source_name(source)
            sys.stderr.writelines(
                f"{name}: warning: {line}\n" for line in pipeline_warnings(parsed)
            )
            return 0
    name = source_name(source)
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
    return parse_document(option, "JSON", lambda: msgspec.json.decode(text), msgspec.DecodeError)


def _token_ids(value: str | None) -> object:
    """``--token-ids``: ``1,2,3`` or a JSON list given inline, or the name of a file holding one."""
    if value is None:
        return None
    if _INLINE_IDS.fullmatch(value):
        return [int(item) for item in value.split(",")]
    if value.lstrip().startswith("["):
        return _json_option(value, "--token-ids")
    return read_json(value)


def _build_leg(args: argparse.Namespace) -> Leg:
    body: object = read_json(args.file)
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
    response = read_json(args.file)
    client_body = None if args.client_body is None else read_json(args.client_body)
    wrap = _ENVELOPES[args.envelope]
    envelope = wrap(response, requested=OutputMode(args.mode), client_body=client_body)
    sys.stdout.write(indented_json(envelope) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Build disaggregated-serving leg bodies for vLLM, and read them back; serve "
        "the reference proxy in front of vLLM workers, alone or in llm-d's seats. check-config "
        "and serve --config read this project's pipeline document or llm-d's coordinator YAML.",
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {disagg_transforms.__version__}"
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
    add_commands(commands)  # serve and simulate (the proxy extra), in their own module
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    try:
        args = _parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except (CliError, DisaggTransformError) as error:
        sys.stderr.write(f"{PROG}: error: {one_line(error)}\n")
        return EXIT_USAGE
