"""llm-d's seats as docs/llm-d.md starts them: the shipped documents and commands, as processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from proxy_helpers import command, environment, running, served

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
