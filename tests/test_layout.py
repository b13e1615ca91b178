"""The layout's import rules, checked over the package's own import statements.

The request side and the response side never import each other; the wire layer imports nothing
of the package but itself and the errors; the core never imports the optional extras. See
docs/architecture.md.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import disagg_transforms

PACKAGE = pathlib.Path(disagg_transforms.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """Every ``disagg_transforms`` module a file imports (``from X import y`` counts X and X.y)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("disagg_transforms")}


def _modules_under(subpackage: str) -> list[pathlib.Path]:
    return sorted((PACKAGE / subpackage).glob("*.py"))


def _side(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.mark.parametrize(
    ("side", "forbidden"),
    [("_request", "_response"), ("_response", "_request")],
)
def test_request_and_response_never_import_each_other(side: str, forbidden: str) -> None:
    files = _modules_under(side)
    assert files, f"no modules under {side}: the layout moved without this test"
    for path in files:
        leaks = {name for name in _imports(path) if _side(name) == forbidden}
        assert not leaks, f"{path.name} imports {sorted(leaks)}"


@pytest.mark.parametrize("side", ["_request", "_response", "_wire"])
def test_nothing_below_the_exchange_imports_it(side: str) -> None:
    # The exchange composes both sides; they must stay usable without it.
    for path in _modules_under(side):
        leaks = {name for name in _imports(path) if _side(name) == "_exchange"}
        assert not leaks, f"{path.name} imports {sorted(leaks)}"
    assert _modules_under("_exchange"), "no modules under _exchange: the layout moved"


def test_the_wire_layer_knows_no_rule() -> None:
    allowed = {"_wire", "errors"}
    files = _modules_under("_wire")
    assert files
    for path in files:
        leaks = {name for name in _imports(path) if _side(name) not in allowed | {None}}
        assert not leaks, f"{path.name} imports {sorted(leaks)}"


def test_the_rule_checker_sees_a_violation(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from disagg_transforms._response import chat\n", encoding="utf-8")
    assert _side(next(iter(_imports(bad)))) == "_response"


def test_importing_the_package_imports_no_io_library() -> None:
    code = (
        "import sys, disagg_transforms\n"
        "bad = [m for m in ('asyncio', 'httpx', 'starlette', 'uvicorn', 'litellm')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(  # noqa: S603 - our own interpreter, fixed code
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""
