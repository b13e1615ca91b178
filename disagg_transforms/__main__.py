"""Command line: ``python -m disagg_transforms`` (also the ``disagg-transforms`` script).

``demo`` shows what the library does; ``check-config FILE|-`` validates a router's step params.
The command line may read files and stdin (the library itself never does); every failure is one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec
import orjson

from disagg_transforms._describe import describe
from disagg_transforms.config import Step, StepParams, parse_pipeline_params, parse_step_params
from disagg_transforms.errors import ConfigError
from disagg_transforms.routes import Route, resolve_format

_PROG = "disagg-transforms"
_STDIN = "-"
_EXIT_USAGE = 2
_TOP_LEVEL_KEYS = ("steps", "use_openai_format")


class _CliError(Exception):
    """A failure reported as one line on stderr with exit code 2."""


def _heading(text: str) -> str:
    return f"\n{text}\n{'=' * len(text)}"


def _params_json(params: StepParams) -> str:
    return msgspec.json.encode(msgspec.structs.asdict(params)).decode()


def _demo() -> str:
    lines = [_heading("Where each leg goes (resolve_format)")]
    lines.append(f"{'client route':<24} {'use_openai_format=true':<26} use_openai_format=false")
    lines.extend(
        f"{route.value:<24} {resolve_format(True, route.value).value:<26} "  # noqa: FBT003
        f"{resolve_format(False, route.value).value}"  # noqa: FBT003
        for route in Route
    )
    lines.append(_heading("Step defaults (parse_step_params with no keys)"))
    lines.extend(
        f"{step.value:<20} {_params_json(parse_step_params(step.value, {}))}" for step in Step
    )
    return "\n".join(lines)


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
        raise _CliError(msg) from None


def _decode(
    source: str, kind: str, loads: Callable[[bytes], object], errors: type[Exception]
) -> object:
    data = _read_bytes(source)
    try:
        return loads(data)
    except errors as exc:
        msg = f"{_source_name(source)}: not valid {kind}: {_one_line(exc)}"
        raise _CliError(msg) from None


def _read_json(source: str) -> object:
    """Parse the JSON document in a file or on stdin (``-``); a failure is a `_CliError`."""
    return _decode(source, "JSON", orjson.loads, orjson.JSONDecodeError)


def _read_yaml(source: str) -> object:
    try:
        import yaml  # noqa: PLC0415 - optional: only this command, and only for YAML, needs it
    except ImportError:
        msg = (
            f"{_source_name(source)}: reading YAML needs PyYAML (pip install pyyaml); "
            "or give the config as JSON"
        )
        raise _CliError(msg) from None
    return _decode(source, "YAML", yaml.safe_load, yaml.YAMLError)


def _read_config(source: str, fmt: str) -> object:
    if fmt == "auto":
        fmt = "yaml" if Path(source).suffix.lower() in {".yaml", ".yml"} else "json"
    return _read_yaml(source) if fmt == "yaml" else _read_json(source)


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
    source: str = args.file
    document = _read_config(source, args.format)
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
            return 0
    name = _source_name(source)
    sys.stderr.writelines(f"{name}: {error.message}\n" for error in errors)
    return _EXIT_USAGE


def _print_steps(parsed: Mapping[Step, StepParams]) -> None:
    lines = [f"{step.value:<20} {_params_json(params)}" for step, params in parsed.items()]
    sys.stdout.write("\n".join(["valid", *lines]) + "\n")


def _run_demo(_args: argparse.Namespace) -> int:
    sys.stdout.write(_demo() + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Build disaggregated-serving leg bodies for vLLM, and read them back.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="show routes and step defaults")
    demo.set_defaults(handler=_run_demo)
    check = commands.add_parser(
        "check-config",
        help="validate a pipeline's step params (JSON, or YAML with PyYAML)",
        description=(
            'Validate {"use_openai_format": <bool, optional>, "steps": {"<step>": {...}}} and '
            "print every error with its key. Exit code 0 when valid, 2 when not."
        ),
    )
    check.add_argument("file", help="the config file, or - for stdin")
    check.add_argument(
        "--format",
        choices=("auto", "json", "yaml"),
        default="auto",
        help="auto (the default): YAML for .yaml/.yml files, JSON otherwise",
    )
    check.set_defaults(handler=_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except _CliError as error:
        sys.stderr.write(f"{_PROG}: error: {error}\n")
        return _EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
