"""A long mixed load through ``serve``: does the proxy's memory level off?

Usage: ``python benchmarks/soak.py [--requests 50000] [--concurrency 32] [--workers 1]``.
Starts a simulated worker (``disagg-transforms simulate``, its own process, so that its call
log, which grows with every call, is not counted) and ``serve`` pointed at it for prefill and
decode. A load generator in this process (aiohttp) sends every client API (chat, completions,
responses, messages, generate), whole and streamed, with some bad bodies and some worker faults
(the ``x-simulate-fault`` header), ``--concurrency`` at a time. Every ``--every`` requests it
reads the resident memory (VmRSS) of each serving process of the proxy (the ``serve`` process,
or its ``--workers`` children) and of the worker, and prints a row. At the end: the proxy's RSS
after the warm-up (``--warmup`` requests) against its RSS at the end; the run fails (exit 1)
when any serving process grew by more than 10%. Figures and command: docs/performance.md.
The environment is passed on to the servers (try ``MALLOC_ARENA_MAX=2``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import orjson

_ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.10
"""The largest growth from the warm-up to the end allowed (a fraction of the warm-up RSS)."""

_USER = [{"role": "user", "content": "Tell me a story about a fox and a dog."}]
_CALLS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("chat", "/v1/chat/completions", {"model": "m", "messages": _USER, "max_tokens": 32}),
    ("completions", "/v1/completions", {"model": "m", "prompt": "Once", "max_tokens": 32}),
    ("responses", "/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 32}),
    ("messages", "/v1/messages", {"model": "m", "messages": _USER, "max_tokens": 32}),
    (
        "generate",
        "/inference/v1/generate",
        {"model": "m", "token_ids": [1072, 1105, 108], "sampling_params": {"max_tokens": 32}},
    ),
)
_FAULTS = ("http-500", "cut-stream", "stream-error", "not-json", "slow-first-byte")


def mix() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """One round of the load: (kind, path, body, headers); 40 requests, repeated in turn.

    Each API whole and streamed, three times (30), one body that is not JSON and one that the
    API refuses (2 more each round, varying the API), and five worker faults over the APIs.
    """
    round_: list[tuple[str, str, bytes, dict[str, str]]] = []
    for _ in range(3):
        for name, path, body in _CALLS:
            round_.append((name, path, orjson.dumps(body), {}))
            streamed = orjson.dumps({**body, "stream": True})
            round_.append((f"{name} stream", path, streamed, {}))
    for index, (_, path, body) in enumerate(_CALLS):
        round_.append(("bad: not JSON", path, b'{"model": "m", ', {}))
        if index % 2:
            refused = {**body, "max_tokens": "many"}
            round_.append(("bad: refused", path, orjson.dumps(refused), {}))
    for fault, (_, path, body) in zip(_FAULTS, _CALLS, strict=True):
        streamed = orjson.dumps({**body, "stream": True})
        round_.append((f"fault {fault}", path, streamed, {"x-simulate-fault": fault}))
    return round_


def rss_mb(pid: int) -> float:
    """The resident set size of process ``pid`` in MB (Linux: /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    msg = f"no VmRSS for process {pid}"
    raise RuntimeError(msg)


def serving_pids(pid: int) -> list[int]:
    """The processes that serve requests: ``pid`` itself, or its workers (``--workers N``).

    The workers are the children multiprocessing spawned (not its resource tracker).
    """
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = [
        int(child)
        for child in children
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]
    return workers or [pid]


@contextmanager
def spawned(args: Sequence[str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m disagg_transforms ARGS``, once it is ready; SIGTERM at the end."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and command
        [sys.executable, "-m", "disagg_transforms", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline().decode() if ready else ""
        if not line.startswith("listening on "):
            msg = f"{args[0]} did not start: {line!r}"
            raise RuntimeError(msg)
        yield process, line.removeprefix("listening on ").strip()
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def soak(  # noqa: PLR0913 - the run's settings
    url: str,
    *,
    requests: int,
    concurrency: int,
    every: int,
    proxy: int,
    worker: int,
) -> list[tuple[int, float, list[float], float]]:
    """Send the mix; rows of (requests done, seconds, proxy RSS per process, worker RSS)."""
    import aiohttp  # noqa: PLC0415 - only the load generator needs it (the bench extra)

    calls = mix()
    statuses: collections.Counter[tuple[str, int | str]] = collections.Counter()
    rows: list[tuple[int, float, list[float], float]] = []
    done = 0
    started = time.monotonic()
    next_index = 0
    pids = serving_pids(proxy)

    def sample() -> None:
        row = (done, time.monotonic() - started, [rss_mb(p) for p in pids], rss_mb(worker))
        rows.append(row)
        cells = " ".join(f"{mb:8.1f}" for mb in row[2])
        print(f"{row[0]:>8} {row[1]:8.0f}s  proxy MB {cells}   worker MB {row[3]:8.1f}", flush=True)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal done, next_index
        while next_index < requests:
            kind, path, body, headers = calls[next_index % len(calls)]
            next_index += 1
            try:
                async with session.post(url + path, data=body, headers=headers) as answer:
                    await answer.read()
                    statuses[kind, answer.status] += 1
            except aiohttp.ClientError as error:
                statuses[kind, type(error).__name__] += 1
            done += 1
            if done % every == 0:
                sample()

    sample()
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as s:
        await asyncio.gather(*(one(s) for _ in range(concurrency)))
    print("\nanswers (kind, status: count):")
    for (kind, status), count in sorted(statuses.items(), key=str):
        print(f"  {kind:<28} {status!s:<16} {count}")
    return rows


def verdict(rows: Sequence[tuple[int, float, list[float], float]], warmup: int) -> bool:
    """Print the warm-up and end RSS of each proxy process; whether each grew within 10%."""
    after_warmup = next(row for row in rows if row[0] >= warmup)
    end = rows[-1]
    good = True
    print(f"\nproxy RSS after {after_warmup[0]} requests and at the end ({end[0]}):")
    for index, (first, last) in enumerate(zip(after_warmup[2], end[2], strict=True)):
        growth = (last - first) / first
        within = growth <= TOLERANCE
        good = good and within
        print(
            f"  process {index}: {first:.1f} MB -> {last:.1f} MB ({growth:+.1%}) "
            f"{'within' if within else 'NOT within'} {TOLERANCE:.0%}"
        )
    return good


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers")
    parser.add_argument("--every", type=int, default=2_500, help="requests between samples")
    parser.add_argument("--warmup", type=int, default=5_000, help="requests before the baseline")
    args = parser.parse_args(argv)
    if args.warmup >= args.requests:
        parser.error("--warmup must be less than --requests")
    # Stopped by a signal, the run still stops the servers it started (``spawned``'s finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    simulate = ["simulate", "--port", "0", "--first-byte-delay", "0.01"]
    with spawned(simulate) as (worker, worker_url):
        serve = ["serve", "--port", "0", "--workers", str(args.workers)]
        serve += ["--prefill-url", worker_url, "--decode-url", worker_url]
        with spawned(serve) as (proxy, url):
            time.sleep(1)  # --workers N: the children are up once they answer; give them a moment
            print(f"proxy {url} (pid {proxy.pid}), worker {worker_url} (pid {worker.pid})")
            print(f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', '(unset)')}")
            rows = asyncio.run(
                soak(
                    url,
                    requests=args.requests,
                    concurrency=args.concurrency,
                    every=args.every,
                    proxy=proxy.pid,
                    worker=worker.pid,
                )
            )
    return 0 if verdict(rows, args.warmup) else 1


if __name__ == "__main__":
    sys.exit(main())
