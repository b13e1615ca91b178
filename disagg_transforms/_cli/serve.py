"""``serve`` (the reference proxy) and ``simulate`` (one simulated worker): see docs/proxy.md.

Only argparse is imported here at first: starlette, uvicorn and aiohttp (the ``proxy`` extra) are
imported when one of these commands runs, so the other commands work without them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from disagg_transforms._cli.commands import EXIT_USAGE, PROG, CliError, add_command
from disagg_transforms._cli.config import config_errors, read_config
from disagg_transforms._wire.limits import DEFAULT_LIMITS

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send

_ParserT = TypeVar("_ParserT", bound=argparse.ArgumentParser)

# The settings travel to uvicorn's worker processes (``--workers N``), which build the app from
# an import string: the parent writes them here, the factory reads them back.
_SETTINGS = "DISAGG_TRANSFORMS_SERVE_SETTINGS"
_FACTORY = "disagg_transforms._cli.serve:app_from_settings"
_SIMULATED = "/simulated"  # where ``serve --simulate`` mounts its worker on its own server
_STEP_URLS = ("render", "encode", "prefill", "decode")


def add_commands(commands: argparse._SubParsersAction[_ParserT]) -> None:
    """Add ``serve`` and ``simulate`` to the command line's subcommands."""
    serve = add_command(commands, "serve", _serve)
    serve.add_argument("--config", help="the pipeline document check-config reads")
    for step in _STEP_URLS:
        serve.add_argument(f"--{step}-url", help=f"the {step} worker's base URL")
    serve.add_argument(
        "--simulate",
        action="store_true",
        help="call a simulated vLLM worker served by this same server (no URLs)",
    )
    _add_served_model_name(serve, "with --simulate: ")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve.add_argument("--workers", type=_positive_int, default=1, help="server processes")
    serve.add_argument("--connect-timeout", type=_seconds, default=5.0, help="seconds (default 5)")
    serve.add_argument(
        "--first-byte-timeout",
        type=_seconds,
        default=300.0,
        help="seconds to a whole answer or a stream's first chunk (default 300)",
    )
    serve.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=60.0,
        help="seconds between two chunks of a worker stream (default 60)",
    )
    serve.add_argument(
        "--keep-alive",
        type=int,
        default=75,
        help="seconds an idle client connection stays open (default 75)",
    )
    serve.add_argument(
        "--worker-keep-alive",
        type=_seconds,
        default=2.0,
        help="seconds an idle pooled worker connection stays open (default 2)",
    )
    serve.add_argument(
        "--prefill-max-retries",
        type=_count,
        default=0,
        metavar="N",
        help="retries of a prefill that failed with 502, 503, 504 or in transport (default 0)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=DEFAULT_LIMITS.max_body_bytes,
        help=f"largest client body; a larger one is 413 (default {DEFAULT_LIMITS.max_body_bytes})",
    )
    serve.add_argument(
        "--drain-timeout",
        type=int,
        default=60,
        help="seconds SIGTERM waits for replies in flight (default 60)",
    )
    simulate = add_command(commands, "simulate", _simulate)
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--port", type=int, default=8100, help="0 picks a free port")
    simulate.add_argument("--fault", help="a fault for every request (x-simulate-fault modes)")
    simulate.add_argument(
        "--stream-delay", type=_seconds, default=0.0, help="seconds between stream events"
    )
    simulate.add_argument(
        "--first-byte-delay",
        type=_seconds,
        default=0.5,
        help="seconds the slow-first-byte fault waits (default 0.5)",
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
        "--pool-size", type=_positive_int, default=1, help="with --gateway: workers per pool"
    )
    simulate.add_argument(
        "--routing",
        choices=("round-robin", "hash"),
        default="round-robin",
        help="with --gateway: how a pool's worker is chosen",
    )
    _add_served_model_name(simulate)
    simulate.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="as vLLM's flag: a prefill's usage reports its cached prompt tokens",
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


