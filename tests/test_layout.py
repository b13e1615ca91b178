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


def test_the_integrations_import_only_public_names() -> None:
    # An integration is a client of the library, as a router is: a private module it needed
    # would be a name every router needs too (docs/architecture.md, "The import rules").
    files = _modules_under("integrations")
    assert files
    for path in files:
        private = {
            name for name in _imports(path) if any(p.startswith("_") for p in name.split("."))
        }
        assert not private, f"{path.name} imports {sorted(private)}"


def _module_graph() -> dict[str, set[str]]:
    """Each package module and the package modules it imports, type-checking imports aside."""
    modules = {
        ".".join(("disagg_transforms", *path.relative_to(PACKAGE).with_suffix("").parts)): path
        for path in PACKAGE.rglob("*.py")
    }
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        checking = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for statement in block.body
            for node in ast.walk(statement)
        }
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in checking:
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        own = name.removesuffix(".__init__")
        # A package's own __init__ is loaded before any of its modules: importing a name from
        # it (the root's public names) is no circle.
        graph[own] = {
            target
            for target in (m.removesuffix(".__init__") for m in modules)
            if target in found and not f"{own}.".startswith(f"{target}.")
        }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node, [])
        if found:
            return found
    return None


def test_no_import_circle() -> None:
    # Function-level imports count: the CLI's main and serve once dodged a circle that way.
    graph = _module_graph()
    assert "disagg_transforms._cli.config" in graph["disagg_transforms._cli.serve"]
    assert _cycle(graph) is None, _cycle(graph)


def test_the_circle_finder_sees_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
