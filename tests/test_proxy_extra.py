"""The ``proxy`` extra alone runs the proxy, with nothing its HTTP stack tries to import missing.

A module aiohttp, anyio, starlette or uvicorn tries on each request and the extra does not
install fails to import every time (a failed import is not cached), at the cost of a path search:
httpcore, the proxy's worker client before aiohttp, tried ``sniffio`` on each use of its pool
(docs/performance.md). CI (.ci/run)
builds a venv holding only ``disagg_transforms[proxy]`` from the wheel and names its interpreter
in ``DISAGG_TRANSFORMS_PROXY_PYTHON``; without it the probe runs under this interpreter only,
which checks the serving but not what the extra declares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROBE = Path(__file__).with_name("proxy_extra_probe.py")
PROXY_PYTHON = os.environ.get("DISAGG_TRANSFORMS_PROXY_PYTHON")
only_the_extra = pytest.mark.skipif(
    PROXY_PYTHON is None, reason="CI names a venv holding only the proxy extra"
)


def _run(python: str, *args: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(  # noqa: S603 - an interpreter this suite was given
        [python, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _probe(python: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(_run(python, str(PROBE)).splitlines()[-1])
    return report


@pytest.mark.parametrize(
    "python",
    [
        pytest.param(sys.executable, id="this-interpreter"),
        pytest.param(PROXY_PYTHON or "", id="proxy-extra-only", marks=only_the_extra),
    ],
)
def test_serving_whole_and_streamed_answers_imports_nothing_missing(python: str) -> None:
    report = _probe(python)
    assert report["statuses"] == [200, 200, 200, 200], report
    assert report["last_event"] == "data: [DONE]"
    assert report["not_found"] == []
    assert report["exit"] == 0


@only_the_extra
def test_the_proxy_venv_holds_the_extra_and_not_the_test_tools() -> None:
    assert PROXY_PYTHON is not None
    found = _run(
        PROXY_PYTHON,
        "-c",
        "import importlib.util as u; print(*(m for m in"
        " ('aiohttp', 'yaml', 'httpx', 'pytest', 'openai', 'litellm') if u.find_spec(m)))",
    )
    # Without httpx: nothing the proxy or the simulated worker runs needs it. With PyYAML: the
    # coordinator seat reads its document as YAML.
    assert found.split() == ["aiohttp", "yaml"]


@only_the_extra
def test_the_proxy_extra_alone_reads_the_coordinator_seats_yaml() -> None:
    assert PROXY_PYTHON is not None
    configmap = Path(__file__).parent.parent / "deploy" / "coordinator" / "configmap.yaml"
    out = _run(PROXY_PYTHON, "-m", "disagg_transforms", "check-config", str(configmap))
    assert out.splitlines()[0] == "valid"
