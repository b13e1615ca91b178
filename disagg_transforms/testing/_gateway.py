"""A simulated llm-d gateway: Envoy and the endpoint picker in front of pools of workers.

llm-d's coordinator sends every leg to one gateway URL and names the leg's role in the header
``EPP-Profile``; the picker (the EPP's ``header-profile-handler``) chooses a worker of that
role's pool. This app plays both, in process, over pools of :class:`SimulatedWorker` (see
docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import orjson

from disagg_transforms.testing._common import (
    BadRequestError,
    RequestInvalidError,
    WorkerSettings,
)
from disagg_transforms.testing._worker import (
    GENERATE_PATH,
    Message,
    Receive,
    Scope,
    Send,
    SimulatedWorker,
    read_request,
    render,
)

PROFILE_HEADER: Final = "epp-profile"
"""The header naming a call's role (llm-d's ``EPP-Profile``; matched case-insensitively)."""
PROFILES: Final = ("encode", "prefill", "decode")
"""The pools a gateway has, one per role."""
DEFAULT_PROFILE: Final = "decode"
"""The profile of a call without the header (or with a blank one), as llm-d's default."""
ROUTING_POLICIES: Final = ("round-robin", "hash")
"""How a worker of a pool is chosen."""

_NOT_CACHED: Final = (
    b"inference error: PreconditionFailed - no decode worker has the requested KV cache"
)
_CLIENT_ROUTES: Final = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
)

Prompt = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GatewayCall:
    """One call the gateway answered (recorded when its answer ended).

    Attributes:
        profile: The profile the call was routed by (``encode``, ``prefill``, ``decode``), or
            the unknown name answered 429.
        conditional: Whether it asked ``Prefer: if-available`` (a conditional decode).
        method: ``GET``, ``POST``, ...
        path: The request path.
        headers: The request headers, names lower-cased, as the worker got them.
        worker: The worker that answered (``"decode-0"``), ``None`` for the gateway's own 412
            or 429.
        status: The answer's status.
    """

    profile: str
    conditional: bool
    method: str
    path: str
    headers: dict[str, str]
    worker: str | None
    status: int