def _serve(args: argparse.Namespace) -> int:
    """Run the reference proxy (needs the proxy extra).

    Serve the five client routes, calling vLLM workers through the exchange.
    """
    _need_the_extra()
    urls = {step: getattr(args, f"{step}_url") for step in _STEP_URLS}
    if args.simulate and any(urls.values()):
        msg = "--simulate calls its own simulated worker: give no worker URL with it"
        raise CliError(msg)
    if args.served_model_name and not args.simulate:
        msg = "--served-model-name names the simulated worker's models: give it with --simulate"
        raise CliError(msg)
    if args.config is None:
        document: object = _default_document(prefill=args.simulate or bool(urls["prefill"]))
        source = "<default config>"
    else:
        document = read_config(args.config, "auto")
        source = args.config
    problems = [f"{source}: {error.message}" for error in config_errors(document)]
    if problems:
        sys.stderr.writelines(line + "\n" for line in problems)
        return EXIT_USAGE
    assert isinstance(document, Mapping)  # noqa: S101 - config_errors refuses anything else
    sock = _bind(args.host, args.port)
    if args.simulate:
        base = f"http://{_reachable(args.host)}:{sock.getsockname()[1]}{_SIMULATED}"
        steps = document["steps"]
        urls = {step: base if step == "decode" or step in steps else None for step in _STEP_URLS}
    settings = {
        "document": document,
        "urls": urls,
        "simulate": args.simulate,
        "served_model_names": args.served_model_name or [],
        "timeouts": {
            "connect": args.connect_timeout,
            "first_byte": args.first_byte_timeout,
            "idle": args.idle_timeout,
        },
        "worker_keep_alive": args.worker_keep_alive,
        "prefill_max_retries": args.prefill_max_retries,
        "max_body_bytes": args.max_body_bytes,
    }
    _, warnings, problems = _pipeline(settings)
    if problems:
        sock.close()
        sys.stderr.writelines(f"{PROG}: error: {line}\n" for line in problems)
        return EXIT_USAGE
    sys.stderr.writelines(f"{source}: warning: {line}\n" for line in warnings)
    os.environ[_SETTINGS] = orjson.dumps(settings).decode()
    _run(_FACTORY, sock, workers=args.workers, drain=args.drain_timeout, keep_alive=args.keep_alive)
    return 0


def _pipeline(settings: Mapping[str, Any]) -> tuple[Any, list[str], list[str]]:
    """The parsed pipeline, its warnings, and every problem (one line each) that stops it."""
    from disagg_transforms import ConfigError, parse_pipeline_params  # noqa: PLC0415
    from disagg_transforms.exchange import pipeline_warnings  # noqa: PLC0415
    from disagg_transforms.integrations.proxy import url_errors  # noqa: PLC0415

    document = settings["document"]
    try:
        config = parse_pipeline_params(
            document["steps"], use_openai_format=document.get("use_openai_format")
        )
    except ConfigError as error:  # a rule spanning keys would surface only here
        return None, [], [error.message]
    errors = url_errors(config, **_url_arguments(settings))
    return config, pipeline_warnings(config), [error.message for error in errors]


def _url_arguments(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings' worker URLs as ``url_errors`` and ``create_app`` take them (``decode_url``)."""
    return {f"{step}_url": settings["urls"][step] for step in _STEP_URLS}


def app_from_settings() -> ASGIApp:
    """The proxy app of the settings ``serve`` wrote: uvicorn's factory, in every process."""
    from disagg_transforms import Limits  # noqa: PLC0415
    from disagg_transforms.integrations.proxy import Timeouts, create_app  # noqa: PLC0415

    _configure_logging()
    settings = orjson.loads(os.environ[_SETTINGS])
    config, _, _ = _pipeline(settings)  # the parent checked it before starting the server
    app = create_app(
        config,
        **_url_arguments(settings),
        timeouts=Timeouts(**settings["timeouts"]),
        limits=Limits(max_body_bytes=settings["max_body_bytes"]),
        worker_keep_alive=settings["worker_keep_alive"],
        prefill_max_retries=settings["prefill_max_retries"],
    )
    if not settings["simulate"]:
        return app
    return _WithSimulated(app, _simulated_worker(settings))


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
    """
    from disagg_transforms.testing import FAULT_MODES  # noqa: PLC0415

    _need_the_extra()
    if args.fault is not None and args.fault not in FAULT_MODES:
        msg = f"--fault: unknown fault {args.fault!r}; expected one of {', '.join(FAULT_MODES)}"
        raise CliError(msg)
    if args.gateway and args.fault is not None:
        msg = "--fault plays on one worker: it cannot be given with --gateway"
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
    }
    os.environ[_SETTINGS] = orjson.dumps(settings).decode()
    _run(
        "disagg_transforms._cli.serve:worker_from_settings",
        _bind(args.host, args.port),
        workers=1,
        drain=5,
    )
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
    )
    stream_delay = settings.get("stream_delay", 0.0)
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


def _run(
    factory: str, sock: socket.socket, *, workers: int, drain: int, keep_alive: int = 5
) -> None:
    """Serve ``factory``'s app on ``sock``; print the readiness line; drain on SIGTERM.

    ``keep_alive`` is how long an idle client connection stays open: 5 s for a simulated
    worker, as vLLM's own uvicorn server; more for the proxy (docs/proxy.md).
    """
    import uvicorn  # noqa: PLC0415
    from uvicorn.supervisors import Multiprocess  # noqa: PLC0415

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
        Multiprocess(config, sockets=[sock]).run()
        return
    _ready_server(config).run(sockets=[sock])


def _ready_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that prints the readiness line once it accepts connections."""
    import uvicorn  # noqa: PLC0415

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and sockets:
                _ready(sockets[0])

    return ReadyServer(config)
