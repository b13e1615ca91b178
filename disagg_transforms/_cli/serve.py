"""``serve`` (the reference proxy) and ``simulate`` (one simulated worker): see docs/proxy.md.

Only argparse is imported here at first: starlette, uvicorn and aiohttp (the ``proxy`` extra) are
imported when one of these commands runs, so the other commands work without them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Container, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from disagg_transforms._cli.commands import EXIT_USAGE, PROG, CliError, add_command
from disagg_transforms._cli.config import config_errors, engine_settings, read_config
from disagg_transforms._config import DecodeParams, Step, StepParams, parse_pipeline_params
from disagg_transforms._coordinator import (
    KvConnector,
    coordinator_config_errors,
    is_coordinator_document,
    parse_coordinator_config,
    unsubstituted,
)
from disagg_transforms._wire.limits import DEFAULT_LIMITS

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send
    from uvicorn.supervisors import Multiprocess

    from disagg_transforms.integrations.proxy import SidecarSeat

_ParserT = TypeVar("_ParserT", bound=argparse.ArgumentParser)

# The settings travel to uvicorn's worker processes (``--workers N``), which build the app from
# an import string: the parent writes them here, the factory reads them back.
_SETTINGS = "DISAGG_TRANSFORMS_SERVE_SETTINGS"
_FACTORY = "disagg_transforms._cli.serve:app_from_settings"
_SIMULATED = "/simulated"  # where ``serve --simulate`` mounts its worker on its own server
# prometheus_client's multiprocess mode: every server process writes its metrics there.
_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
_STEP_URLS = ("render", "encode", "prefill", "decode")
_URLS = (*_STEP_URLS, "gateway")
# The coordinator document's keys for the URLs it may give, as a user reads them.
_DOCUMENT_KEYS: Mapping[str, str] = {
    "gateway.address": "gateway",
    "the render step's address": "render",
}
# The process settings a coordinator document may give; a flag wins over both.
_PROCESS_DEFAULTS: Mapping[str, Any] = {
    "host": "127.0.0.1",
    "port": 8000,
    "first_byte_timeout": 300.0,
    "max_body_bytes": DEFAULT_LIMITS.max_body_bytes,
    "drain_timeout": 60,
}
# The coordinator's "0s" first-byte timeout, no limit: a year stands in for it.
_NO_LIMIT = 365 * 24 * 3600.0
# llm-d's sidecar reads the prefill's bootstrap port from here (docs/sglang.md).
_SGLANG_PORT_ENV = "SGLANG_BOOTSTRAP_PORT"


def add_commands(commands: argparse._SubParsersAction[_ParserT]) -> None:
    """Add ``serve`` and ``simulate`` to the command line's subcommands."""
    serve = add_command(commands, "serve", _serve)
    serve.add_argument(
        "--config",
        help="the pipeline document check-config reads (or llm-d's coordinator YAML, alone or "
        "in the Kubernetes ConfigMap that ships it)",
    )
    for step in _STEP_URLS:
        serve.add_argument(f"--{step}-url", help=f"the {step} worker's base URL")
    serve.add_argument(
        "--gateway-url",
        help="llm-d's gateway: every encode, prefill and decode leg goes there with its "
        "EPP-Profile header (give no other worker URL but --render-url)",
    )
    serve.add_argument(
        "--prefill-from-header",
        action="store_true",
        help="llm-d's sidecar seat: each request's prefill worker is the one its "
        "x-prefiller-host-port header names (none: decode only), its encode worker the first of "
        "x-encoder-hosts-ports; decode goes to --decode-url",
    )
    serve.add_argument(
        "--allowed-worker-hosts",
        metavar="LIST",
        help="with --prefill-from-header: the only hosts a request may name (comma-separated "
        "IP addresses, CIDRs, host names as written); any other is refused with 403",
    )
    serve.add_argument(
        "--enable-prefiller-sampling",
        action="store_true",
        help="with --prefill-from-header: a random entry of x-prefiller-host-port's list gets "
        "the prefill, not the first (as llm-d's sidecar flag)",
    )
    serve.add_argument(
        "--simulate",
        action="store_true",
        help="call a simulated vLLM worker served by this same server (no URLs)",
    )
    serve.add_argument(
        "--vllm-version",
        type=_vllm_version,
        metavar="X.Y.Z",
        help="the workers' vLLM release (default: the config document's vllm_version, else "
        "the decode worker's GET /version at startup); with --simulate, the release it plays",
    )
    _add_served_model_name(serve, "with --simulate: ")
    serve.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        help="the workers' engine (default: the config document's engine, else vllm); with "
        "sglang, prefill and decode are sent together and --render-url names a vLLM render "
        "worker (docs/sglang.md)",
    )
    serve.add_argument(
        "--kv-connector",
        choices=("nixlv2", "sglang"),
        help="with --prefill-from-header: llm-d's sidecar flag; sglang is --engine sglang, the "
        "bootstrap port from SGLANG_BOOTSTRAP_PORT (default 8998) as the sidecar reads it "
        "(default: nixlv2, vLLM's hand-off)",
    )
    serve.add_argument(
        "--sglang-bootstrap-port",
        type=_port,
        metavar="N",
        help="with --engine sglang: the prefill workers' bootstrap port (default: the config "
        "document's sglang.bootstrap_port, else 8998)",
    )
    serve.add_argument(
        "--sglang-stream-output",
        choices=("cumulative", "incremental"),
        help="with --engine sglang: the workers stream the whole text in every event "
        "(cumulative, SGLang's default) or deltas (incremental: --incremental-streaming-output) "
        "(default: the config document's sglang.stream_output, else cumulative)",
    )
    # The flags below without a default here take the coordinator document's value, else theirs
    # (_PROCESS_DEFAULTS).
    serve.add_argument(
        "--host",
        help="the address to listen on (default: 127.0.0.1, or a coordinator document's "
        "server.listen_addr)",
    )
    serve.add_argument(
        "--port",
        type=int,
        help="0 picks a free port (default: 8000, or a coordinator document's server.listen_addr)",
    )
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="server processes (default: %(default)s)",
    )
    serve.add_argument(
        "--connect-timeout", type=_seconds, default=5.0, help="seconds (default: %(default)g)"
    )
    serve.add_argument(
        "--first-byte-timeout",
        type=_seconds,
        help="seconds to a whole answer or a stream's first chunk (default: 300, or a "
        "coordinator document's gateway.timeout)",
    )
    serve.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=60.0,
        help="seconds between two chunks of a worker stream (default: %(default)g)",
    )
    serve.add_argument(
        "--keep-alive",
        type=int,
        default=75,
        help="seconds an idle client connection stays open (default: %(default)s)",
    )
    serve.add_argument(
        "--worker-keep-alive",
        type=_seconds,
        default=2.0,
        help="seconds an idle pooled worker connection stays open (default: %(default)g)",
    )
    serve.add_argument(
        "--prefill-max-retries",
        type=_count,
        default=0,
        metavar="N",
        help="retries of a prefill that failed with 502, 503, 504 or in transport "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        help=f"largest client body; a larger one is 413 (default: "
        f"{DEFAULT_LIMITS.max_body_bytes}, or a coordinator document's "
        "server.max_request_body_size)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=int,
        help="seconds SIGTERM waits for replies in flight (default: 60, or a coordinator "
        "document's server.shutdown_timeout)",
    )
    simulate = add_command(commands, "simulate", _simulate)
    simulate.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    simulate.add_argument(
        "--port", type=int, default=8100, help="0 picks a free port (default: %(default)s)"
    )
    simulate.add_argument(
        "--fault", help="a fault for every request (x-simulate-fault modes; default: none)"
    )
    simulate.add_argument(
        "--stream-delay",
        type=_seconds,
        default=0.0,
        help="seconds between stream events (default: %(default)s)",
    )
    simulate.add_argument(
        "--first-byte-delay",
        type=_seconds,
        default=0.5,
        help="seconds the slow-first-byte fault waits (default: %(default)s)",
    )
    simulate.add_argument(
        "--fault-calls",
        type=_count,
        metavar="N",
        help="--fault plays on the first N requests only (default: on every request)",
    )
    simulate.add_argument(
        "--gateway",
        action="store_true",
        help="a simulated llm-d gateway: pools of workers chosen by the EPP-Profile header",
    )
    simulate.add_argument(
        "--pool-size",
        type=_positive_int,
        default=1,
        help="with --gateway: workers per pool (default: %(default)s)",
    )
    simulate.add_argument(
        "--routing",
        choices=("round-robin", "hash"),
        default="round-robin",
        help="with --gateway: how a pool's worker is chosen (default: %(default)s)",
    )
    simulate.add_argument(
        "--log-calls",
        action="store_true",
        help="log each request received on stderr: 'call ' and a JSON object (method, path, "
        "headers, body)",
    )
    _add_served_model_name(simulate)
    simulate.add_argument(
        "--vllm-version",
        type=_vllm_version,
        default="0.33.0",
        metavar="X.Y.Z",
        help="the vLLM release played: GET /version answers it; before 0.33 the generate route "
        "refuses output_mode derender as vLLM 0.32 does (default 0.33.0)",
    )
    simulate.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="as vLLM's flag: a prefill's usage reports its cached prompt tokens",
    )
    simulate.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        default="vllm",
        help="the engine simulated: vLLM 0.33 (default) or SGLang 0.5.23 (docs/sglang.md)",
    )
    simulate.add_argument(
        "--disaggregation-mode",
        choices=("prefill", "decode"),
        help="with --engine sglang: the worker's P/D role (default: none)",
    )
    simulate.add_argument(
        "--bootstrap-port",
        type=_count,
        default=8998,
        help="with --engine sglang: the prefill's bootstrap port, where decodes join their "
        "rooms (a decode's default for a request without one); 0 picks a free port",
    )
    simulate.add_argument(
        "--transfer-timeout",
        type=_seconds,
        default=300.0,
        help="with --engine sglang: seconds a leg waits for its peer's room (SGLang's 300)",
    )
    simulate.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="with --engine sglang: stream deltas, not the whole text in every event",
    )