class SimulatedGateway:
    """A simulated llm-d gateway: routes each call by ``EPP-Profile`` to a pool of workers.

    - The header's value, matched case-insensitively, names the pool (``encode``, ``prefill``,
      ``decode``); absent or blank, ``decode``. Any other value is answered 429 (no profile
      ran: llm-d's "no endpoint"), as the picker does.
    - A conditional decode (``Prefer: if-available``, read as llm-d does: split on ``,``,
      ``;params`` dropped, compared case-insensitively) goes to the decode worker that served
      the same prompt before; when none has, the gateway answers 412 (plain text, as Envoy
      writes the picker's ``PreconditionFailed``) and no worker is called. A prompt is the
      token IDs of the body: a generate body's ``token_ids``, any other client route's body
      rendered as the worker renders it; a body that does not render has no prompt (412).
      A prompt is served once a decode worker answered it with a 2xx.
    - Any other call goes to the pool's next worker (``round-robin``) or to the one the
      prompt (or the body, without one) hashes to (``hash``); both are deterministic.

    Headers reach the worker as sent (Envoy forwards ``EPP-Profile`` too).

    Args:
        settings: What every worker's model answers; ``None``: the defaults.
        pool_size: Workers per pool.
        routing: ``"round-robin"`` or ``"hash"``.
        stream_delay: Seconds between a worker stream's events.

    Raises:
        ValueError: A pool size below 1 or an unknown routing policy.
    """

    def __init__(
        self,
        settings: WorkerSettings | None = None,
        *,
        pool_size: int = 1,
        routing: Literal["round-robin", "hash"] = "round-robin",
        stream_delay: float = 0.0,
    ) -> None:
        if pool_size < 1:
            msg = "pool_size must be at least 1"
            raise ValueError(msg)
        if routing not in ROUTING_POLICIES:
            msg = f"unknown routing {routing!r}; expected one of {', '.join(ROUTING_POLICIES)}"
            raise ValueError(msg)
        self.settings = WorkerSettings() if settings is None else settings
        self.routing = routing
        self.pools: Mapping[str, tuple[SimulatedWorker, ...]] = {
            profile: tuple(
                SimulatedWorker(self.settings, stream_delay=stream_delay) for _ in range(pool_size)
            )
            for profile in PROFILES
        }
        """Each profile's workers; ``pools["decode"][0].calls`` are the calls one received."""
        self.calls: list[GatewayCall] = []
        """Every call answered, in the order the answers ended."""
        self._next = dict.fromkeys(PROFILES, 0)
        self._served: dict[Prompt, int] = {}

    def calls_of(self, profile: str) -> list[GatewayCall]:
        """The recorded calls routed by one profile, in order."""
        return [call for call in self.calls if call.profile == profile]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope (``http``, or ``lifespan``)."""
        request = await read_request(scope, receive, send)
        if request is None:
            return
        method, path, headers, body = request
        raw = body or b""
        profile = headers.get(PROFILE_HEADER, "").strip().lower() or DEFAULT_PROFILE
        conditional = profile == DEFAULT_PROFILE and _prefers_if_available(headers)

        def record(worker: str | None, status: int) -> None:
            call = GatewayCall(profile, conditional, method, path, headers, worker, status)
            self.calls.append(call)

        if profile not in self.pools:
            text = f"inference error: ResourceExhausted - no profile named {profile!r}".encode()
            await _plain(send, 429, text)
            record(None, 429)
            return
        prompt = self._prompt(path, raw)
        if conditional:
            index = self._served.get(prompt) if prompt is not None else None
            if index is None:
                await _plain(send, 412, _NOT_CACHED)
                record(None, 412)
                return
        else:
            index = self._pick(profile, prompt, raw)
        status = await self._forward(scope, receive, send, self.pools[profile][index], raw)
        if profile == DEFAULT_PROFILE and prompt is not None and 200 <= status < 300:
            self._served[prompt] = index
        record(f"{profile}-{index}", status)

    def _pick(self, profile: str, prompt: Prompt | None, raw: bytes) -> int:
        size = len(self.pools[profile])
        if self.routing == "hash":
            key = orjson.dumps(list(prompt)) if prompt is not None else raw
            return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % size
        index = self._next[profile]
        self._next[profile] = (index + 1) % size
        return index

    def _prompt(self, path: str, raw: bytes) -> Prompt | None:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if path == GENERATE_PATH:
            return _token_ids(body)
        if path not in _CLIENT_ROUTES:
            return None
        try:
            rendered = render(f"{path}/render", body, None, self.settings)
        except (RequestInvalidError, BadRequestError):
            return None
        if isinstance(rendered, list) and rendered:
            rendered = rendered[0]  # the completions render answers one element per prompt
        return _token_ids(rendered)

    @staticmethod
    async def _forward(
        scope: Scope, receive: Receive, send: Send, worker: SimulatedWorker, raw: bytes
    ) -> int:
        """Run the call on ``worker``: the body replayed, then the client's own receive."""
        replayed = False
        status = 0

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()  # a client that goes away reaches the worker

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await worker(scope, replay, watch)
        return status


def _prefers_if_available(headers: Mapping[str, str]) -> bool:
    tokens = headers.get("prefer", "").split(",")
    return any(token.split(";", 1)[0].strip().lower() == "if-available" for token in tokens)


def _token_ids(body: object) -> Prompt | None:
    ids = body.get("token_ids") if isinstance(body, dict) else None
    if isinstance(ids, list) and all(type(item) is int for item in ids):
        return tuple(ids)
    return None


async def _plain(send: Send, status: int, text: bytes) -> None:
    headers: Sequence[tuple[bytes, bytes]] = [
        (b"content-type", b"text/plain"),
        (b"content-length", str(len(text)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text, "more_body": False})
