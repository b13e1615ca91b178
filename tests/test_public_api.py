from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import disagg_transforms


def _public_modules() -> list[str]:
    return [
        info.name
        for info in pkgutil.iter_modules(disagg_transforms.__path__)
        if not info.name.startswith("_")
    ]


def test_all_is_sorted_and_complete() -> None:
    exported = disagg_transforms.__all__
    assert exported == sorted(exported)
    assert len(exported) == len(set(exported))
    public = {
        name
        for name, value in vars(disagg_transforms).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert set(exported) == public


def test_spec_names_are_exported() -> None:
    # The names the contract promises (docs/index.md names their pages); later modules add more.
    for name in (
        "Route",
        "detect_route",
        "resolve_format",
        "OutputMode",
        "validate_output_mode",
        "parse_step_params",
        "DisaggTransformError",
        "ConfigError",
        "RequestError",
        "UpstreamContractError",
    ):
        assert name in disagg_transforms.__all__


def test_public_modules_declare_sorted_all() -> None:
    for name in _public_modules():
        module = importlib.import_module(f"disagg_transforms.{name}")
        if name == "__main__":
            continue
        exported = getattr(module, "__all__", None)
        assert exported is not None, name
        assert list(exported) == sorted(exported), name
        for item in exported:
            assert hasattr(module, item), (name, item)


def test_version_comes_from_metadata() -> None:
    version = disagg_transforms.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version)
