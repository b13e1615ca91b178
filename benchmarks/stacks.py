"""Which HTTP stack for the proxy: minimal pass-through proxies, one per server and worker client.

Usage: ``python benchmarks/stacks.py [--repeats N] [--quick] [--only NAME ...]`` (needs the
``bench`` and ``proxy`` extras; a stack whose packages are missing is skipped with a message).

Each stack is the same Starlette pass-through (forward the client's body to one worker, relay
the answer whole or chunk by chunk, as ``benchmarks/proxy.py``'s pass-through does) served by
one server (uvicorn with h11 or httptools, on asyncio or uvloop; granian in ASGI mode) calling
the worker with one client (httpx, with sniffio importable or not; aiohttp; pyreqwest). The
worker is a raw asyncio server written here (not measured) answering a fixed chat completion at
once, or a 256-chunk stream, one chunk a millisecond. Each proxy runs in its own process tree
pinned to one core; its CPU is read with psutil (user + system of the process and its
children: granian serves from a child process). The load generator is aiohttp.

Figures: CPU per request at 1, 16 and 64 requests in flight (whole answers), CPU per streamed
chunk (a stream request's CPU over its 256 chunks, at 16 in flight), and the pool's growth:
CPU per request at 64 in flight over at 1. Each stack is started afresh per repeat and the
repeats interleave the stacks, so a slow spell of a shared machine hits them alike; the table
gives each figure's range over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.util
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy import SOAK_SECTION_START, STACKS_SECTION_START, _free_port, _spawn, serve_announced

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
CHUNKS = 256
CHUNK_INTERVAL = 0.001
CONCURRENCIES = (1, 16, 64)
STREAM_CONCURRENCY = 16
PROMPT = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 4000 + b'"}]}'
_ANSWER = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1024,"completion_tokens":7,"total_tokens":1031}}'
)
_CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'
)


@dataclass(frozen=True)
class Stack:
    name: str
    server: str
    """``uvicorn`` or ``granian``."""
    client: str
    """``httpx``, ``aiohttp`` or ``pyreqwest``."""
    http: str = "h11"
    loop: str = "asyncio"
    sniffio: bool = True
    """httpx only: whether ``import sniffio`` succeeds (httpcore tries it on each pool use)."""

    def missing(self) -> list[str]:
        needed = ["starlette", self.server, self.client]
        needed += [m for m in (self.http, self.loop) if m in {"httptools", "uvloop"}]
        return [m for m in needed if importlib.util.find_spec(m) is None]


STACKS = (
    Stack("uvicorn h11 asyncio + httpx, no sniffio", "uvicorn", "httpx", sniffio=False),
    Stack("uvicorn h11 asyncio + httpx", "uvicorn", "httpx"),
    Stack("uvicorn httptools asyncio + httpx", "uvicorn", "httpx", http="httptools"),
    Stack("uvicorn h11 uvloop + httpx", "uvicorn", "httpx", loop="uvloop"),
    Stack("uvicorn httptools uvloop + httpx", "uvicorn", "httpx", "httptools", "uvloop"),
    Stack("granian + httpx", "granian", "httpx"),
    Stack("uvicorn h11 asyncio + aiohttp", "uvicorn", "aiohttp"),
    Stack("uvicorn httptools uvloop + aiohttp", "uvicorn", "aiohttp", "httptools", "uvloop"),
    Stack("uvicorn httptools uvloop + pyreqwest", "uvicorn", "pyreqwest", "httptools", "uvloop"),
    Stack("granian + aiohttp", "granian", "aiohttp"),
    Stack("granian + pyreqwest", "granian", "pyreqwest"),
)


# --- the fake worker: raw asyncio, so its own cost stays out of the way ---------------------


class _Worker(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[: end + 2].lower()
            start = head.index(b"content-length:") + 15
            length = int(head[start : head.index(b"\r\n", start)])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if b'"stream":true' in body:
                asyncio.get_running_loop().create_task(self._stream())
            else:
                self._send(b"application/json", _ANSWER)

    def _send(self, kind: bytes, content: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
            b"%d\r\n\r\n%s" % (len(content), content)
        )

    async def _stream(self) -> None:
        assert self.transport is not None
        write = self.transport.write
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        write(b"transfer-encoding: chunked\r\n\r\n")
        framed = b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK)
        for _ in range(CHUNKS):
            write(framed)
            await asyncio.sleep(CHUNK_INTERVAL)
        done = b"data: [DONE]\n\n"
        write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def serve_worker() -> None:
    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(_Worker, "127.0.0.1", 0)
        print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    asyncio.run(run())


# --- the pass-through proxies ---------------------------------------------------------------


def _hide(module: str) -> None:
    """Make ``import module`` fail as it does when the package is not installed.

    The path search still runs (a failed import is not cached, so that search is its cost);
    only its result is refused.
    """

    class Hider:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if name == module:
                importlib.machinery.PathFinder.find_spec(name, path, target)  # type: ignore[arg-type]
                msg = f"No module named {name!r}"
                raise ModuleNotFoundError(msg, name=name)

    sys.modules.pop(module, None)
    sys.meta_path.insert(0, Hider)


Relay = Callable[[bytes, str], Any]


def _httpx_relay(worker: str) -> Relay:
    import httpx  # noqa: PLC0415
    from starlette.background import BackgroundTask  # noqa: PLC0415
    from starlette.responses import Response, StreamingResponse  # noqa: PLC0415

    http = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None), trust_env=False)

    async def relay(content: bytes, path: str) -> Response:
        request = http.build_request(
            "POST", worker + path, content=content, headers={"content-type": "application/json"}
        )
        answer = await http.send(request, stream=True)
        kind = answer.headers["content-type"]
        if not kind.startswith("text/event-stream"):
            return Response(await answer.aread(), answer.status_code, media_type=kind)
        return StreamingResponse(
            answer.aiter_raw(), answer.status_code, {"content-type": kind}, kind,
            BackgroundTask(answer.aclose),
        )  # fmt: skip

    return relay


def _aiohttp_relay(worker: str) -> Relay:
    import aiohttp  # noqa: PLC0415
    from starlette.background import BackgroundTask  # noqa: PLC0415
    from starlette.responses import Response, StreamingResponse  # noqa: PLC0415

    session: list[aiohttp.ClientSession] = []  # made on the server's loop, at the first call

    async def relay(content: bytes, path: str) -> Response:
        if not session:
            connector = aiohttp.TCPConnector(limit=0)
            session.append(aiohttp.ClientSession(connector=connector, auto_decompress=False))
        answer = await session[0].post(
            worker + path, data=content, headers={"content-type": "application/json"}
        )
        kind = answer.headers["content-type"]
        if not kind.startswith("text/event-stream"):
            content = await answer.read()
            answer.release()
            return Response(content, answer.status, media_type=kind)

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in answer.content.iter_any():
                yield chunk

        return StreamingResponse(
            chunks(), answer.status, {"content-type": kind}, kind, BackgroundTask(answer.release)
        )

    return relay


def _pyreqwest_relay(worker: str) -> Relay:
    from pyreqwest.client import ClientBuilder  # noqa: PLC0415
    from starlette.responses import Response, StreamingResponse  # noqa: PLC0415

    http = ClientBuilder().max_connections(None).build()
    headers = {"content-type": "application/json"}

    async def relay(content: bytes, path: str) -> Response:
        request = http.post(worker + path).headers(headers).body_bytes(content)
        if b'"stream":true' not in content:  # pyreqwest picks the body's reading up front
            answer = await request.build().send()
            kind = answer.get_header("content-type") or ""
            return Response(bytes(await answer.bytes()), answer.status, media_type=kind)

        async def chunks() -> AsyncIterator[bytes]:
            async with request.build_streamed() as answer:
                while (chunk := await answer.body_reader.read_chunk()) is not None:
                    yield bytes(chunk)

        return StreamingResponse(chunks(), 200, media_type="text/event-stream")

    return relay


_RELAYS = {"httpx": _httpx_relay, "aiohttp": _aiohttp_relay, "pyreqwest": _pyreqwest_relay}


def app(stack: Stack, worker: str) -> object:
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.requests import Request  # noqa: PLC0415
    from starlette.responses import Response  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    if not stack.sniffio:
        _hide("sniffio")
    relay = _RELAYS[stack.client](worker)

    async def forward(request: Request) -> Response:
        response: Response = await relay(await request.body(), request.url.path)
        return response

    return Starlette(routes=[Route("/{path:path}", forward, methods=["POST"])])


def granian_app() -> object:
    """Granian's factory: it builds the app in its worker process, from the environment."""
    stack = next(s for s in STACKS if s.name == os.environ["STACKS_BENCH_STACK"])
    return app(stack, os.environ["STACKS_BENCH_WORKER"])


