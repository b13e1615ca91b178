"""The reference proxy against a minimal pass-through proxy and vllm-router, CPU per request.

Usage: ``python benchmarks/proxy.py [--quick] [--no-write] [--vllm-router PATH]
[--simulated-worker]``. Starts one fast fake worker (``fast_worker.py``: the simulated worker's
256-token answers, recorded once per kind of request and replayed pre-encoded; with
``--simulated-worker``, ``SimulatedWorker`` itself) pinned to the first core and, each its own
process pinned to the last core: the pass-through (this file with ``--passthrough``: it forwards
the body to the worker and the answer back, nothing else, on Starlette + uvicorn as the proxy, with
httpx as its worker client where the proxy has aiohttp), ``disagg-transforms serve`` three times
(decode only, with ``use_openai_format: true``: one worker call like the pass-through; the default
pipeline: render, prefill, decode, three calls; and the same in gateway mode, ``--gateway-url`` and
``--render-url`` at the worker) and vllm-router in its P/D mode (two calls; skipped
with a message when ``vllm-router`` is not on the PATH). A load generator (aiohttp) sends a chat
request whose user message renders to 1k tokens to each in turn, whole and streamed, at 1, 16 and 64
requests in flight, rounds interleaved. It prints, per target: requests per second, the latency and
(streams) time to first token each adds over calling the worker directly (p50, p99), the CPU time of
the target's process tree per request and per streamed chunk (psutil), checks the floors
(docs/performance.md) and writes the figures into the last section of ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import platform
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import sglang_gateway
from fast_worker import MAX_TOKENS, simulated_worker

_ROOT = Path(__file__).resolve().parent.parent
_DOC = _ROOT / "docs" / "performance.md"
_FAST_WORKER = Path(__file__).resolve().parent / "fast_worker.py"
SECTION_START = "<!-- proxy benchmark: written by benchmarks/proxy.py -->"
"""Opens this benchmark's section (``run.py`` keeps it and all after it on a rerun)."""
STACKS_SECTION_START = "<!-- stacks benchmark: written by benchmarks/stacks.py -->"
"""Opens ``stacks.py``'s section (this benchmark keeps it and all after it on a rerun)."""
SOAK_SECTION_START = "<!-- soak: figures of a run of benchmarks/soak.py, written by hand -->"
"""Opens the last section of the page (``stacks.py`` keeps it on a rerun)."""
FLOOR = 0.8
PROMPT_TOKENS = 1024
# The simulated worker's chat template around one user message: <|im_start|>user\n ...
# <|im_end|>\n<|im_start|>assistant\n, one token a byte (docs/testing.md).
_TEMPLATE_TOKENS = 19
CONCURRENCIES = (1, 16, 64)
PATH = "/v1/chat/completions"
WORKER = "worker"
PASS_THROUGH = "pass-through"  # noqa: S105 - a target's name
ONE_CALL = "proxy"
GENERATE = "proxy (generate)"
GATEWAY = "proxy (generate, gateway)"
GATEWAY_FLOOR = 1.20
"""Gateway mode over fixed URLs, CPU per request: the spread of a target against itself
(``GATEWAY_NOTE``)."""
ROUTER = "vllm-router"
# The one-call proxy: decode on the client's own route, so the worker answers the client.
_ONE_CALL_CONFIG = {"steps": {"decode": {"use_openai_format": True}}}
_COUNTS = {  # requests per round: (whole, stream) at each concurrency
    True: {1: (40, 10), 16: (160, 32), 64: (256, 64)},
    False: {1: (100, 20), 16: (400, 64), 64: (640, 128)},
}


SG_WORKER = "SGLang decode worker"
SG_OURS = "proxy (sglang)"
SG_ROUTER = "sglang-router"
SG_ROUTER_GENERATE = "sglang-router (/generate)"
SG_READER = "aiohttp reader (reads only)"
"""The load generator itself, reading the decode worker's stream and counting its events: about
what any Python proxy on aiohttp pays before it converts or writes anything."""
SG_STREAMS = {"stream 1k": 1024, "stream 8k": 8192}
"""The cumulative streams measured per chunk, by their answer's length in tokens."""
SG_RENDER_CONTEXT = 32768  # the render worker's: a 1k prompt and an 8k answer fit
SG_BOOTSTRAP_PORT = 8998  # the fast SGLang workers meet in process: any port does
# Requests per round: whole at each concurrency, each stream at c1. A process's CPU time moves in
# 10 ms ticks: over 16 streams of 1k tokens a tick was 0.6 us a chunk, too coarse beside
# sglang-router's 4 to 5 (its 1.5x floor); over 64 it is 0.15.
# Rounds of each SGLang load, the targets taken in turn each round (each figure their median): a
# c1 stream round is under a second and one target's CPU per chunk moved 10-20% between them.
_SG_ROUNDS = {"whole": 2, "stream 1k": 5, "stream 8k": 5}
_SG_COUNTS = {
    True: {1: 40, 16: 160, 64: 256, "stream 1k": 16, "stream 8k": 2},
    False: {1: 100, 16: 400, 64: 640, "stream 1k": 64, "stream 8k": 4},
}


@dataclass(frozen=True)
class Result:
    target: str
    mode: str
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms: float | None = None
    """CPU time the target's own processes spent per request (``None``: not measurable here)."""
    concurrency: int = 16
    ttft_p50_ms: float | None = None
    """Streams: the median time to the first chunk of the answer."""
    chunks: int = 0
    """Streams: the chunks (SSE events) of one answer, to give CPU per chunk."""

    @property
    def cpu_us_per_chunk(self) -> float | None:
        if self.cpu_ms is None or not self.chunks:
            return None
        return self.cpu_ms * 1000 / self.chunks


def verdict(proxy_rps: float, passthrough_rps: float) -> tuple[float, bool]:
    """The proxy's requests per second over the pass-through's, and whether it meets the floor."""
    ratio = proxy_rps / passthrough_rps if passthrough_rps > 0 else 0.0
    return ratio, ratio >= FLOOR


