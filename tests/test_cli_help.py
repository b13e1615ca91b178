"""What the command line says to a user who reads its help and its refusals (processes)."""

from __future__ import annotations

import socket
import subprocess

import pytest
from proxy_helpers import command, environment

pytest.importorskip("uvicorn")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own interpreter and command
        command(*args), capture_output=True, text=True, timeout=60, env=environment(), check=False
    )


def _help(*args: str) -> str:
    done = _run(*args, "--help")
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # argparse wraps at the terminal's width


@pytest.mark.parametrize("args", [(), ("check-config",), ("serve",)])
def test_help_names_llm_d_coordinator_document(args: tuple[str, ...]) -> None:
    assert "llm-d's coordinator YAML" in _help(*args)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("serve",), "--workers N server processes (default: 1)"),
        (("serve",), "--host HOST the address to listen on (default: 127.0.0.1"),
        (("serve",), "0 picks a free port (default: 8000"),
        (("simulate",), "--port PORT 0 picks a free port (default: 8100)"),
        (("simulate",), "--host HOST (default: 127.0.0.1)"),
        (("simulate",), "with --gateway: workers per pool (default: 1)"),
        (("simulate",), "(default: round-robin)"),
        (("simulate",), "seconds between stream events (default: 0.0)"),
    ],
)
def test_help_shows_each_flags_default(args: tuple[str, ...], says: str) -> None:
    assert says in _help(*args)


def test_gateway_without_render_url_says_what_to_pass() -> None:
    done = _run("serve", "--gateway-url", "http://127.0.0.1:9", "--port", "0")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("disagg-transforms: error: --render-url: ")
    assert "pass --render-url URL" in line
    assert "use_openai_format: true" in line  # or no render at all


def test_a_missing_decode_url_is_reported_before_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        done = _run("serve", "--port", port)
    assert done.returncode == 2
    assert done.stderr == (
        "disagg-transforms: error: decode: the pipeline has a decode step but no --decode-url\n"
    )