def _announce_when_up(port: int) -> None:
    """Print the readiness line once granian (which binds in its worker) accepts connections."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:  # noqa: PERF203 - a poll until the server listens
            time.sleep(0.05)
        else:
            print(f"listening on http://127.0.0.1:{port}", flush=True)
            return


def serve_proxy(stack: Stack, worker: str) -> None:
    if stack.server == "granian":
        from granian.constants import Interfaces  # noqa: PLC0415
        from granian.server import Server  # noqa: PLC0415

        port = _free_port()  # granian binds by itself; the port was free a moment ago
        os.environ["STACKS_BENCH_STACK"] = stack.name
        os.environ["STACKS_BENCH_WORKER"] = worker
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: PTH100, PTH120
        server = Server(
            "stacks:granian_app",
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            workers=1,
            runtime_threads=1,
            factory=True,
            log_access=False,
            log_level="warning",  # type: ignore[arg-type, unused-ignore]
        )
        threading.Thread(target=_announce_when_up, args=(port,), daemon=True).start()
        server.serve()
        return
    serve_announced(app(stack, worker), http=stack.http, loop=stack.loop)


# --- the load and the measurement ------------------------------------------------------------


def _stop(process: subprocess.Popen[bytes]) -> None:
    import psutil  # noqa: PLC0415

    children = psutil.Process(process.pid).children(recursive=True)
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        if child.is_running():
            child.kill()
    if process.stdout is not None:
        process.stdout.close()


def tree_cpu(pid: int) -> float:
    """User plus system CPU seconds of a process and its live children (psutil)."""
    import psutil  # noqa: PLC0415

    root = psutil.Process(pid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        times = process.cpu_times()
        total += times.user + times.system
    return total


async def load(url: str, count: int, concurrency: int, *, stream: bool) -> list[float]:
    """Send ``count`` requests, ``concurrency`` at a time; each one's latency in seconds."""
    import aiohttp  # noqa: PLC0415

    payload = PROMPT[:-1] + (b',"stream":true}' if stream else b"}")
    latencies: list[float] = []
    queue = iter(range(count))
    headers = {"content-type": "application/json"}

    async def one(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            start = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as answer:
                async for _chunk in answer.content.iter_any():
                    pass
                assert answer.status == 200, answer.status
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency)))
    return latencies