def _add_served_model_name(parser: argparse.ArgumentParser, when: str = "") -> None:
    # As vLLM takes it: one or more names after the flag (the flag may also be repeated).
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        action="extend",
        metavar="NAME",
        help=f"{when}the model names the simulated worker serves (default: any name)",
    )


def _count(text: str, minimum: int = 0) -> int:
    value = int(text)
    if value < minimum:
        expected = "a positive integer" if minimum else "0 or more"
        msg = f"expected {expected}, got {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _vllm_version(text: str) -> str:
    from disagg_transforms import ConfigError, validate_vllm_version  # noqa: PLC0415

    try:
        return validate_vllm_version(text)
    except ConfigError:
        msg = f"expected a vLLM release such as 0.32.0, got {text}"
        raise argparse.ArgumentTypeError(msg) from None


def _port(text: str) -> int:
    port = _positive_int(text)
    if port > 65535:
        msg = f"expected a port in 1..65535, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return port


def _llm_d_names_sglang(
    args: argparse.Namespace, document: Mapping[str, Any], urls: Mapping[str, str | None]
) -> bool | str:
    """Whether llm-d's settings name SGLang workers, else what stops it.

    llm-d names them by the sidecar's ``--kv-connector sglang`` or the coordinator's kv-sglang.
    """
    kv_sglang = (
        is_coordinator_document(document)
        and parse_coordinator_config(document).kv_connector is KvConnector.SGLANG
    )
    if kv_sglang and args.engine == "vllm":
        return "pipeline.kv_connector: kv-sglang runs SGLang workers, not --engine vllm"
    if kv_sglang and urls["gateway"] is not None:
        return (
            "pipeline.kv_connector: kv-sglang needs each prefill worker's host for SGLang's "
            "rendezvous, which a gateway picks: give --prefill-url and --decode-url, or run the "
            "sidecar seat (docs/sglang.md)"
        )
    return args.kv_connector == "sglang" or kv_sglang


