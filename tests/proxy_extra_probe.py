"""Serve ``serve --simulate`` in this process, send it requests, report what failed to import.

Run by tests/test_proxy_extra.py, under a venv holding only ``disagg_transforms[proxy]``: the
server and the client run in this one process, and a finder placed last on ``sys.meta_path``
records every module no other finder found (a failed import is not cached, so a module the
HTTP stack tries on each request and that the extra does not install costs a path search every
time: docs/performance.md). Prints one JSON line: the statuses, the streamed answer's last
event, and the modules not found after the server started.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
from typing import Any

from disagg_transforms._cli.main import main

_REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


class _NotFound:
    """The last finder on ``sys.meta_path``: it sees only the imports every other one missed."""

    recording = False
    names: list[str] = []  # noqa: RUF012 - one recorder per process

    @classmethod
    def find_spec(cls, name: str, *_: object) -> None:
        if cls.recording:
            cls.names.append(name)


class _Announced:
    """Stands in for stdout: catches the server's readiness line."""

    def __init__(self) -> None:
        self.url = ""
        self.ready = threading.Event()

    def write(self, text: str) -> int:
        if text.startswith("listening on "):
            self.url = text.removeprefix("listening on ").strip()
            self.ready.set()
        return len(text)

    def flush(self) -> None:
        pass


def _post(port: int, body: dict[str, Any]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
        )
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _client(announced: _Announced, report: dict[str, Any]) -> None:
    try:
        if not announced.ready.wait(30):
            report["error"] = "the server did not start"
            return
        port = int(announced.url.rsplit(":", 1)[1])
        _NotFound.recording = True
        statuses = []
        for stream in (False, True, False, True):  # twice: the second use of a pooled connection
            status, content = _post(port, {**_REQUEST, "stream": stream})
            statuses.append(status)
        _NotFound.recording = False
        report["statuses"] = statuses
        report["last_event"] = content.strip().rsplit(b"\n", 1)[-1].decode()
        report["not_found"] = sorted(set(_NotFound.names))
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # serve drains and exits


def run() -> dict[str, Any]:
    sys.meta_path.append(_NotFound)
    announced = _Announced()
    report: dict[str, Any] = {}
    client = threading.Thread(target=_client, args=(announced, report))
    client.start()
    stdout, sys.stdout = sys.stdout, announced
    try:
        report["exit"] = main(["serve", "--simulate", "--port", "0"])
    finally:
        sys.stdout = stdout
        client.join()
    return report


if __name__ == "__main__":
    print(json.dumps(run()))  # noqa: T201 - the report for the test