@dataclass
class Figures:
    """One stack's figures, each a list over the repeats."""

    cpu_ms: dict[int, list[float]] = field(default_factory=dict)
    rps: dict[int, list[float]] = field(default_factory=dict)
    chunk_us: list[float] = field(default_factory=list)
    growth: list[float] = field(default_factory=list)


def measure_once(url: str, pid: int, counts: dict[int, int], streams: int, into: Figures) -> None:
    asyncio.run(load(url, 4 * STREAM_CONCURRENCY, STREAM_CONCURRENCY, stream=False))  # warm up
    for concurrency, count in counts.items():
        before, start = tree_cpu(pid), time.perf_counter()
        asyncio.run(load(url, count, concurrency, stream=False))
        seconds = time.perf_counter() - start
        into.cpu_ms.setdefault(concurrency, []).append((tree_cpu(pid) - before) / count * 1000)
        into.rps.setdefault(concurrency, []).append(count / seconds)
    into.growth.append(into.cpu_ms[CONCURRENCIES[-1]][-1] / into.cpu_ms[CONCURRENCIES[0]][-1])
    before = tree_cpu(pid)
    asyncio.run(load(url, streams, STREAM_CONCURRENCY, stream=True))
    into.chunk_us.append((tree_cpu(pid) - before) / streams / CHUNKS * 1e6)


