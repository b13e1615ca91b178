"""sglang-router 0.3.2, SGLang's Rust gateway, in P/D mode: the peer of ``serve --engine sglang``.

The registry's ``sglang-router==0.3.2`` is installed with pip into its own venv outside the tree
(``~/.cache/disagg-sglang-router/venv``, or ``$DISAGG_SGLANG_ROUTER_CACHE``), once; it is a Python
launcher around a Rust extension, so it never shares an interpreter with the library. Used by
``tests/test_sglang_router_peer.py`` and ``benchmarks/proxy.py`` (docs/performance.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

VERSION = "0.3.2"
CACHE = Path(
    os.environ.get("DISAGG_SGLANG_ROUTER_CACHE", Path.home() / ".cache" / "disagg-sglang-router")
)
_READY_TIMEOUT = 60.0


def _installed(python: Path) -> bool:
    if not python.exists():
        return False
    check = "import importlib.metadata as m; print(m.version('sglang-router'))"
    done = subprocess.run(  # noqa: S603 - the venv's own interpreter, fixed arguments
        [str(python), "-c", check], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout.strip() == VERSION


def router_python() -> Path | str:
    """The venv interpreter that runs sglang-router 0.3.2, installed if missing; else why not."""
    venv = CACHE / "venv"
    python = venv / "bin" / "python"
    if _installed(python):
        return python
    steps = (
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", f"sglang-router=={VERSION}"],
    )
    for step in steps:
        try:
            done = subprocess.run(  # noqa: S603 - our interpreter or the venv's, fixed arguments
                step, capture_output=True, text=True, timeout=900, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"installing sglang-router=={VERSION} failed: {error}"
        if done.returncode:
            return f"installing sglang-router=={VERSION} failed: {done.stderr.strip()[-300:]}"
    return python if _installed(python) else f"sglang-router=={VERSION} did not install"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ready(url: str, workers: int) -> bool:
    try:
        listed = httpx.get(f"{url}/workers", timeout=2).json().get("workers", [])
    except (httpx.HTTPError, ValueError):
        return False
    return len(listed) == workers and all(worker.get("is_healthy") for worker in listed)


@contextmanager
def launched(  # noqa: PLR0913 - the router's P/D set-up, all by keyword
    python: Path,
    *,
    prefill: str,
    bootstrap_port: int,
    decode: str,
    log_path: Path,
    extra: Sequence[str] = (),
    core: int | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """sglang-router in P/D mode in front of one prefill and one decode: its process and URL.

    Its defaults otherwise (policy cache_aware, 5 retries, circuit breaker on), as SGLang's users
    run it; ``extra`` adds flags. ``core``: pinned to that CPU (``taskset``), as the benchmark
    pins each target.
    """
    port = free_port()
    command = [
        str(python), "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--prefill", prefill, str(bootstrap_port), "--decode", decode,
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
        "--worker-startup-check-interval", "1", "--log-level", "warn", *extra,
    ]  # fmt: skip
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - the venv's interpreter, our arguments
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not _ready(url, workers=2):
            if process.poll() is not None or time.monotonic() > deadline:
                msg = f"sglang-router did not start; log:\n{log_path.read_text(errors='replace')}"
                raise RuntimeError(msg)
            time.sleep(0.2)
        yield process, url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
