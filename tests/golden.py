"""The golden vLLM 0.33 fixtures (bodies and streams serialised by vLLM's own classes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from disagg_transforms import OutputMode

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str) -> Any:
    """The ``body`` of a golden JSON fixture."""
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))["body"]


def load_stream(name: str) -> bytes:
    """The raw bytes of a golden SSE stream."""
    return (FIXTURES / name).read_bytes()


RESPONSE_FIXTURES = [
    ("response-text.json", OutputMode.TEXT),
    ("response-text-logprobs.json", OutputMode.TEXT),
    ("response-text-finish-abort.json", OutputMode.TEXT),
    ("response-text-finish-repetition.json", OutputMode.TEXT),
    ("response-derender-text.json", OutputMode.DERENDER),
    ("response-derender-tool-call.json", OutputMode.DERENDER),
]
"""The golden generate responses, each with the ``output_mode`` its leg requested."""