def body(*, stream: bool) -> bytes:
    """A chat request whose one user message renders to ``PROMPT_TOKENS`` tokens."""
    words = "The quick brown fox jumps over the lazy dog. " * PROMPT_TOKENS
    content = words[: PROMPT_TOKENS - _TEMPLATE_TOKENS]
    return orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": MAX_TOKENS,
            "stream": stream,
        }
    )


@dataclass
class Load:
    """One load run: seconds taken, each request's latency and time to its first chunk."""

    seconds: float
    latencies: list[float]
    first_chunks: list[float]
    events: int
    """SSE events in the last answer (``0``: a whole answer)."""


class EventCount:
    """The SSE events of a stream read by read (its ``data:`` marks), nothing of it kept."""

    def __init__(self) -> None:
        self.count = 0
        self._tail = b""  # the stream's last 4 bytes so far: part of a mark a read cut, at most

    def feed(self, read: bytes) -> None:
        self.count += read.count(b"data:") + (self._tail + read[:4]).count(b"data:")
        self._tail = (self._tail + read)[-4:]


async def load(url: str, payload: bytes, count: int, concurrency: int) -> Load:
    """Send ``count`` requests, ``concurrency`` at a time (aiohttp: its cost stays flat at c64)."""
    import aiohttp  # noqa: PLC0415 - only the load generator needs it (the bench extra)

    latencies: list[float] = []
    first_chunks: list[float] = []
    events = 0
    queue = iter(range(count))
    headers = {"content-type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal events
        for _ in queue:
            start = time.perf_counter()
            first = None
            counted = EventCount()  # an 8k-token cumulative stream is 200 MB: nothing kept
            async with session.post(url, data=payload, headers=headers) as answer:
                assert answer.status == 200, await answer.read()
                async for chunk in answer.content.iter_any():
                    if first is None:
                        first = time.perf_counter() - start
                    counted.feed(chunk)
            latencies.append(time.perf_counter() - start)
            first_chunks.append(first or 0.0)
            events = counted.count

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return Load(time.perf_counter() - start, latencies, first_chunks, events)


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _pinned(core: int | None) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})


