"""Command line: ``python -m disagg_transforms demo`` shows what the library does."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import msgspec

from disagg_transforms.config import Step, parse_step_params
from disagg_transforms.routes import Route, resolve_format


def _heading(text: str) -> str:
    return f"\n{text}\n{'=' * len(text)}"


def _demo() -> str:
    lines = [_heading("Where each leg goes (resolve_format)")]
    lines.append(f"{'client route':<24} {'use_openai_format=true':<26} use_openai_format=false")
    lines.extend(
        f"{route.value:<24} {resolve_format(True, route.value).value:<26} "  # noqa: FBT003
        f"{resolve_format(False, route.value).value}"  # noqa: FBT003
        for route in Route
    )
    lines.append(_heading("Step defaults (parse_step_params with no keys)"))
    for step in Step:
        params = parse_step_params(step.value, {})
        shown = msgspec.json.encode(msgspec.structs.asdict(params)).decode()
        lines.append(f"{step.value:<20} {shown}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="disagg-transforms",
        description="Build disaggregated-serving leg bodies for vLLM, and read them back.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="show routes and step defaults")
    args = parser.parse_args(argv)
    if args.command == "demo":
        sys.stdout.write(_demo() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