def _engine(
    args: argparse.Namespace, document: Mapping[str, Any], urls: Mapping[str, str | None]
) -> dict[str, Any] | str:
    """The workers' engine and its settings, the flags over the document's; else what stops it."""
    from disagg_transforms import SglangSettings  # noqa: PLC0415

    engine, sglang = engine_settings(document)  # config_errors checked it
    llm_d = _llm_d_names_sglang(args, document, urls)
    if isinstance(llm_d, str):
        return llm_d
    name = "sglang" if llm_d else args.engine or engine.value
    flags = [
        flag
        for flag, value in (
            ("--sglang-bootstrap-port", args.sglang_bootstrap_port),
            ("--sglang-stream-output", args.sglang_stream_output),
        )
        if value is not None
    ]
    if name != "sglang":
        return f"{flags[0]}: needs --engine sglang" if flags else {"engine": name}
    if args.simulate:
        return "--simulate plays a vLLM worker: run `disagg-transforms simulate --engine sglang`"
    decode = _parsed(document).get(Step.DECODE)
    token_route = isinstance(decode, DecodeParams) and not decode.use_openai_format
    if urls["render"] is None and token_route:
        return (
            "--render-url: SGLang workers do not render a chat, Responses or Messages request: "
            "give a vLLM render worker's URL (docs/sglang.md)"
        )
    port = args.sglang_bootstrap_port
    if port is None and llm_d and (given := os.environ.get(_SGLANG_PORT_ENV)):
        try:
            port = _port(given)
        except argparse.ArgumentTypeError as error:
            return f"{_SGLANG_PORT_ENV}: {error}"
    sglang = SglangSettings(
        bootstrap_port=port or sglang.bootstrap_port,
        stream_output=args.sglang_stream_output or sglang.stream_output,
    )
    chosen = {"bootstrap_port": sglang.bootstrap_port, "stream_output": sglang.stream_output}
    return {"engine": name, "sglang": chosen}


