"""Start ``disagg-transforms serve`` / ``simulate`` as subprocesses and wait for them.

``served`` runs an ASGI app (a test's own worker) on a uvicorn server in a thread instead;
``by_host`` serves several from one server (one event loop), told apart by the request's host.

Each process is started with this interpreter (``python -m disagg_transforms``), so the tests run
the same package they import: the source tree, or the installed wheel in CI. It binds
``--port 0`` and announces its real port on its readiness line; stderr (the access log) goes
to a file a test can read at any time.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import disagg_transforms

PACKAGE_ROOT = str(pathlib.Path(disagg_transforms.__file__).parent.parent)
READY_TIMEOUT = 30.0
PREFIX = "listening on "


@dataclass
class Server:
    """A started ``serve`` or ``simulate`` process."""

    process: subprocess.Popen[bytes]
    log_path: pathlib.Path
    url: str = ""

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> str:
        """The log once it contains ``text``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while text not in (log := self.log()):
            if time.monotonic() > deadline:
                msg = f"{text!r} not in the log after {timeout}s:\n{log}"
                raise AssertionError(msg)
            time.sleep(0.05)
        return log

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not exit within 10 s; the exit code.

        The SIGKILL goes to the process group the server leads, so that the worker processes of
        ``--workers N``, which a killed parent cannot stop, go with it.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "disagg_transforms", *args]


def refused(*args: str) -> str:
    """The one line ``serve ARGS --port 0`` stops with (exit code 2)."""
    done = subprocess.run(  # noqa: S603 - our own interpreter and command
        command("serve", *args, "--port", "0"),
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    return line


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return env


def start(args: Sequence[str], log_path: pathlib.Path) -> Server:
    """Start ``python -m disagg_transforms ARGS`` (not waiting for it), leading its own group."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and command
            command(*args),
            stdout=subprocess.PIPE,
            stderr=log,
            env=environment(),
            start_new_session=True,
        )
    return Server(process, log_path)


def wait_ready(server: Server, timeout: float = READY_TIMEOUT) -> Server:
    """Read the readiness line; the server's URL. Fails (and kills it) after ``timeout``."""
    stdout = server.process.stdout
    assert stdout is not None
    ready, _, _ = select.select([stdout], [], [], timeout)
    line = stdout.readline().decode() if ready else ""
    if not line.startswith(PREFIX):
        server.stop()
        msg = f"no readiness line (got {line!r}); log:\n{server.log()}"
        raise AssertionError(msg)
    server.url = line[len(PREFIX) :].strip()
    return server


@contextmanager
def running(*commands: tuple[Sequence[str], pathlib.Path]) -> Iterator[list[Server]]:
    """Start every command at once, wait until each is ready; stop them all at the end."""
    servers: list[Server] = []
    try:
        servers.extend(start(args, log) for args, log in commands)
        yield [wait_ready(server) for server in servers]
    finally:
        for server in servers:
            server.stop()


@contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` on a uvicorn server in a thread of this process; its URL."""
    import uvicorn  # noqa: PLC0415 - only the tests that serve an app need it

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def by_host(apps: Mapping[str, Any]) -> Any:
    """One ASGI app serving each of ``apps`` to the host its key names (``127.0.0.1``,
    ``localhost``): SGLang workers that meet in process share one event loop."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        host = dict(scope["headers"]).get(b"host", b"").decode().partition(":")[0]
        await apps[host](scope, receive, send)

    return app


def held_back(app: Any, seconds: float) -> Any:
    """``app`` whose answer is sent ``seconds`` after it is written (a late prefill)."""

    async def late(scope: Any, receive: Any, send: Any) -> None:
        held: list[Any] = []

        async def hold(message: Any) -> None:
            held.append(message)

        await app(scope, receive, hold)
        await asyncio.sleep(seconds)
        for message in held:
            await send(message)

    return late


@dataclass
class StreamRead:
    """A client's stream read in a thread: the chunks so far, set ``first`` at the first."""

    thread: threading.Thread
    chunks: list[bytes]
    first: threading.Event

    def text(self) -> str:
        return b"".join(self.chunks).decode()


def read_stream(url: str, body: dict[str, Any], timeout: float) -> StreamRead:
    """POST ``body`` with ``stream: true`` to ``url``; the stream is read in a started thread."""
    import httpx  # noqa: PLC0415 - only the tests that stream need it

    chunks: list[bytes] = []
    first = threading.Event()

    def run() -> None:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=timeout) as stream:
            for chunk in stream.iter_bytes():
                chunks.append(chunk)
                first.set()

    thread = threading.Thread(target=run)
    thread.start()
    return StreamRead(thread, chunks, first)
