"""SIGTERM on ``serve``, one process and several: new connections refused, streams drained.

``serve`` and a slow ``simulate`` worker run as subprocesses. No verdict rests on how fast the
machine is: the connection attempts after SIGTERM are judged by their order (once one is
refused, every later one is), not by when the refusals start.
"""

from __future__ import annotations

import pathlib
import signal
import socket
import time

import pytest
from proxy_helpers import read_stream, running, start, wait_ready

pytest.importorskip("uvicorn")

STREAM_DELAY = "1"  # seconds between the worker's events: a chat stream lasts about 7 s
REFUSALS = 5  # refusals in a row after the first one that end the attempts
REQUEST = b"GET /health HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n"


def attempt(port: int) -> str:
    """One new connection and one request: ``answered``, ``refused`` or ``broken``.

    ``broken`` is a connection the server accepted and then closed or reset without answering.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(REQUEST)
            answer = sock.recv(64)
    except ConnectionRefusedError:
        return "refused"
    except (ConnectionResetError, BrokenPipeError):
        return "broken"
    return "answered" if answer.startswith(b"HTTP/1.1 ") else "broken"


def attempts_after_sigterm(port: int) -> list[str]:
    """Attempts until ``REFUSALS`` more after the first refusal (at most 60 s of them)."""
    outcomes: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        outcomes.append(attempt(port))
        if "refused" in outcomes and len(outcomes) - outcomes.index("refused") > REFUSALS:
            break
        time.sleep(0.05)
    return outcomes


@pytest.mark.parametrize("workers", ["1", "4"])
def test_sigterm_refuses_new_connections_and_drains_the_streams_in_flight(
    workers: str, tmp_path: pathlib.Path
) -> None:
    worker_args = ["simulate", "--port", "0", "--stream-delay", STREAM_DELAY]
    with running((worker_args, tmp_path / "worker.log")) as (worker,):
        args = ["serve", "--port", "0", "--workers", workers, "--decode-url", worker.url]
        server = wait_ready(start(args, tmp_path / "serve.log"))
        try:
            port = int(server.url.rsplit(":", 1)[1])
            # Every process accepting: one still starting would hold connections unanswered
            # in the listening socket's backlog, which closing it resets (docs/proxy.md).
            deadline = time.monotonic() + 60
            while server.log().count("Application startup complete.") < int(workers):
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.1)
            body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
            reader = read_stream(server.url + "/v1/chat/completions", body, timeout=60)
            assert reader.first.wait(30)
            server.process.send_signal(signal.SIGTERM)
            outcomes = attempts_after_sigterm(port)
            stream_in_flight = reader.thread.is_alive()
            reader.thread.join(60)
            assert server.process.wait(timeout=60) == 0
        finally:
            server.stop()
    assert "refused" in outcomes, outcomes
    first_refusal = outcomes.index("refused")
    assert set(outcomes[first_refusal:]) == {"refused"}, outcomes
    # Answered until then, but for the attempt that may have been waiting in the socket's queue
    # as the last process closed it: the kernel resets those (docs/proxy.md).
    assert "broken" not in outcomes[: first_refusal - 1], outcomes
    # The refusals came while the stream still ran: at once, not once the drain was over.
    assert stream_in_flight, outcomes
    text = reader.text()
    assert text.endswith("data: [DONE]\n\n"), text
    assert '"finish_reason":"stop"' in text
