"""deploy/: the manifests parse and name the ports, probes and flags the proxy really serves."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from proxy_helpers import command, environment, running

from disagg_transforms import parse_coordinator_config, pipeline_warnings

DEPLOY = Path(__file__).parent.parent / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))
PROBES = {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def _documents() -> list[dict[str, Any]]:
    return [
        document
        for path in MANIFESTS
        for document in yaml.safe_load_all(path.read_text())
        if document is not None
    ]


def _of_kind(kind: str) -> Iterator[dict[str, Any]]:
    return (document for document in _documents() if document["kind"] == kind)


def _named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in _of_kind(kind) if doc["metadata"]["name"] == name]
    return found


def _containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    return {container["name"]: container for container in containers}


def _proxies() -> list[dict[str, Any]]:
    """Every container that runs ``disagg-transforms serve``."""
    return [
        container
        for deployment in _of_kind("Deployment")
        for container in _containers(deployment).values()
        if container.get("args", [None])[0] == "serve"
    ]


def _serve_flags() -> list[str]:
    return sorted(
        {arg for proxy in _proxies() for arg in proxy["args"] if str(arg).startswith("--")}
    )


def _port(container: dict[str, Any]) -> int:
    (port,) = [entry["containerPort"] for entry in container["ports"]]
    assert isinstance(port, int)
    return port


def _argument(container: dict[str, Any], flag: str) -> str:
    args = [str(arg) for arg in container["args"]]
    return args[args.index(flag) + 1]


def test_every_manifest_parses_into_kubernetes_objects() -> None:
    assert {path.relative_to(DEPLOY).as_posix() for path in MANIFESTS} == {
        "coordinator/configmap.yaml",
        "coordinator/deployment.yaml",
        "sidecar/decode-deployment.yaml",
    }
    kinds = sorted(document["kind"] for document in _documents())
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Service"]
    for document in _documents():
        assert {"apiVersion", "kind", "metadata"} <= set(document)


def test_the_coordinator_seat_is_shaped_as_llm_d_deploys_it() -> None:
    deployment = _named("Deployment", "disagg-coordinator")
    proxy = _containers(deployment)["coordinator"]
    assert proxy["args"][:3] == ["serve", "--config", "/etc/coordinator/coordinator.yaml"]
    assert _port(proxy) == 8080
    assert _argument(proxy, "--port") == "8080"
    for probe, path in PROBES.items():
        assert proxy[probe]["httpGet"] == {"path": path, "port": 8080}
    (mount,) = proxy["volumeMounts"]
    assert mount["mountPath"] == "/etc/coordinator"
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == "disagg-coordinator-config"
    service = _named("Service", "disagg-coordinator")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8080, 8080)]


def test_the_coordinator_config_is_one_the_proxy_reads() -> None:
    configmap = _named("ConfigMap", "disagg-coordinator-config")
    config = parse_coordinator_config(yaml.safe_load(configmap["data"]["coordinator.yaml"]))
    assert (config.host, config.port) == ("0.0.0.0", 8080)  # noqa: S104 - a pod listens on all
    assert config.warnings == ()
    assert pipeline_warnings(config.pipeline) == []  # it serves tools (output_mode: auto)
    render = _containers(_named("Deployment", "disagg-coordinator"))["vllm-render"]
    assert config.render_url == f"http://localhost:{_port(render)}"


def test_check_config_calls_the_shipped_coordinator_document_valid_without_a_warning() -> None:
    done = subprocess.run(  # noqa: S603 - our own interpreter and command
        command("check-config", str(DEPLOY / "coordinator" / "configmap.yaml")),
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("valid\n")
    assert '"output_mode":"auto"' in done.stdout
    assert done.stderr == ""


def test_the_sidecar_seat_is_shaped_as_llm_d_deploys_it() -> None:
    containers = _containers(_named("Deployment", "vllm-decode"))
    proxy, vllm = containers["routing-proxy"], containers["vllm"]
    spec = _named("Deployment", "vllm-decode")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["routing-proxy"]
    assert proxy["restartPolicy"] == "Always"
    assert _port(proxy) == 8000
    assert _argument(proxy, "--port") == "8000"
    assert _port(vllm) == 8200
    assert "--port=8200" in vllm["args"]
    assert _argument(proxy, "--decode-url") == "http://localhost:8200"
    assert "--prefill-from-header" in proxy["args"]
    assert "--allowed-worker-hosts" in proxy["args"]
    for probe, path in PROBES.items():
        assert proxy[probe]["httpGet"] == {"path": path, "port": 8000}


@pytest.fixture(scope="module")
def serve_help() -> str:
    done = subprocess.run(  # noqa: S603 - our own interpreter and command
        command("serve", "--help"),
        capture_output=True,
        text=True,
        check=True,
        env=environment(),
        timeout=60,
    )
    return done.stdout


@pytest.mark.parametrize("flag", _serve_flags())
def test_every_serve_flag_in_the_manifests_exists(flag: str, serve_help: str) -> None:
    assert f" {flag}" in serve_help


def test_the_sidecar_seat_starts_with_the_manifests_flags(tmp_path: Path) -> None:
    proxy = _containers(_named("Deployment", "vllm-decode"))["routing-proxy"]
    args = [str(arg) for arg in proxy["args"]]
    # The pod's address and port, not this machine's: only they change.
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = "0"
    with running((args, tmp_path / "serve.log")) as (sidecar,):
        ready = httpx.get(sidecar.url + "/readyz", timeout=30)
    assert ready.status_code == 200


def test_the_probe_paths_are_served(tmp_path: Path) -> None:
    args = ["serve", "--simulate", "--port", "0"]
    with running((args, tmp_path / "serve.log")) as (proxy,):
        answers = {path: httpx.get(proxy.url + path, timeout=30) for path in PROBES.values()}
    assert {path: answer.status_code for path, answer in answers.items()} == {
        "/healthz": 200,
        "/readyz": 200,
    }


def test_the_container_build_installs_the_proxy_extra() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "'.[proxy]'" in dockerfile
    assert 'ENTRYPOINT ["disagg-transforms"]' in dockerfile
    assert "push" not in dockerfile


@pytest.mark.skipif(
    os.environ.get("DISAGG_TRANSFORMS_TEST_WHEEL") == "1",
    reason="the package's sources are not beside the installed wheel's test run",
)
def test_the_container_build_copies_files_the_repository_has() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            assert all((DEPLOY.parent / source).exists() for source in sources), line


def test_the_container_build_copies_what_the_build_reads() -> None:
    # pyproject.toml names the readme and the licence: the wheel cannot be built without them.
    copied = {
        source
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    readme = re.search(r'^readme = "([^"]+)"$', pyproject, flags=re.MULTILINE)
    licences = re.search(r"^license-files = \[([^\]]*)\]$", pyproject, flags=re.MULTILINE)
    assert readme is not None
    assert licences is not None
    needed = {readme[1], *re.findall(r'"([^"]+)"', licences[1])}
    assert needed <= copied, needed - copied
