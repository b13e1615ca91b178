"""Checks on what is installed: run against the built wheel in CI."""

from __future__ import annotations

import importlib.metadata
import os
from importlib import resources
from pathlib import Path

import pytest

import disagg_transforms


def test_py_typed_is_shipped() -> None:
    assert (resources.files("disagg_transforms") / "py.typed").is_file()


def test_runtime_dependencies_are_only_the_promised_three() -> None:
    requires = importlib.metadata.requires("disagg_transforms") or []
    core = sorted(r.split(">")[0].split(";")[0].strip() for r in requires if "extra ==" not in r)
    assert core == ["msgspec", "orjson", "typing-extensions"]


@pytest.mark.skipif(
    os.environ.get("DISAGG_TRANSFORMS_TEST_WHEEL") != "1",
    reason="only when CI tests the installed wheel",
)
def test_running_against_the_installed_wheel() -> None:
    location = Path(disagg_transforms.__file__).resolve()
    assert "site-packages" in location.parts