def _positive_int(text: str) -> int:
    return _count(text, minimum=1)


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        msg = f"expected a number of seconds, got {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _need_the_extra() -> None:
    """A one-line error, not a traceback, when the proxy extra is not installed."""
    for module in ("aiohttp", "starlette", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            msg = f"this command needs {module}: pip install 'disagg_transforms[proxy]'"
            raise CliError(msg)


def _default_document(*, prefill: bool) -> dict[str, Any]:
    steps: dict[str, Any] = {"decode": {"output_mode": "auto", "wrap_chat_completion": True}}
    if prefill:
        steps = {"prefill": {}, **steps}
    return {"use_openai_format": False, "steps": steps}


# The sidecar seat's default, as llm-d's sidecar: prefill and decode on the client's own route.
_SIDECAR_DOCUMENT: Mapping[str, Any] = {
    "use_openai_format": True,
    "steps": {"prefill": {}, "decode": {}},
}


def _sidecar_problems(args: argparse.Namespace) -> list[str]:
    """What stops the sidecar seat's flags, one line each (``--allowed-worker-hosts`` read)."""
    from disagg_transforms.errors import ConfigError  # noqa: PLC0415
    from disagg_transforms.integrations.sidecar import WorkerHosts  # noqa: PLC0415

    seat_flags = [
        flag
        for flag, given in (
            ("--allowed-worker-hosts", args.allowed_worker_hosts is not None),
            ("--enable-prefiller-sampling", args.enable_prefiller_sampling),
            ("--kv-connector", args.kv_connector is not None),
        )
        if given
    ]
    if seat_flags and not args.prefill_from_header:
        return [f"{seat_flags[0]}: requests name no worker without --prefill-from-header"]
    if args.kv_connector == "sglang" and args.engine == "vllm":
        return ["--kv-connector sglang: the workers are SGLang's, not --engine vllm"]
    if args.prefill_from_header and args.simulate:
        return ["--prefill-from-header: the headers name real workers; give no --simulate"]
    if args.allowed_worker_hosts is None:
        return []
    try:
        WorkerHosts(args.allowed_worker_hosts)
    except ConfigError as error:
        return [f"--allowed-worker-hosts: {error.message}"]
    return []


def _take_document_urls(
    urls: dict[str, str | None], given: dict[str, Any], args: argparse.Namespace
) -> list[str]:
    """Fill ``urls`` the command line left empty from the document's; what stops ``serve``."""
    document_urls: dict[str, str | None] = given.pop("urls", {})
    if args.prefill_from_header and document_urls.get("gateway") is not None:
        # Named as the document's key: once merged it would be refused as --gateway-url.
        return ["gateway.address: the sidecar seat takes no gateway (the headers name the workers)"]
    named = [key for key, url in _DOCUMENT_KEYS.items() if document_urls.get(url) is not None]
    if args.simulate and named:
        # Never ignore what the document names: a laptop runs the gateway simulated instead.
        line = (
            f"{', '.join(named)}: --simulate would call its own worker, not the servers the "
            "document names; run `disagg-transforms simulate --gateway` and give its URL "
            "there (docs/llm-d.md, on a laptop)"
        )
        return [line]
    for key, url in document_urls.items():
        urls[key] = urls[key] or url
    return []


def _flag_urls(args: argparse.Namespace) -> dict[str, str | None]:
    """The worker URLs the command line gives, each one ``serve`` could call."""
    urls: dict[str, str | None] = {step: getattr(args, f"{step}_url") for step in _URLS}
    if args.simulate and any(urls.values()):
        msg = "--simulate calls its own simulated worker: give no worker URL with it"
        raise CliError(msg)
    for step, url in urls.items():
        if url is not None and (problem := unsubstituted(url)):
            msg = f"--{step}-url: {problem}"
            raise CliError(msg)
    return urls


def _document(args: argparse.Namespace, urls: Mapping[str, str | None]) -> tuple[object, str]:
    """The pipeline document ``serve`` runs (``--config``'s, or the seat's default) and its name."""
    if args.config is not None:
        return read_config(args.config, "auto"), args.config
    if args.prefill_from_header:
        return dict(_SIDECAR_DOCUMENT), "<default config>"
    # Gateway mode runs prefill as llm-d's coordinator does: the gateway has the pools.
    prefill = args.simulate or bool(urls["prefill"] or urls["gateway"])
    return _default_document(prefill=prefill), "<default config>"


def _serve(args: argparse.Namespace) -> int:
    """Run the reference proxy (needs the proxy extra).

    Serve the five client routes, calling vLLM workers through the exchange.
    """
    _need_the_extra()
    urls = _flag_urls(args)
    if args.served_model_name and not args.simulate:
        msg = "--served-model-name names the simulated worker's models: give it with --simulate"
        raise CliError(msg)
    if problems := _sidecar_problems(args):
        sys.stderr.writelines(f"{PROG}: error: {line}\n" for line in problems)
        return EXIT_USAGE
    document, source = _document(args, urls)
    coordinator = is_coordinator_document(document)
    errors = coordinator_config_errors(document) if coordinator else config_errors(document)
    problems = [f"{source}: {error.message}" for error in errors]
    if problems:
        sys.stderr.writelines(line + "\n" for line in problems)
        return EXIT_USAGE
    assert isinstance(document, Mapping)  # noqa: S101 - config_errors refuses anything else
    given = _document_settings(document) if coordinator else {}
    if problems := _take_document_urls(urls, given, args):
        sys.stderr.writelines(f"{source}: {line}\n" for line in problems)
        return EXIT_USAGE
    process = {
        key: value if (value := getattr(args, key)) is not None else given.get(key, default)
        for key, default in _PROCESS_DEFAULTS.items()
    }
    sys.stderr.writelines(f"{source}: warning: {line}\n" for line in given.get("warnings", ()))
    # A Step is the str of its name: either mapping answers "prefill" in steps.
    steps = parse_coordinator_config(document).pipeline if coordinator else document["steps"]
    engine = _engine(args, document, urls)
    if isinstance(engine, str):
        sys.stderr.write(f"{PROG}: error: {engine}\n")
        return EXIT_USAGE
    if args.simulate:  # the port is the one asked for until the socket is bound
        urls = _simulated_urls(process["host"], process["port"], steps)
    settings = {
        **engine,
        "document": document,
        "urls": urls,
        "simulate": args.simulate,
        "served_model_names": args.served_model_name or [],
        "timeouts": {
            "connect": args.connect_timeout,
            "first_byte": process["first_byte_timeout"],
            "idle": args.idle_timeout,
        },
        "worker_keep_alive": args.worker_keep_alive,
        "max_body_bytes": process["max_body_bytes"],
        "connectors": given.get("connectors", {}),
        "prefill_max_retries": args.prefill_max_retries,
        "render_first": given.get("render_first", False),  # a coordinator document's order
        # The sidecar seat (the allow-list as written, "" for none), else None.
        "sidecar": {
            "allowed_worker_hosts": args.allowed_worker_hosts or "",
            "prefiller_sampling": args.enable_prefiller_sampling,
        }
        if args.prefill_from_header
        else None,
    }
    with _metrics_dir():  # before the proxy, and so prometheus_client, is imported
        # What the user must fix in the command comes before what the machine says of the port.
        config, warnings, problems = _pipeline(settings)
        version = args.vllm_version or document.get("vllm_version")
        problems = problems or _version_problems(config, settings, version)
        if problems:
            sys.stderr.writelines(f"{PROG}: error: {line}\n" for line in problems)
            return EXIT_USAGE
        sock = _bind(process["host"], process["port"])
        if args.simulate:
            settings["urls"] = _simulated_urls(process["host"], sock.getsockname()[1], steps)
        sys.stderr.writelines(f"{source}: warning: {line}\n" for line in warnings)
        os.environ[_SETTINGS] = orjson.dumps(settings).decode()
        drain = math.ceil(process["drain_timeout"])
        _run(_FACTORY, sock, workers=args.workers, drain=drain, keep_alive=args.keep_alive)
    return 0


def _version_problems(
    config: Mapping[Step, StepParams], settings: dict[str, Any], version: str | None
) -> list[str]:
    """Learn the workers' vLLM release into ``settings``; what it cannot serve, one line each.

    Given (``--vllm-version``, the document's ``vllm_version``), else, when decode speaks the
    generate route, the render worker's ``GET /version`` now (the decode URL's by default; in
    gateway mode never the gateway's); a worker that does not answer yet is asked by the proxy
    before its first request (docs/proxy.md, "vLLM versions"). ``--simulate`` plays the release
    given, by default the newest.
    """
    from disagg_transforms import version_errors  # noqa: PLC0415
    from disagg_transforms.integrations.proxy import worker_vllm_version  # noqa: PLC0415

    decode = config.get(Step.DECODE)
    generate = isinstance(decode, DecodeParams) and not decode.use_openai_format
    if version is None and generate and not settings["simulate"]:
        urls = settings["urls"]
        version = worker_vllm_version(urls["render"] or urls["decode"])
        settings["probe_vllm_version"] = version is None
    settings["vllm_version"] = version
    return [] if version is None else [e.message for e in version_errors(config, version)]


def _simulated_urls(host: str, port: int, steps: Container[str]) -> dict[str, str | None]:
    """``serve --simulate``'s worker URLs: its own server, for each step the pipeline has."""
    base = f"http://{_reachable(host)}:{port}{_SIMULATED}"
    return {step: base if step == "decode" or step in steps else None for step in _URLS}


@contextlib.contextmanager
def _metrics_dir() -> Iterator[None]:
    """Where the server's processes write their metrics for ``/metrics`` to sum (docs/proxy.md).

    The user's ``PROMETHEUS_MULTIPROC_DIR`` when set (theirs to empty between runs), else a
    fresh directory, removed at exit.
    """
    if os.environ.get(_METRICS_DIR):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="disagg-transforms-metrics-") as path:
        os.environ[_METRICS_DIR] = path
        try:
            yield
        finally:
            del os.environ[_METRICS_DIR]


