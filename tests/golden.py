"""The golden vLLM 0.33 fixtures (bodies and streams serialised by vLLM's own classes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str) -> Any:
    """The ``body`` of a golden JSON fixture."""
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))["body"]


def load_stream(name: str) -> bytes:
    """The raw bytes of a golden SSE stream."""
    return (FIXTURES / name).read_bytes()
