"""The toy tokenizer: one token per UTF-8 byte, Qwen's IDs for Qwen's special strings."""

from __future__ import annotations

import re
from typing import Final

BYTE_OFFSET: Final = 1000
"""UTF-8 byte ``b`` is token ``BYTE_OFFSET + b``."""

IM_START: Final = 151644
IM_END: Final = 151645
TOOL_CALL_START: Final = 151657
TOOL_CALL_END: Final = 151658
THINK_START: Final = 151667
THINK_END: Final = 151668

SPECIAL_TOKENS: Final[dict[str, int]] = {
    "<|im_start|>": IM_START,
    "<|im_end|>": IM_END,
    "<tool_call>": TOOL_CALL_START,
    "</tool_call>": TOOL_CALL_END,
    "<think>": THINK_START,
    "</think>": THINK_END,
}
_SPECIAL_TEXT: Final[dict[int, str]] = {token: text for text, token in SPECIAL_TOKENS.items()}
_SPLIT: Final = re.compile("(" + "|".join(re.escape(text) for text in SPECIAL_TOKENS) + ")")


def encode(text: str) -> list[int]:
    """Token IDs of ``text``: special strings first, every other byte on its own.

    Args:
        text: Any string.

    Returns:
        The token IDs.
    """
    tokens: list[int] = []
    for piece in _SPLIT.split(text):
        special = SPECIAL_TOKENS.get(piece)
        if special is not None:
            tokens.append(special)
        else:
            tokens.extend(BYTE_OFFSET + byte for byte in piece.encode())
    return tokens


def token_bytes(token: int) -> bytes:
    """The bytes one token stands for (``b""`` for an ID outside the toy vocabulary).

    Args:
        token: A token ID.

    Returns:
        Its bytes.
    """
    special = _SPECIAL_TEXT.get(token)
    if special is not None:
        return special.encode()
    if BYTE_OFFSET <= token < BYTE_OFFSET + 256:
        return bytes((token - BYTE_OFFSET,))
    return b""


def is_special(token: int) -> bool:
    """Whether ``token`` is one of the special strings.

    Args:
        token: A token ID.

    Returns:
        True for a special token.
    """
    return token in _SPECIAL_TEXT


def decode(tokens: list[int], *, skip_special_tokens: bool = False) -> str:
    """The text of ``tokens``; an incomplete UTF-8 sequence at the end is held back.

    Args:
        tokens: Token IDs.
        skip_special_tokens: Leave the special strings out.

    Returns:
        The decoded text.
    """
    data = b"".join(
        token_bytes(token) for token in tokens if not (skip_special_tokens and is_special(token))
    )
    # Like an incremental detokenizer: a character split across tokens shows once complete.
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        if error.reason != "unexpected end of data":
            return data.decode(errors="replace")
        return data[: error.start].decode(errors="replace")