def _pipeline(settings: Mapping[str, Any]) -> tuple[Any, list[str], list[str]]:
    """The parsed pipeline, its warnings, and every problem (one line each) that stops it."""
    from disagg_transforms import ConfigError  # noqa: PLC0415
    from disagg_transforms.exchange import pipeline_warnings  # noqa: PLC0415
    from disagg_transforms.integrations.proxy import sidecar_errors, url_errors  # noqa: PLC0415

    try:
        config = _parsed(settings["document"])
    except ConfigError as error:  # a rule spanning keys would surface only here
        return None, [], [error.message]
    check = url_errors if settings["sidecar"] is None else sidecar_errors
    errors = check(config, **_url_arguments(settings))
    return config, pipeline_warnings(config), [error.message for error in errors]


def _parsed(document: Mapping[str, Any]) -> Mapping[Step, StepParams]:
    """The pipeline of the project's own document or of llm-d's coordinator document."""
    if is_coordinator_document(document):
        return parse_coordinator_config(document).pipeline
    return parse_pipeline_params(
        document["steps"], use_openai_format=document.get("use_openai_format")
    )


def _document_settings(document: Mapping[str, Any]) -> dict[str, Any]:
    """What a coordinator document sets beside its pipeline, as serve's settings."""
    config = parse_coordinator_config(document)
    first_byte = config.first_byte_timeout
    return {
        "urls": {"gateway": config.gateway_url, "render": config.render_url},
        "host": config.host,
        "port": config.port,
        "max_body_bytes": config.max_request_body_bytes,
        "first_byte_timeout": _NO_LIMIT if first_byte is None else first_byte,
        "drain_timeout": config.drain_timeout,
        "connectors": {
            "kv_connector": config.kv_connector.value,
            "ec_connector": config.ec_connector.value,
        },
        "warnings": config.warnings,
        "render_first": config.render_first,
    }