@contextmanager
def started(args: list[str], core: int | None) -> Iterator[tuple[int, str]]:
    process, url = _spawn([__file__, *args], core)
    try:
        yield process.pid, url
    finally:
        _stop(process)


def measure(stacks: Sequence[Stack], repeats: int, *, quick: bool) -> dict[str, Figures]:
    counts = {1: 100, 16: 400, 64: 800} if quick else {1: 300, 16: 1200, 64: 2400}
    streams = 2 * STREAM_CONCURRENCY if quick else 4 * STREAM_CONCURRENCY
    cores = sorted(os.sched_getaffinity(0))
    proxy_core = cores[-1] if len(cores) > 1 else None
    figures = {stack.name: Figures() for stack in stacks}
    with started(["--worker"], None) as (_, worker):
        for repeat in range(repeats):
            for stack in stacks:
                print(f"repeat {repeat + 1}/{repeats}: {stack.name}", file=sys.stderr, flush=True)
                with started(["--proxy", stack.name, worker], proxy_core) as (pid, url):
                    path = url + "/v1/chat/completions"
                    measure_once(path, pid, counts, streams, figures[stack.name])
            if repeat + 1 < repeats:  # the table so far, in case the run is cut short
                print(f"after {repeat + 1} of {repeats} repeats:\n{table(figures)}\n", flush=True)
    return figures


def _span(values: Sequence[float], digits: int) -> str:
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:.{digits}f}"
    return f"{low:.{digits}f}-{high:.{digits}f}"


def table(figures: dict[str, Figures]) -> str:
    base = next(iter(figures.values()))
    head = " | ".join(f"CPU ms/request c{c}" for c in CONCURRENCIES)
    rps = " | ".join(f"requests/s c{c}" for c in CONCURRENCIES)
    lines = [
        (
            f"| stack | {head} | vs first, c16 | CPU us/chunk (c{STREAM_CONCURRENCY}) "
            f"| CPU c{CONCURRENCIES[-1]} / c{CONCURRENCIES[0]} | {rps} |"
        ),
        "|---" * (4 + 2 * len(CONCURRENCIES)) + "|",
    ]
    for name, f in figures.items():
        ratio = statistics.median(f.cpu_ms[16]) / statistics.median(base.cpu_ms[16])
        cpu = " | ".join(_span(f.cpu_ms[c], 2) for c in CONCURRENCIES)
        speed = " | ".join(_span(f.rps[c], 0) for c in CONCURRENCIES)
        lines.append(
            f"| {name} | {cpu} | {ratio:.2f}x | {_span(f.chunk_us, 1)} | {_span(f.growth, 2)} "
            f"| {speed} |"
        )
    return "\n".join(lines)


