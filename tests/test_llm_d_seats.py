"""llm-d's seats as docs/llm-d.md starts them: the shipped documents and commands, as processes."""

from __future__ import annotations

import fnmatch
import shlex
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from proxy_helpers import Server, command, environment, running, served

from disagg_transforms.testing import SimulatedGateway

pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parent.parent
CONFIGMAP = ROOT / "deploy" / "coordinator" / "configmap.yaml"
PLACEHOLDER = "http://${GATEWAY_SERVICE}.${NAMESPACE}.svc:80"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own interpreter and command
        command(*args), capture_output=True, text=True, timeout=60, env=environment(), check=False
    )


def _refusal(*args: str) -> str:
    done = _run(*args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    [line] = [line for line in done.stderr.splitlines() if ": warning: " not in line]
    return line


def _coordinator(tmp_path: Path, gateway: str) -> Path:
    path = tmp_path / "coordinator.yaml"
    document = {
        "gateway": {"address": gateway},
        "pipeline": {"steps": [{"type": "prefill"}, {"type": "decode"}]},
    }
    path.write_text(yaml.safe_dump(document))
    return path


# -- the document docs/llm-d.md names --------------------------------------------------------


def test_check_config_reads_the_shipped_configmaps_coordinator_document() -> None:
    done = _run("check-config", str(CONFIGMAP))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "valid"
    assert "document             llm-d coordinator config" in lines
    assert "gateway              http://inference-gateway:80" in lines
    assert "metadata" not in done.stderr
    assert "unknown" not in done.stderr


def test_a_configmap_without_a_coordinator_document_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    configmap = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}}
    path.write_text(yaml.safe_dump(configmap))
    line = _refusal("check-config", str(path))
    assert line == (
        f"disagg-transforms: error: {path}: a ConfigMap whose data has no coordinator.yaml "
        "(it has: a, b)"
    )


def test_an_unknown_top_level_key_names_both_accepted_documents(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"metadata": {"name": "x"}, "steps": {"decode": {}}}))
    line = _refusal("check-config", str(path))
    assert line.startswith(f'{path}: metadata: unknown top-level key "metadata" (a string); ')
    assert "steps, use_openai_format" in line
    assert "llm-d's coordinator document" in line


# -- a placeholder left in an address --------------------------------------------------------