def _url_arguments(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings' worker URLs as ``url_errors`` and ``create_app`` take them (``decode_url``)."""
    return {f"{step}_url": settings["urls"][step] for step in _URLS}


def app_from_settings() -> ASGIApp:
    """The proxy app of the settings ``serve`` wrote: uvicorn's factory, in every process."""
    from disagg_transforms import (  # noqa: PLC0415
        EcConnector,
        Engine,
        Limits,
        SglangSettings,
    )
    from disagg_transforms.integrations.proxy import Timeouts, create_app  # noqa: PLC0415

    _configure_logging()
    settings = orjson.loads(os.environ[_SETTINGS])
    config, _, _ = _pipeline(settings)  # the parent checked it before starting the server
    connectors = settings["connectors"]  # a coordinator document's; else the exchange's default
    app = create_app(
        config,
        **_url_arguments(settings),
        timeouts=Timeouts(**settings["timeouts"]),
        limits=Limits(max_body_bytes=settings["max_body_bytes"]),
        worker_keep_alive=settings["worker_keep_alive"],
        kv_connector=KvConnector(connectors.get("kv_connector", KvConnector.NIXL)),
        ec_connector=EcConnector(connectors.get("ec_connector", EcConnector.NIXL)),
        prefill_max_retries=settings["prefill_max_retries"],
        sidecar=_sidecar_seat(settings["sidecar"]),
        render_first=settings["render_first"],
        vllm_version=settings["vllm_version"],
        probe_vllm_version=settings.get("probe_vllm_version", False),
        engine=Engine(settings["engine"]),
        sglang=SglangSettings(**settings.get("sglang", {})),
    )
    if not settings["simulate"]:
        return app
    return _WithSimulated(app, _simulated_worker(settings))


def _sidecar_seat(settings: Mapping[str, Any] | None) -> SidecarSeat | None:
    """The sidecar seat of serve's settings (``None``: not that seat)."""
    from disagg_transforms.integrations.proxy import SidecarSeat  # noqa: PLC0415
    from disagg_transforms.integrations.sidecar import WorkerHosts  # noqa: PLC0415

    if settings is None:
        return None
    hosts = settings["allowed_worker_hosts"]
    return SidecarSeat(
        WorkerHosts(hosts) if hosts else None, prefiller_sampling=settings["prefiller_sampling"]
    )


class _WithSimulated:
    """The proxy, with a simulated worker answering under ``/simulated`` on the same server."""

    def __init__(self, proxy: ASGIApp, worker: ASGIApp) -> None:
        self._proxy = proxy
        self._worker = worker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(_SIMULATED + "/"):
            scope = {**scope, "path": path[len(_SIMULATED) :]}
            await self._worker(scope, receive, send)
            return
        await self._proxy(scope, receive, send)


def _simulate(args: argparse.Namespace) -> int:
    """Run one simulated vLLM 0.33 worker, or a simulated llm-d gateway (needs the proxy extra).

    Serve disagg_transforms.testing.SimulatedWorker, or with --gateway a SimulatedGateway:
    pools of simulated workers chosen by each call's EPP-Profile header (docs/testing.md).
    With --engine sglang, a SimulatedSglangWorker in one P/D role (docs/sglang.md).
    """
    from disagg_transforms.testing import FAULT_MODES  # noqa: PLC0415

    _need_the_extra()
    if args.engine == "sglang":
        return _simulate_sglang(args)
    if args.fault is not None and args.fault not in FAULT_MODES:
        msg = f"--fault: unknown fault {args.fault!r}; expected one of {', '.join(FAULT_MODES)}"
        raise CliError(msg)
    if args.gateway and (args.fault is not None or args.log_calls):
        msg = "--fault and --log-calls play on one worker: give neither with --gateway"
        raise CliError(msg)
    if args.disaggregation_mode is not None or args.incremental_streaming_output:
        msg = "--disaggregation-mode and --incremental-streaming-output need --engine sglang"
        raise CliError(msg)
    settings = {
        "fault": args.fault,
        "fault_calls": args.fault_calls,
        "stream_delay": args.stream_delay,
        "first_byte_delay": args.first_byte_delay,
        "served_model_names": args.served_model_name or [],
        "prompt_tokens_details": args.enable_prompt_tokens_details,
        "gateway": args.gateway,
        "pool_size": args.pool_size,
        "routing": args.routing,
        "log_calls": args.log_calls,
        "vllm_version": args.vllm_version,
    }
    os.environ[_SETTINGS] = orjson.dumps(settings).decode()
    _run(
        "disagg_transforms._cli.serve:worker_from_settings",
        _bind(args.host, args.port),
        workers=1,
        drain=5,
    )
    return 0


def _simulate_sglang(args: argparse.Namespace) -> int:
    """``simulate --engine sglang``: one simulated SGLang worker; a prefill on two ports."""
    from disagg_transforms.testing import SGLANG_FAULT_MODES  # noqa: PLC0415

    if args.gateway:
        msg = "--gateway simulates llm-d's gateway over vLLM workers: not with --engine sglang"
        raise CliError(msg)
    if args.fault is not None and args.fault not in SGLANG_FAULT_MODES:
        modes = ", ".join(SGLANG_FAULT_MODES)
        msg = f"--fault: unknown SGLang fault {args.fault!r}; expected one of {modes}"
        raise CliError(msg)
    sock = _bind(args.host, args.port)
    extra = []
    bootstrap_port = args.bootstrap_port
    if args.disaggregation_mode == "prefill":
        bootstrap = _bind(args.host, bootstrap_port)
        bootstrap_port = bootstrap.getsockname()[1]
        extra.append(bootstrap)
    settings = {
        "engine": "sglang",
        "fault": args.fault,
        "disaggregation_mode": args.disaggregation_mode,
        "bootstrap_port": bootstrap_port,
        "transfer_timeout": args.transfer_timeout,
        "incremental_streaming_output": args.incremental_streaming_output,
        "stream_delay": args.stream_delay,
        "served_model_names": args.served_model_name or [],
    }
    os.environ[_SETTINGS] = orjson.dumps(settings).decode()
    _run("disagg_transforms._cli.serve:worker_from_settings", sock, workers=1, drain=5, extra=extra)
    return 0


def worker_from_settings() -> ASGIApp:
    """The simulated worker or gateway ``simulate`` serves (uvicorn's factory)."""
    _configure_logging()
    return _simulated_worker(orjson.loads(os.environ[_SETTINGS]))


def _simulated_worker(settings: Mapping[str, Any]) -> ASGIApp:
    """The simulated worker (or gateway) of ``simulate``'s or ``serve --simulate``'s settings."""
    from disagg_transforms.testing import (  # noqa: PLC0415
        SimulatedGateway,
        SimulatedWorker,
        WorkerSettings,
    )

    worker = WorkerSettings(
        served_model_names=tuple(settings["served_model_names"]),
        prompt_tokens_details=settings.get("prompt_tokens_details", False),
        vllm_version=settings.get("vllm_version") or "0.33.0",
    )
    stream_delay = settings.get("stream_delay", 0.0)
    if settings.get("engine") == "sglang":
        from disagg_transforms.testing import SimulatedSglangWorker  # noqa: PLC0415

        return SimulatedSglangWorker(
            worker,
            disaggregation_mode=settings["disaggregation_mode"],
            bootstrap_port=settings["bootstrap_port"],
            transfer_timeout=settings["transfer_timeout"],
            incremental_streaming_output=settings["incremental_streaming_output"],
            stream_delay=stream_delay,
            fault=settings["fault"],
        )
    if settings.get("gateway"):
        return SimulatedGateway(
            worker,
            pool_size=settings["pool_size"],
            routing=settings["routing"],
            stream_delay=stream_delay,
        )
    return SimulatedWorker(
        worker,
        fault=settings.get("fault"),
        stream_delay=stream_delay,
        first_byte_delay=settings.get("first_byte_delay", 0.5),
        fault_calls=settings.get("fault_calls"),
        log_calls=settings.get("log_calls", False),
    )


def _reachable(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it every keep-alive answer waits 40 ms for a delayed ACK.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {error.strerror or error}"
        raise CliError(msg) from None
    sock.set_inheritable(True)
    return sock


def _configure_logging() -> None:
    import logging  # noqa: PLC0415 - only the commands that serve configure logging

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _ready(sock: socket.socket) -> None:
    host, port = sock.getsockname()[:2]
    sys.stdout.write(f"listening on http://{host}:{port}\n")
    sys.stdout.flush()


def _run(  # noqa: PLR0913 - the server's settings, by keyword
    factory: str,
    sock: socket.socket,
    *,
    workers: int,
    drain: int,
    keep_alive: int = 5,
    extra: Sequence[socket.socket] = (),
) -> None:
    """Serve ``factory``'s app on ``sock``; print the readiness line; drain on SIGTERM.

    ``extra`` sockets serve the same app (a simulated SGLang prefill's bootstrap port); the
    readiness line names ``sock``.

    ``keep_alive`` is how long an idle client connection stays open: 5 s for a simulated
    worker, as vLLM's own uvicorn server; more for the proxy (docs/proxy.md).
    """
    import uvicorn  # noqa: PLC0415

    _configure_logging()
    config = uvicorn.Config(
        factory,
        factory=True,
        workers=workers,
        log_config=None,
        access_log=False,  # the proxy writes its own, with the legs
        server_header=False,
        timeout_graceful_shutdown=drain,
        timeout_keep_alive=keep_alive,
    )
    # uvicorn re-raises the signal that stopped it once drained; these handlers make that a
    # clean exit 0 instead of a death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    if workers > 1:
        # The socket listens from here on: connections wait in its backlog for a worker.
        sock.listen(config.backlog)
        _ready(sock)
        _supervisor(config, sock).run()
        return
    _ready_server(config).run(sockets=[sock, *extra])


def _supervisor(config: uvicorn.Config, sock: socket.socket) -> Multiprocess:
    """The supervisor of ``--workers`` processes (uvicorn's), which stops listening on a signal.

    The kernel refuses new connections only when every process has closed its copy of the
    listening socket: the parent closes its own at once (uvicorn keeps it until every worker has
    drained, and the connections queued meanwhile are then reset) and passes SIGTERM on to the
    workers at once (uvicorn looks at its signals every half second), which close theirs within
    a tenth of a second (docs/proxy.md).
    """
    from uvicorn.supervisors import Multiprocess  # noqa: PLC0415

    class Supervisor(Multiprocess):
        def __init__(self) -> None:
            super().__init__(config, sockets=[sock])
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.stop_listening)

        def stop_listening(self, sig: int, _frame: object) -> None:
            sock.close()
            for process in self.processes:
                if process.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGTERM)
            self.signal_queue.append(sig)  # the supervisor's own stop: terminate, then join

        def keep_subprocess_alive(self) -> None:
            if sock.fileno() != -1:  # closed: stopping, a worker that is done is not replaced
                super().keep_subprocess_alive()

    return Supervisor()


def _ready_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that prints the readiness line once it accepts connections."""
    import uvicorn  # noqa: PLC0415

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and sockets:
                _ready(sockets[0])

    return ReadyServer(config)
