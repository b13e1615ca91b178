"""Short, bounded descriptions of JSON values for error messages."""

from __future__ import annotations

import json

_MAX_STRING = 60
_MAX_REASON = 200


def describe(value: object) -> str:  # noqa: PLR0911 - one return per JSON type reads best
    """Describe ``value`` as JSON text for a message, bounded whatever its size.

    Scalars are shown as JSON (``"tokens"``, ``true``, ``1.5``); containers by their size, so a
    128k-token list or a hostile nesting never costs more than a few characters.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true (a boolean)" if value else "false (a boolean)"
    if isinstance(value, int):
        text = (
            str(value) if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"
        )
        return f"{text} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        shown = value if len(value) <= _MAX_STRING else value[:_MAX_STRING] + "…"
        return f"{json.dumps(shown)} (a string)"
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return f"a {type(value).__name__}"


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line and bounded, for an error that wraps it."""
    try:
        text = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the original error
        text = ""
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