def _start(command: list[str], core: int | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(  # noqa: S603 - our own interpreter, or vllm-router
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: _pinned(core),  # noqa: PLW1509 - only sets the CPU affinity
    )


def _spawn(args: list[str], core: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    process = _start([sys.executable, *args], core)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline().decode() if ready else ""
    if not line.startswith("listening on "):
        process.kill()
        msg = f"{args} did not start: {line!r}"
        raise RuntimeError(msg)
    return process, line.removeprefix("listening on ").strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn_router(
    router: str, worker_url: str, core: int | None
) -> tuple[subprocess.Popen[bytes], str]:
    """vllm-router in P/D mode, prefill and decode on the one worker.

    It keeps one worker per URL, so prefill goes to ``localhost`` and decode to ``127.0.0.1``.
    """
    port = _free_port()
    worker_port = worker_url.rsplit(":", 1)[1]
    command = [
        router, "--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port", str(port),
        "--prefill", f"http://localhost:{worker_port}", "--decode", worker_url,
        "--policy", "round_robin", "--log-level", "error", "--disable-retries",
        "--disable-circuit-breaker", "--max-concurrent-requests", "1024",
        # its metrics listener's default port (29000) may be another program's
        "--prometheus-port", str(_free_port()),
    ]  # fmt: skip
    process = _start(command, core)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:  # noqa: PERF203 - a poll until the server listens
            if process.poll() is not None:
                break
            time.sleep(0.1)
        else:
            return process, f"http://127.0.0.1:{port}"
    process.kill()
    msg = f"{router} did not start"
    raise RuntimeError(msg)


def cpu_seconds(pid: int) -> float | None:
    """CPU time so far of a process and its children (psutil finds them; without it, the one).

    The scheduler's own count, in nanoseconds (``/proc/PID/task/*/schedstat``), where Linux
    keeps it: user plus system time comes in clock ticks (10 ms, a few percent of a round's
    CPU at c1). Else user plus system (psutil, else ``/proc``).
    """
    try:
        import psutil  # noqa: PLC0415 - the bench extra; /proc without it
    except ImportError:
        psutil = None
    pids = [pid]
    if psutil is not None:
        pids += [child.pid for child in psutil.Process(pid).children(recursive=True)]
    try:
        return sum(map(_scheduled_seconds, pids))
    except (OSError, ValueError, IndexError):
        pass  # no schedstat here: clock ticks
    if psutil is None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids)


def _scheduled_seconds(pid: int) -> float:
    """A process's time on a CPU, every thread's, from the scheduler's statistics."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
    if not tasks:
        raise OSError(pid)
    return sum(int(task.read_text().split()[0]) for task in tasks) / 1e9


@contextmanager
def servers(
    config_dir: Path, router: str | None, *, simulated: bool = False
) -> Iterator[dict[str, tuple[str, int]]]:
    """Each target's URL and process id; the worker pinned to the first core, the targets to the
    last (when there are two or more).

    The worker is ``fast_worker.py`` (the simulated worker's answers, recorded once and replayed
    pre-encoded), or with ``simulated`` the simulated worker itself.
    """
    processes = []
    config = config_dir / "one-call.json"
    config.write_bytes(orjson.dumps(_ONE_CALL_CONFIG))
    serve = ["-m", "disagg_transforms", "serve", "--port", "0"]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    worker_core, core = (cores[0], cores[-1]) if len(cores) > 1 else (None, None)
    try:
        worker_args = [__file__, "--worker"] if simulated else [str(_FAST_WORKER)]
        worker, worker_url = _spawn(worker_args, worker_core)
        processes.append(worker)
        urls = {WORKER: (worker_url, worker.pid)}
        for name, args in (
            (PASS_THROUGH, [__file__, "--passthrough", worker_url]),
            (ONE_CALL, [*serve, "--config", str(config), "--decode-url", worker_url]),
            # the default pipeline: render (on the decode worker), prefill, decode
            (GENERATE, [*serve, "--prefill-url", worker_url, "--decode-url", worker_url]),
            # the same legs in gateway mode: each call with its EPP-Profile, to the same worker
            (GATEWAY, [*serve, "--gateway-url", worker_url, "--render-url", worker_url]),
        ):
            process, url = _spawn(args, core)
            urls[name] = (url, process.pid)
            processes.append(process)
        if router is not None:
            process, url = _spawn_router(router, worker_url, core)
            urls[ROUTER] = (url, process.pid)
            processes.append(process)
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()


def measure(*, quick: bool, router: str | None, simulated: bool = False) -> list[Result]:
    rounds = 1 if quick else 2
    results = []
    with (
        tempfile.TemporaryDirectory() as config_dir,
        servers(Path(config_dir), router, simulated=simulated) as targets,
    ):
        for mode in ("whole", "stream"):
            payload = body(stream=mode == "stream")
            for url, _ in targets.values():  # warm up: connections, imports, caches
                asyncio.run(load(url + PATH, payload, 32, 16))
            for concurrency, counts in _COUNTS[quick].items():
                count = counts[mode == "stream"]
                runs: dict[str, list[Load]] = {name: [] for name in targets}
                cpu: dict[str, list[float]] = {name: [] for name in targets}
                for _ in range(rounds):
                    for name, (url, pid) in targets.items():
                        print(f"{mode}, {concurrency} in flight: {name}", file=sys.stderr)
                        before = cpu_seconds(pid)
                        runs[name].append(
                            asyncio.run(load(url + PATH, payload, count, concurrency))
                        )
                        after = cpu_seconds(pid)
                        if before is not None and after is not None:
                            cpu[name].append((after - before) / count * 1000)
                for name, measured in runs.items():
                    seconds = statistics.median(run.seconds for run in measured)
                    latencies = [value for run in measured for value in run.latencies]
                    firsts = [value for run in measured for value in run.first_chunks]
                    results.append(
                        Result(
                            name,
                            mode,
                            count / seconds,
                            percentile(latencies, 0.5) * 1000,
                            percentile(latencies, 0.99) * 1000,
                            statistics.median(cpu[name]) if cpu[name] else None,
                            concurrency,
                            percentile(firsts, 0.5) * 1000 if mode == "stream" else None,
                            measured[-1].events,
                        )
                    )
    return results


def sglang_bodies(answer_tokens: int, *, stream: bool) -> tuple[bytes, bytes]:
    """The chat request (``body``'s) and SGLang's own ``/generate`` one with the same prompt."""
    from disagg_transforms.testing import toy_encode  # noqa: PLC0415

    chat = orjson.loads(body(stream=stream))
    chat["max_tokens"] = answer_tokens
    content = chat["messages"][0]["content"]
    prompt = toy_encode(f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")
    generate = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": answer_tokens},
        "stream": stream,
        # what sglang-router writes over them; the decode worker called directly needs them
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": SG_BOOTSTRAP_PORT,
        "bootstrap_room": 1,
    }
    return orjson.dumps(chat), orjson.dumps(generate)


@contextmanager
def sglang_servers(router: Path | None, log_dir: Path) -> Iterator[dict[str, tuple[str, int]]]:
    """The fast SGLang prefill and decode (the first core), a vLLM render worker for `serve`, and
    `serve --engine sglang` and sglang-router before them (the last core): URLs and process ids.
    """
    processes: list[subprocess.Popen[bytes]] = []
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    worker_core, core = (cores[0], cores[-1]) if len(cores) > 1 else (None, None)
    fast = str(_FAST_WORKER)
    try:
        started = {}
        for role in ("prefill", "decode"):
            started[role] = _spawn([fast, "--sglang", role], worker_core)
        # the render worker's context fits a 1k prompt and an 8k answer
        started["render"] = _spawn(
            [fast, "--context", str(4 * SG_STREAMS["stream 8k"])], worker_core
        )
        processes += [process for process, _ in started.values()]
        prefill, decode, render = (started[role][1] for role in ("prefill", "decode", "render"))
        urls = {SG_WORKER: (decode, started["decode"][0].pid)}
        serve = [
            "-m", "disagg_transforms", "serve", "--port", "0", "--engine", "sglang",
            "--render-url", render, "--prefill-url", prefill, "--decode-url", decode,
            "--sglang-bootstrap-port", str(SG_BOOTSTRAP_PORT),
        ]  # fmt: skip
        process, url = _spawn(serve, core)
        processes.append(process)
        urls[SG_OURS] = (url, process.pid)
        with contextlib.ExitStack() as stack:
            if router is not None:
                # as vllm-router above: no retries, no circuit breaker, round robin
                extra = [
                    "--policy", "round_robin", "--disable-retries", "--disable-circuit-breaker",
                    "--max-concurrent-requests", "1024",
                ]  # fmt: skip
                gateway, url = stack.enter_context(
                    sglang_gateway.launched(
                        router,
                        prefill=prefill,
                        bootstrap_port=SG_BOOTSTRAP_PORT,
                        decode=decode,
                        log_path=log_dir / "sglang-router.log",
                        extra=extra,
                        core=core,
                    )
                )
                urls[SG_ROUTER] = urls[SG_ROUTER_GENERATE] = (url, gateway.pid)
            yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()


def _measured(name: str, mode: str, concurrency: int, runs: list[Load], cpu: list[float]) -> Result:
    count = len(runs[0].latencies)
    seconds = statistics.median(run.seconds for run in runs)
    latencies = [value for run in runs for value in run.latencies]
    firsts = [value for run in runs for value in run.first_chunks]
    return Result(
        name,
        mode,
        count / seconds,
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
        statistics.median(cpu) if cpu else None,
        concurrency,
        percentile(firsts, 0.5) * 1000 if mode != "whole" else None,
        runs[-1].events,
    )


def _sglang_plan(quick: bool) -> list[tuple[str, int, int, dict[str, tuple[str, bytes]]]]:
    """Each load: its mode, concurrency, requests per round, and each target's path and body."""
    counts = _SG_COUNTS[quick]
    chat, _ = sglang_bodies(MAX_TOKENS, stream=False)
    whole = {SG_OURS: (PATH, chat), SG_ROUTER: (PATH, chat)}
    plan = [("whole", concurrency, counts[concurrency], whole) for concurrency in CONCURRENCIES]
    for mode, tokens in SG_STREAMS.items():
        chat, generate = sglang_bodies(tokens, stream=True)
        sent = {
            SG_WORKER: ("/generate", generate),
            SG_OURS: (PATH, chat),
            SG_ROUTER_GENERATE: ("/generate", generate),
        }
        plan.append((mode, 1, counts[mode], sent))
    return plan


def measure_sglang(*, quick: bool, router: Path | None) -> list[Result]:
    """`serve --engine sglang` and sglang-router before the same fast SGLang pair.

    Whole answers (``MAX_TOKENS`` tokens) of the chat request at c1/c16/c64 through both;
    cumulative streams of 1k and 8k tokens at c1: `serve` gets the chat request (it turns
    SGLang's cumulative ``/generate`` events into chat deltas), sglang-router SGLang's own
    ``/generate`` request (it relays the same events as they are), the decode worker the same
    directly.
    """
    results = []
    with tempfile.TemporaryDirectory() as log_dir, sglang_servers(router, Path(log_dir)) as targets:
        for mode, concurrency, count, sent in _sglang_plan(quick):
            chosen = {name: sent[name] for name in sent if name in targets}
            for name, (path, payload) in chosen.items():  # warm up, the answers recorded
                asyncio.run(load(targets[name][0] + path, payload, 2, 1))
            runs: dict[str, list[Load]] = {name: [] for name in chosen}
            cpu: dict[str, list[float]] = {name: [] for name in chosen}
            reader: list[float] = []
            for _ in range(1 if quick else _SG_ROUNDS[mode]):
                for name, (path, payload) in chosen.items():
                    url, pid = targets[name]
                    print(f"sglang {mode}, {concurrency} in flight: {name}", file=sys.stderr)
                    before, own = cpu_seconds(pid), time.process_time()
                    runs[name].append(asyncio.run(load(url + path, payload, count, concurrency)))
                    after, own = cpu_seconds(pid), time.process_time() - own
                    if before is not None and after is not None:
                        cpu[name].append((after - before) / count * 1000)
                    if name == SG_WORKER:
                        reader.append(own / count * 1000)
            results += [
                _measured(name, mode, concurrency, runs[name], cpu[name]) for name in chosen
            ]
            if reader:
                results.append(_measured(SG_READER, mode, concurrency, runs[SG_WORKER], reader))
    return results


def _cpu_ratio(a: Result | None, b: Result | None, *, per_chunk: bool = False) -> float | None:
    if a is None or b is None:
        return None
    x, y = (a.cpu_us_per_chunk, b.cpu_us_per_chunk) if per_chunk else (a.cpu_ms, b.cpu_ms)
    return None if x is None or y is None or y == 0 else x / y


def _added_ttft(results: Sequence[Result], target: str) -> float | None:
    row, base = _row(results, target, "stream 1k", 1), _row(results, SG_WORKER, "stream 1k", 1)
    if row is None or base is None or row.ttft_p50_ms is None or base.ttft_p50_ms is None:
        return None
    return row.ttft_p50_ms - base.ttft_p50_ms


def sglang_floors(results: Sequence[Result], vllm: Sequence[Result]) -> str:
    """The SGLang figures the issue sets floors on (or has reported), each against its floor."""
    ours16 = _row(results, SG_OURS, "whole", 16)
    rows: list[tuple[str, float | None, str, float | None]] = [
        (
            ("`serve --engine sglang` (render, prefill, decode) / `serve` vLLM default (the same"
            " three calls), CPU per request, c16"),
            _cpu_ratio(ours16, _row(vllm, GENERATE, "whole", 16)), "<= 1.2x", 1.2,
        ),
        (
            "`serve --engine sglang` / sglang-router P/D, CPU per request, c16",
            _cpu_ratio(ours16, _row(results, SG_ROUTER, "whole", 16)), "reported", None,
        ),
        (
            "beside it: `serve` vLLM default / vllm-router P/D, CPU per request, c16",
            _cpu_ratio(_row(vllm, GENERATE, "whole", 16), _row(vllm, ROUTER, "whole", 16)),
            "reported", None,
        ),
        (
            "CPU per request c64 / c1, `serve --engine sglang`",
            _cpu_ratio(_row(results, SG_OURS, "whole", 64), _row(results, SG_OURS, "whole", 1)),
            "<= 1.5", 1.5,
        ),
    ]  # fmt: skip
    per_chunk = [
        (SG_OURS, "`serve --engine sglang` (chat deltas)", "<= 1.5x", 1.5),
        (SG_READER, f"beside it: {SG_READER}", "reported", None),
    ]
    rows += [
        (
            f"CPU per streamed chunk, {mode} cumulative, {label} / sglang-router (relayed), c1",
            _cpu_ratio(
                _row(results, target, mode, 1),
                _row(results, SG_ROUTER_GENERATE, mode, 1),
                per_chunk=True,
            ),
            floor, limit,
        )
        for target, label, floor, limit in per_chunk
        for mode in SG_STREAMS
    ]  # fmt: skip
    rows += [
        (
            (f"time to first chunk added by {target} over the decode worker, stream 1k, c1, p50"
            " (ms)"),
            _added_ttft(results, target), "reported", None,
        )
        for target in (SG_OURS, SG_ROUTER_GENERATE)
    ]  # fmt: skip
    lines = ["| figure | measured | floor | met? |", "|---|---|---|---|"]
    for name, value, floor, limit in rows:
        met = "-" if value is None or limit is None else ("yes" if value <= limit else "**no**")
        lines.append(f"| {name} | {_fmt(value)} | {floor} | {met} |")
    return "\n".join(lines)


def sglang_table(results: Sequence[Result], vllm: Sequence[Result]) -> str:
    """The SGLang figures, then the floors (docs/performance.md)."""
    lines = [
        (
            "| request | in flight | target | requests/s | p50 ms | p99 ms | first chunk p50 ms"
            " | CPU ms/request | chunks | CPU us/chunk |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.mode} | {r.concurrency} | {r.target} | {r.rps:.1f} | {r.p50_ms:.2f} | "
        f"{r.p99_ms:.2f} | {_fmt(r.ttft_p50_ms)} | {_fmt(r.cpu_ms)} | {r.chunks or '-'} | "
        f"{_fmt(r.cpu_us_per_chunk, 1)} |"
        for r in results
    ]
    return "\n".join(lines) + "\n\n" + sglang_floors(results, vllm)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: Sequence[Result]) -> str:
    direct = {(r.mode, r.concurrency): r for r in results if r.target == WORKER}
    lines = [
        (
            "| request | in flight | target | requests/s | p50 ms | p99 ms | added p50 ms"
            " | added p99 ms | added first chunk p50 ms | CPU ms/request | CPU us/chunk |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = direct[r.mode, r.concurrency]
        added = (
            ("-", "-", "-")
            if r.target == WORKER
            else (
                f"{r.p50_ms - base.p50_ms:.2f}",
                f"{r.p99_ms - base.p99_ms:.2f}",
                "-"
                if r.ttft_p50_ms is None or base.ttft_p50_ms is None
                else f"{r.ttft_p50_ms - base.ttft_p50_ms:.2f}",
            )
        )
        lines.append(
            f"| {r.mode} | {r.concurrency} | {r.target} | {r.rps:.0f} | {r.p50_ms:.2f} | "
            f"{r.p99_ms:.2f} | {added[0]} | {added[1]} | {added[2]} | {_fmt(r.cpu_ms)} | "
            f"{_fmt(r.cpu_us_per_chunk, 1)} |"
        )
    lines += [
        "",
        "| request | in flight | proxy / pass-through requests/s | floor | met? |",
        "|---|---|---|---|---|",
    ]
    for mode in ("whole", "stream"):
        for concurrency in sorted({r.concurrency for r in results}):
            by = {r.target: r for r in results if (r.mode, r.concurrency) == (mode, concurrency)}
            ratio, met = verdict(by[ONE_CALL].rps, by[PASS_THROUGH].rps)
            judged = "yes" if met else "**no**"
            lines.append(f"| {mode} | {concurrency} | {ratio:.2f} | >= {FLOOR} | {judged} |")
    return "\n".join(lines) + "\n\n" + floors(results)


def _row(results: Sequence[Result], target: str, mode: str, concurrency: int) -> Result | None:
    return next(
        (r for r in results if (r.target, r.mode, r.concurrency) == (target, mode, concurrency)),
        None,
    )


def floors(results: Sequence[Result]) -> str:
    """The figures the issue sets floors on, each against its floor."""

    def get(target: str, mode: str, concurrency: int) -> Result | None:
        return _row(results, target, mode, concurrency)

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else a / b

    def cpu(target: str, concurrency: int, mode: str = "whole") -> float | None:
        found = get(target, mode, concurrency)
        return None if found is None else found.cpu_ms

    def chunk(target: str) -> float | None:
        found = get(target, "stream", 16)
        return None if found is None else found.cpu_us_per_chunk

    def ttft(target: str) -> float | None:
        found = get(target, "stream", 1)
        return None if found is None else found.ttft_p50_ms

    generate_ttft, worker_ttft = ttft(GENERATE), ttft(WORKER)
    added_ttft = (
        None if generate_ttft is None or worker_ttft is None else generate_ttft - worker_ttft
    )
    rows = [
        ("`serve` default (3 calls) / pass-through (1 call), CPU per request, c16",
         ratio(cpu(GENERATE, 16), cpu(PASS_THROUGH, 16)), "<= 2.0x", 2.0),
        ("`serve` decode only / pass-through, CPU per request, c16",
         ratio(cpu(ONE_CALL, 16), cpu(PASS_THROUGH, 16)), "<= 0.8x", 0.8),
        ("`serve` default / vllm-router P/D, CPU per request, c16",
         ratio(cpu(GENERATE, 16), cpu(ROUTER, 16)), "<= 12x", 12.0),
        ("CPU per streamed chunk, `serve` decode only / vllm-router, c16",
         ratio(chunk(ONE_CALL), chunk(ROUTER)), "<= 4x", 4.0),
        ("CPU per request c64 / c1, `serve` default",
         ratio(cpu(GENERATE, 64), cpu(GENERATE, 1)), "<= 1.5", 1.5),
        ("time to first chunk added by `serve` default over the worker, c1, p50 (ms)",
         added_ttft, "<= 3 ms", 3.0),
        ("gateway mode / fixed URLs, `serve` default, CPU per request, c16",
         ratio(cpu(GATEWAY, 16), cpu(GENERATE, 16)), f"<= {GATEWAY_FLOOR:.2f}x", GATEWAY_FLOOR),
    ]  # fmt: skip
    lines = ["| figure | measured | floor | met? |", "|---|---|---|---|"]
    for name, value, floor, limit in rows:
        met = "-" if value is None else ("yes" if value <= limit else "**no**")
        lines.append(f"| {name} | {_fmt(value)} | {floor} | {met} |")
    return "\n".join(lines)


PROFILE = """\
**Where `serve`'s CPU goes** (a py-spy profile at 500 Hz of `serve`'s default pipeline at c16 on
the simulated worker, once `serve` called its workers with aiohttp; written when it was made, a
rerun keeps it). Whole answers, 1.4 ms a request: 45% is the sockets and the event loop
(uvicorn's writes to the client, aiohttp's to the worker, uvloop's reads and wake-ups), 21%
aiohttp's Python (building each call, parsing its answer, the pool), 17% the library (the
exchange, its legs and the envelope; the exchange alone, driven with in-memory answers, costs
about 0.22 ms a request), 6% Starlette's and uvicorn's Python, 6% `proxy.py` itself and 4% the
access log. Streams, 4.1 ms a request of 256 chunks: 41% the sockets and the loop, 28% the
library (the stream converter and the SSE parser), 18% aiohttp, 10% Starlette and uvicorn. Left
to cut in the exchange: the client's body is split into members, checked (size, depth) and
mapped three times a request, once by the exchange's check before its first call and once per
leg it builds (prefill, decode).
"""
"""Where the CPU went, by a profile made after the move to aiohttp (a rerun keeps it)."""


FIRST_CHUNK_PROFILE = """\
**Where `serve` default's first chunk goes** (a timeline of 300 and then 400 streams at c1 on the
fast worker, the worker noting when each call reaches it, every process on `SCHED_FIFO` so that no
other work's turn on the cores is counted; written when it was made, a rerun keeps it). The worker
alone gives its first chunk 0.35-0.38 ms after the client sends; through `serve` default it comes
3.0 ms after (p90 3.5): 0.8 ms from the client's send to the render call reaching the worker, 0.5
ms from there to the prefill call, 0.6 ms to the decode call and 1.0 ms from the decode call to
the client's first chunk. So `serve` adds 2.6-2.7 ms, about 0.6 ms for each call in a row (the
call built and sent, the worker's answer read, the exchange's next leg built). That meets 3 ms
only on cores that are not shared: on this machine each of the hops waits for its turn on a loaded
core, which is what the table's figure measures (two runs of this benchmark minutes apart gave 7.3
and 22.0 ms for it, vllm-router's 1.5 and 8.0 ms). What would meet it with room: fewer calls in a
row before the decode (render and prefill are two; a request the exchange need not render saves
one), and less Python per worker call and per leg.
Measured again at 8ff14ac the same way (every process on `SCHED_FIFO`; 200 streams through
each of two `serve` default processes, alternating with the worker alone): `serve` adds 1.87-1.89
ms p50 (the worker alone 0.27 ms), the same through this round's code; without `SCHED_FIFO`, at a
load average of 6 to 8 from other work, 5.6-6.0 ms. So the 3.34 ms of a benchmark run is the
machine's load, not `serve`'s own work.
"""
"""What the time to the first chunk at c1 is made of (a rerun keeps it)."""


GATEWAY_NOTE = """\
**Gateway mode costs nothing measurable.** `proxy (generate, gateway)` makes the same three calls as
`proxy (generate)`; what differs is one header, `EPP-Profile`, added to its prefill and decode
calls. Its floor is the spread of `serve` default's figure against a second, identical `serve`
default process (written when it was chosen, a rerun keeps it): on this machine, loaded (a load
average of 7 to 8 on its 2 CPUs), 20 pairs of rounds of whole answers at c16 (the three targets'
rounds interleaved, their order turned each round) gave the second process over the first 0.83x to
1.19x (median 0.99x, standard deviation 0.10) and gateway mode over fixed URLs 0.81x to 1.28x
(median 1.01x, standard deviation 0.10); over all of their rounds, two runs of 20, gateway mode came
to 0.94x and 1.05x of fixed URLs, the second process to 0.96x and 1.04x. Five runs of this benchmark
in the same half hour gave the figure 0.90x to 1.08x. One figure of two rounds cannot tell apart
costs under about 20% on a loaded machine, hence 1.20x; with no cost at all, it misses that floor in
about one run of 20 there, less on a quiet machine.
"""
"""How the gateway mode's floor was chosen (a rerun keeps it)."""


def first_chunk_note(results: Sequence[Result], *, simulated: bool = False) -> str:
    """What the time to the first chunk at c1 came to in this run's figures."""

    def added(target: str, mode: str) -> str:
        row, base = _row(results, target, mode, 1), _row(results, WORKER, mode, 1)
        if row is None or base is None:
            return "-"
        if mode == "whole":
            return f"{row.p50_ms - base.p50_ms:.1f}"
        if row.ttft_p50_ms is None or base.ttft_p50_ms is None:
            return "-"
        return f"{row.ttft_p50_ms - base.ttft_p50_ms:.1f}"

    worker = (
        "the simulated worker builds its whole stream before its first byte, and"
        if simulated
        else "the worker answers at once, but"
    )
    return textwrap.fill(
        f"**Time to the first chunk** at c1 is latency more than CPU here: {worker} every process"
        " here shares the machine's loaded cores with other work, so each hop costs what the"
        " scheduler gives it. In this run the pass-through, which only relays, adds"
        f" {added(PASS_THROUGH, 'stream')} ms to the first chunk and `serve` decode only"
        f" {added(ONE_CALL, 'stream')} ms; `serve` default adds {added(GENERATE, 'stream')} ms, its"
        " render and prefill calls coming before the decode (its whole answers at c1 add"
        f" {added(GENERATE, 'whole')} ms p50 for the three calls).",
        100,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _uvicorn_picks() -> str:
    """The event loop and HTTP parser uvicorn's ``auto`` settings pick here (the installed)."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} and {http}"


SGLANG_NOTE = """\
**What the stream figures compare.** A cumulative event repeats the whole text and every token ID so
far, so at 8k tokens the last events are about 60 KB each and the stream about 200 MB. The decode
worker's reply bytes are the same for both routers. sglang-router relays them to a `/generate`
client as they are. `serve` turns each into a chat delta: its SGLang reader cuts a read's events
and reads each in one pass, from where the last one's text ended (the bytes before compared with
the last event's): the line's end found first, the new text and the new token IDs before it (the
IDs checked to be numbers and skipped), `meta_info` decoded; no event is copied out of the read.
It hands each plain delta to the chat converter as its text, which the converter splices into bytes
made once per stream (docs/sglang.md, "The answers"). `serve`'s worker client holds up to 256 KB
of an answer unread (aiohttp's default, 64 KB, paused the decode's socket at 128 KB, so a 1k
stream came in about 41 reads, each one write to the client; now in about 11), and `serve` sends
the reply from the request's own task, the last write also ending the body (Starlette's
`StreamingResponse` ran a task group and a second task a reply under uvicorn's ASGI 2.3). In
process (`python benchmarks/sglang_stream.py`, 256 KB reads): 1.7 us an event at 1k tokens and
5.0 at 8k as the exchange relays it (1.9 and 5.0 at 9d2b7f6, before this round; 3.1 and 7.2 at
56fdd98); with logprobs 8.5 us an event at 1k tokens (44.5 before e1b8d98, where every position
of every event was decoded). Through `serve` on the fast pair, the benchmark's setup, `serve` and
sglang-router alternately (5 rounds of 32 1k streams, CPU from `/proc/PID/task/*/schedstat`,
the code at 9d2b7f6 and at 752a8ca, three runs each, on a loaded machine: load average 2 to 3
on its 2 CPUs): 1.59x, 1.65x and 1.64x sglang-router's CPU per chunk then, 1.47x, 1.50x and
1.51x after (6.1-6.2 us a chunk to 6.0-6.1, sglang-router's own 3.8-4.1); a 4-token stream,
the request's fixed cost, 1.45-1.57 ms of CPU then and 1.31-1.46 ms after. The CPU figures of
this benchmark are the scheduler's own count (`schedstat`, nanoseconds; clock ticks of 10 ms were
a few percent of a c1 round), and each SGLang stream figure the median of 5 rounds (a target's
CPU per chunk moved 10-20% between rounds of under a second). `aiohttp reader (reads only)` is
the load generator's own CPU reading the decode's stream with aiohttp (`serve`'s worker client)
and counting its events, and nothing else: about where any Python proxy on aiohttp starts. At 1k
tokens it costs about as much as sglang-router's whole relay (0.91-1.09x in these runs), so 1.5x
leaves a Python proxy 2 to 2.5 us a chunk for everything else; `serve` adds about that: the
chunk's share of the request's three calls (about 1.3 us: 1.3 ms a request over 1027 chunks) and
the relay in the library (1.7 us an event in process). That left the 1k floor at the edge (1.53x in
a run of this benchmark at 8ff14ac). Two costs outside the library were then found and cut
(alternating runs as above, two or three `serve` processes of each code at once, 6 rounds of 32
streams). aiohttp's `readany` took an answer's unread bytes one piece at a time, a piece per HTTP
chunk (an SGLang event is one), and resumed the connection's reading after each, which runs its
parser again: `serve` now joins the pieces a read finds before `readany` takes them (5.5-5.7 to
5.2-5.4 us a chunk). And in about one `serve` process in six (of about 50 started at 8ff14ac),
glibc's malloc gave the heap's top back to the system after each streamed request, the ~1 MB its
reads swing it by, and faulted it in again on the next: about 900 page faults a 1k stream, 6.4-6.8
us a chunk against 5.5-5.7 in the other processes of the same code, a third of it in the kernel
instead of a fifth. Where glibc leaves its thresholds (it moves them with the largest block freed so
far) depends on a process's history, so one run's figure depended on the process it got. Each
serving process now fixes them (`mallopt`: mmap from 1 MiB, trim past 8 MiB of free heap, above what
a read holds), and none of 27 processes since faulted so. sglang-router's own CPU per chunk 3.6-3.8
us; `serve`'s 1.38-1.43x of it after, 1.46-1.58x at 8ff14ac in the same runs; a 4-token stream, the
request's fixed cost, 1.37-1.40 ms of CPU, unchanged. What is left is aiohttp's and the server's own
work per read, write, event and request (aiohttp's Python runs three times an event as its parser
feeds it). At 8k tokens `serve` costs about what sglang-router does a chunk (0.95-1.07x in these
runs, 0.77-1.08x before).
"""
"""What the cumulative stream figures measure (a rerun keeps it)."""


def sglang_section(results: Sequence[Result], vllm: Sequence[Result]) -> str:
    """The SGLang part of the section: `serve --engine sglang` beside sglang-router."""
    if not results:
        return ""
    router = (
        f"sglang-router {sglang_gateway.VERSION} (SGLang's Rust gateway, the registry's, in its"
        " own venv) in P/D mode, no retries, no circuit breaker, round robin, as vllm-router above"
        if any(r.target == SG_ROUTER for r in results)
        else "sglang-router: not installed (skipped)"
    )
    about = textwrap.fill(
        "The same run, before one fast SGLang prefill and one fast decode (`fast_worker.py"
        " --sglang prefill|decode`: a simulated SGLang 0.5.23 pair meeting in process, its"
        " answers recorded once per kind and replayed; each request's `rid` and room do not"
        " change its kind), pinned to the first core."
        f" `{SG_OURS}`: `serve --engine sglang`, a vLLM render worker (`fast_worker.py --context"
        f" {SG_RENDER_CONTEXT}`) then the prefill and decode `/generate` legs sent at once, three"
        f" calls; `{SG_ROUTER}`: {router}, the chat request to both workers' own chat route, two"
        f' calls. "whole": the chat request of the table above ({MAX_TOKENS} tokens). The streams'
        " are SGLang's cumulative streams (every event repeats the text and the token IDs so far)"
        f" of 1k and 8k tokens at c1: `{SG_OURS}` gets the chat request and turns the events into"
        f" chat deltas; `{SG_ROUTER_GENERATE}` gets SGLang's own `/generate` request and relays"
        f" the same events as they are; `{SG_WORKER}` is that request sent to the decode"
        f" directly, and `{SG_READER}` the load generator's own CPU reading that stream with"
        " aiohttp (`serve`'s worker client) and counting its events (a search of each read for"
        ' "data:"), nothing converted or written: about where a Python proxy\'s CPU per chunk'
        " starts.",
        100,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return f"""
### SGLang: `serve --engine sglang` beside sglang-router

{about}

{sglang_table(results, vllm)}

{SGLANG_NOTE}"""


def section(
    results: Sequence[Result],
    command: str,
    *,
    simulated: bool = False,
    sglang: Sequence[Result] = (),
) -> str:
    router = "vllm-router P/D" if any(r.target == ROUTER for r in results) else "(not installed)"
    worker = textwrap.fill(
        (
            "One simulated worker answering at once, unpinned"
            if simulated
            else "One fast fake worker (`benchmarks/fast_worker.py`: the simulated worker's"
            " answers, recorded once per kind of request and replayed pre-encoded, a stream's"
            " first chunk at once and the others back to back) pinned to the first core"
        )
        + f" ({MAX_TOKENS}-token answers);",
        100,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return f"""{SECTION_START}
## The reference proxy against a pass-through and vllm-router

`{command}` ({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs
shared with other work, so treat the figures as indicative).
{worker}
each target its own process (tree) pinned to the last core: a minimal
pass-through proxy on Starlette + uvicorn, as `serve`, with an httpx worker client (`serve`'s is
aiohttp; uvicorn on {_uvicorn_picks()}, as installed for this run); `{ONE_CALL}`: `disagg-transforms
serve` decoding with `use_openai_format: true`, one worker call on the client's own route, like the
pass-through; `{GENERATE}`: `serve`'s default pipeline with a prefill URL: render, prefill, then a
text-mode generate decode wrapped into a `chat.completion`, three worker calls; `{GATEWAY}`:
the same in gateway mode, `--gateway-url` and `--render-url` both at the worker, which answers by
path and ignores each call's `EPP-Profile`; `{ROUTER}`:
{router}, prefill then decode, two calls. The request: `POST {PATH}`, one user message rendering to
{PROMPT_TOKENS} prompt tokens, `max_tokens` {MAX_TOKENS}; "whole": one JSON answer; "stream": the
worker's chunks, one a token. "Added" is the latency (and for streams the time to the first chunk)
over calling the worker directly. "CPU ms/request" is the CPU time of the target's process and its
children per request (the scheduler's count, `/proc/PID/task/*/schedstat`; the median of the
rounds); "CPU us/chunk" is a stream request's CPU over its chunks. CPU moves far less than
requests per second when the machine is shared.

{table(results)}
{sglang_section(sglang, results)}
{GATEWAY_NOTE}
{PROFILE}
{first_chunk_note(results, simulated=simulated)}

{FIRST_CHUNK_PROFILE}"""


def write(
    results: Sequence[Result],
    command: str = "python benchmarks/proxy.py",
    *,
    simulated: bool = False,
    sglang: Sequence[Result] = (),
) -> None:
    text = _DOC.read_text(encoding="utf-8")
    stacks = text[text.index(STACKS_SECTION_START) :] if STACKS_SECTION_START in text else ""
    if SECTION_START in text:
        text = text[: text.index(SECTION_START)].rstrip("\n") + "\n"
    _DOC.write_text(
        text
        + "\n"
        + section(results, command, simulated=simulated, sglang=sglang)
        + ("\n" + stacks if stacks else ""),
        encoding="utf-8",
    )


def passthrough(worker: str) -> None:
    """Serve the minimal pass-through: forward the body, relay the answer as it comes."""

    import httpx  # noqa: PLC0415
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.background import BackgroundTask  # noqa: PLC0415
    from starlette.requests import Request  # noqa: PLC0415
    from starlette.responses import Response, StreamingResponse  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    http = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None), trust_env=False)

    async def forward(request: Request) -> Response:
        upstream = http.build_request(
            "POST",
            worker + request.url.path,
            content=await request.body(),
            headers={"content-type": "application/json"},
        )
        answer = await http.send(upstream, stream=True)
        kind = answer.headers["content-type"]
        if not kind.startswith("text/event-stream"):  # a whole answer goes back whole
            content = await answer.aread()
            return Response(content, status_code=answer.status_code, media_type=kind)
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers={"content-type": kind},
            background=BackgroundTask(answer.aclose),
        )

    serve_announced(Starlette(routes=[Route("/{path:path}", forward, methods=["POST"])]))


def serve_announced(app: Any, **settings: Any) -> None:  # noqa: ANN401 - any ASGI app
    """Serve ``app`` with uvicorn on a free port; print the readiness line once it listens.

    A long keep-alive: an idle pooled connection the server closes just as a client reuses it
    would fail that request (a race of the set-up, not of what is measured).
    """
    import uvicorn  # noqa: PLC0415

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))

    class Ready(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)

    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=600, **settings
    )
    Ready(config).run(sockets=[sock])


def serve_worker() -> None:
    """Serve the simulated worker, its answer ``MAX_TOKENS`` tokens long."""
    serve_announced(simulated_worker())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, one round")
    parser.add_argument("--no-write", action="store_true", help="leave docs/performance.md")
    parser.add_argument(
        "--vllm-router", metavar="PATH", help="the vllm-router program (default: on the PATH)"
    )
    parser.add_argument(
        "--simulated-worker",
        action="store_true",
        help="call the simulated worker itself, not fast_worker.py's replay of its answers",
    )
    parser.add_argument(
        "--no-sglang",
        action="store_true",
        help="leave out `serve --engine sglang` and sglang-router",
    )
    parser.add_argument("--passthrough", metavar="WORKER_URL", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.passthrough:
        passthrough(args.passthrough)
        return 0
    if args.worker:
        serve_worker()
        return 0
    router = args.vllm_router or shutil.which("vllm-router")
    if router is None:
        print("vllm-router is not installed (pip install vllm-router): skipped", flush=True)
    results = measure(quick=args.quick, router=router, simulated=args.simulated_worker)
    print(table(results))
    sglang: list[Result] = []
    if not args.no_sglang:
        gateway = sglang_gateway.router_python()
        if isinstance(gateway, str):
            print(f"sglang-router: {gateway}: skipped", flush=True)
        sglang = measure_sglang(
            quick=args.quick, router=None if isinstance(gateway, str) else gateway
        )
        print(sglang_table(sglang, results))
    if not args.no_write:
        flags = " --quick" * args.quick + " --simulated-worker" * args.simulated_worker
        flags += " --no-sglang" * args.no_sglang
        write(
            results,
            f"python benchmarks/proxy.py{flags}",
            simulated=args.simulated_worker,
            sglang=sglang,
        )
    return (
        0
        if all(
            verdict(
                next(
                    r.rps
                    for r in results
                    if (r.mode, r.concurrency, r.target) == (mode, 16, ONE_CALL)
                ),
                next(
                    r.rps
                    for r in results
                    if (r.mode, r.concurrency, r.target) == (mode, 16, PASS_THROUGH)
                ),
            )[1]
            for mode in ("whole", "stream")
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