CHOICE = """\
**The choice** (made on a run of 3 repeats, machine loaded by other jobs, load average near 10):

- **Worker client: leave httpx.** It is the cost: 1.7-2.6 ms of CPU per request at c1 and 2.1-2.9
  ms at c16 (with sniffio), against 0.30-0.39 ms for aiohttp and 0.17-0.21 ms for pyreqwest on the
  same server (0.11x and 0.06x the first row at c16), and its cost per request grows with the
  connections in its pool (c64 over c1: 1.2-1.75) where aiohttp's and pyreqwest's do not (0.4-0.8:
  likely because at c1 each request pays the loop's wake-ups alone). Per streamed chunk httpx
  spends 50-60 us, aiohttp 19-25, pyreqwest 21-23. Of the two, **aiohttp**: asyncio-native like
  the rest of the proxy, a C parser, a pool whose cost does not grow with its connections (above),
  wheels for every platform, and a decade of releases; pyreqwest (a Rust reqwest binding, 0.x) is
  cheaper again per request but young, and per chunk the two are equal. Worth measuring again once
  the proxy has moved off httpx.
- **Server: uvicorn, on uvloop and httptools.** With httpx behind it the server barely shows
  (every server row is within the noise of the others); with a fast client it does: with aiohttp,
  uvloop + httptools costs 0.30-0.39 ms a request and 19-25 us a chunk against 0.43-0.55 ms and
  30-32 us on asyncio + h11. uvicorn picks both by itself when they are installed (its `auto` loop
  and parser), so the `proxy` extra installs them and `serve` needs no new setting. granian (ASGI)
  is no cheaper than uvicorn on uvloop + httptools with the same client (0.31-0.33 vs 0.30-0.39 ms
  with aiohttp, 0.21-0.22 vs 0.17-0.21 with pyreqwest), serves from a second process and would
  change how `serve` starts, drains and reports readiness: not worth it.
- **Where `serve` spends its CPU**: a CPU profile (cProfile on thread time) of `serve`'s default
  pipeline at c16 puts httpx and what it runs on (httpcore, h11, anyio, sniffio) at about 60% of
  the process's CPU (httpcore's pool alone scans its connections some 700 times a request), the
  library's own work at 8%, Starlette and uvicorn at 4%: the client is the change to make.
- **sniffio**, declared by the `proxy` extra while httpx was its worker client, saved about a
  quarter of that stack (0.77x the first row at c16, 55-59 against 60-75 us a chunk).
- **Done**: `serve` calls its workers with aiohttp, and the `proxy` extra installs aiohttp instead
  of httpx and sniffio; the proxy benchmark above measures the result.
"""
"""The choice made from these figures, written when it was made (a rerun keeps it)."""


def section(figures: dict[str, Figures], command: str, repeats: int) -> str:
    return f"""{STACKS_SECTION_START}
## Choosing the proxy's HTTP stack

`{command}` ({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()}
CPUs shared with other jobs running at the same time: read the ratios within the table, not the
absolute figures). The same minimal Starlette pass-through (one worker call, the answer relayed
whole or chunk by chunk) on each server and worker client; a raw asyncio fake worker answering at
once, streams of {CHUNKS} chunks one every {CHUNK_INTERVAL * 1000:g} ms. Each proxy is its own
process (tree) pinned to one core; CPU is its user + system time (psutil, children included:
granian serves from a child process) over the requests sent. Each figure is the range over
{repeats} runs, each stack started afresh per run, the runs interleaving the stacks. "vs first":
CPU per request at c16 over the first row's (the `proxy` extra's stack before sniffio was
declared); "CPU c64 / c1": how the cost per request grows with the connections in the pool.
"no sniffio" hides `sniffio` from the proxy's process (the path search of a failed import still
runs, as when the package is not installed).

{table(figures)}

{CHOICE}"""


def write(figures: dict[str, Figures], command: str, repeats: int) -> None:
    text = DOC.read_text(encoding="utf-8")
    soak = text[text.index(SOAK_SECTION_START) :] if SOAK_SECTION_START in text else ""
    if STACKS_SECTION_START in text:
        text = text[: text.index(STACKS_SECTION_START)].rstrip("\n") + "\n"
    stacks = section(figures, command, repeats)
    DOC.write_text(text + "\n" + stacks + ("\n" + soak if soak else ""), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each stack (default 2)")
    parser.add_argument("--quick", action="store_true", help="fewer requests per figure")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="stacks whose name has NAME")
    parser.add_argument("--no-write", action="store_true", help="leave docs/performance.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--proxy", nargs=2, metavar=("STACK", "WORKER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        serve_worker()
        return 0
    if args.proxy:
        serve_proxy(next(s for s in STACKS if s.name == args.proxy[0]), args.proxy[1])
        return 0
    chosen = []
    for stack in STACKS:
        if args.only and not any(part in stack.name for part in args.only):
            continue
        if missing := stack.missing():
            print(f"skipped {stack.name}: not installed: {', '.join(missing)}", flush=True)
            continue
        chosen.append(stack)
    figures = measure(chosen, args.repeats, quick=args.quick)
    print(table(figures))
    if not args.no_write:
        command = " ".join(["python benchmarks/stacks.py", *(argv or sys.argv[1:])])
        write(figures, command, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
