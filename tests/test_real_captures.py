"""The real vLLM 0.32 captures (``tests/fixtures/vllm-0.32-real/``), read by the library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from disagg_transforms import OutputMode, check_output_mode_echo, wrap_chat_completion

REAL = Path(__file__).parent / "fixtures" / "vllm-0.32-real"


def _load(name: str) -> Any:
    return json.loads((REAL / name).read_text(encoding="utf-8"))


def test_a_real_text_answer_wraps_into_a_chat_completion() -> None:
    answer = _load("generate-text-response.json")
    check_output_mode_echo(answer, OutputMode.TEXT)
    chat = wrap_chat_completion(answer, requested=OutputMode.TEXT)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == answer["choices"][0]["text"]
    assert chat["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [chat["usage"][key] for key in counts] == [answer["usage"][key] for key in counts]


def test_a_real_032_worker_refuses_derender() -> None:
    # What docs/exchange.md's "vLLM versions" builds on: 0.32 knows tokens and text only.
    refusal = _load("error-400-derender.json")["error"]
    assert (refusal["code"], refusal["param"]) == (400, "body.output_mode")
    assert "'tokens' or 'text'" in refusal["message"]
    assert _load("version.json") == {"version": "0.32.0"}