@pytest.mark.parametrize(
    "args", [("check-config",), ("serve", "--port", "0", "--config")], ids=["check-config", "serve"]
)
def test_a_placeholder_left_in_gateway_address_stops_at_startup(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    path = _coordinator(tmp_path, PLACEHOLDER)
    line = _refusal(*args, str(path))
    assert line == (
        f"{path}: gateway.address: '{PLACEHOLDER}' still holds the placeholder "
        "${GATEWAY_SERVICE}, ${NAMESPACE}: substitute it (envsubst) or write the address"
    )


def test_a_placeholder_left_in_a_url_flag_stops_serve() -> None:
    line = _refusal(
        "serve", "--gateway-url", "http://${GATEWAY}:80", "--render-url", "http://r", "--port", "0"
    )
    assert line.startswith("disagg-transforms: error: --gateway-url: ")
    assert "${GATEWAY}" in line


# -- serve --simulate never ignores what the document names ----------------------------------


def test_simulate_with_a_document_naming_a_gateway_is_refused() -> None:
    line = _refusal("serve", "--config", str(CONFIGMAP), "--simulate", "--port", "0")
    assert line.startswith(f"{CONFIGMAP}: gateway.address, the render step's address: ")
    assert "simulate --gateway" in line


# -- the document's steps run in the order it lists them --------------------------------------


@pytest.mark.parametrize(
    ("first", "second"), [("render", "conditional-decode"), ("conditional-decode", "render")]
)
def test_render_and_conditional_decode_run_in_the_order_listed(
    tmp_path: Path, first: str, second: str
) -> None:
    simulated = SimulatedGateway()
    with (
        served(simulated) as gateway_url,
        running((["simulate", "--port", "0"], tmp_path / "render.log")) as (renderer,),
    ):
        listed = {
            "render": {"type": "render", "params": {"address": renderer.url}},
            "conditional-decode": {"type": "conditional-decode"},
        }
        document = {
            "server": {"listen_addr": "127.0.0.1:0"},
            "gateway": {"address": gateway_url},
            "pipeline": {
                "use_openai_format": False,
                "steps": [listed[first], listed[second], {"type": "prefill"}, {"type": "decode"}],
            },
        }
        path = tmp_path / "coordinator.yaml"
        path.write_text(yaml.safe_dump(document))
        with running((["serve", "--config", str(path)], tmp_path / "serve.log")) as (proxy,):
            reply = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
            log = proxy.wait_for_log("decode=200")
    assert reply.status_code == 200, reply.text
    # The access line names each call in the order it was made.
    [line] = [line for line in log.splitlines() if "conditional-decode=" in line]
    assert line.index(f" {first}=") < line.index(f" {second}=")


# -- the laptop recipes of docs/llm-d.md, command for command ---------------------------------


def _recipe(heading: str) -> list[list[str]]:
    """The commands of the ``sh`` block under ``heading`` in docs/llm-d.md, each split."""
    page = (ROOT / "docs" / "llm-d.md").read_text(encoding="utf-8")
    section = page.split(f"\n{heading}\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines()]


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _curl(argv: list[str]) -> httpx.Response:
    """The request a ``curl -s URL -H ... -d BODY`` line sends."""
    headers = dict(argv[i + 1].split(": ", 1) for i, arg in enumerate(argv) if arg == "-H")
    body = argv[argv.index("-d") + 1]
    url = next(arg for arg in argv if arg.startswith("http://"))
    return httpx.post(url, headers=headers, content=body, timeout=30)


def _access_lines(proxy: Server, count: int) -> list[str]:
    """The proxy's first ``count`` access lines, once it has written them (10 s at most)."""
    deadline = time.monotonic() + 10
    while len(lines := [line for line in proxy.log().splitlines() if " total=" in line]) < count:
        assert time.monotonic() < deadline, proxy.log()
        time.sleep(0.05)
    return lines


@pytest.mark.parametrize(
    ("heading", "calls", "again"),
    [
        (
            "### The coordinator seat on a laptop",
            "render=200/* conditional-decode=412/* prefill=200/* decode=200/*",
            "render=200/* conditional-decode=200/*",  # the decode worker now holds the prompt
        ),
        (
            "### The sidecar seat on a laptop",
            "prefill=200/* decode=200/*",
            "prefill=200/* decode=200/*",
        ),
    ],
)
def test_a_laptop_recipe_runs_as_written(
    tmp_path: Path, heading: str, calls: str, again: str
) -> None:
    commands = _recipe(heading)
    # The ports as written may be taken on this machine: each is swapped for a free one.
    ports = {
        arg: _free_port() for argv in commands for arg in argv if arg in {"8000", "8080", "8200"}
    }
    text = "\n".join(shlex.join(argv) for argv in commands)
    for written, free in ports.items():
        text = text.replace(written, free)
    *servers, curl = [shlex.split(line) for line in text.splitlines()]
    assert [argv[0] for argv in servers] == ["disagg-transforms"] * len(servers)
    assert curl[:2] == ["curl", "-s"]
    started = [(argv[1:], tmp_path / f"{index}.log") for index, argv in enumerate(servers)]
    with running(*started[:1]), running(*started[1:]) as (proxy,):
        replies = [_curl(curl), _curl(curl)]
        lines = _access_lines(proxy, len(replies))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "Hello!"
    assert [
        fnmatch.fnmatch(line, f"* 200 {pattern} total=*")
        for line, pattern in zip(lines, (calls, again), strict=True)
    ] == [True, True], lines
