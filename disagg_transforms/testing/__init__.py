"""A simulated vLLM 0.33 worker for tests: an ASGI app that speaks the real wire format.

Routers test their disaggregated flows against it without a GPU. It answers vLLM 0.33's
``POST /inference/v1/generate`` (output modes ``tokens``, ``text`` and ``derender``, streaming for
``tokens`` and ``text``, a prefill leg's NIXL ``kv_transfer_params``), coupled
``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and ``/v1/messages``, the
four ``/v1/.../render`` routes (a deterministic byte tokenizer over a Qwen3-like template),
``/tokenize``, ``/detokenize``, ``/version``, and ``GET /health`` / ``GET /v1/models``; it
refuses what vLLM refuses with vLLM's 400 bodies, and plays faults on request. It is
independent of the rest of ``disagg_transforms`` on purpose: it is the peer the library is
tested against.

Use it in process with httpx (which buffers a streamed answer whole; that is fine for tests)::

    worker = SimulatedWorker()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=worker), base_url="http://worker"
    ) as client:
        response = await client.post("/inference/v1/generate", json=body)
    assert [call.path for call in worker.calls] == ["/inference/v1/generate"]

or put a :class:`SimulatedGateway` in front of pools of them (llm-d's gateway: each call routed
by its ``EPP-Profile`` header, 412 for a conditional decode of a prompt no decode worker has
served),
or serve it with any ASGI server (``uvicorn.run(SimulatedWorker(), port=8100)``); the header
``x-simulate-fault: MODE`` then picks a fault per request.

:class:`SimulatedSglangWorker` is its SGLang 0.5.23 counterpart: ``/generate`` in one P/D role,
prefill and decode meeting by bootstrap room (docs/sglang.md).

The toy tokenizer is :func:`toy_encode`: UTF-8 byte ``b`` is token ``1000 + b``; Qwen's special
strings keep their IDs (``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ``<tool_call>`` 151657,
``</tool_call>`` 151658, ``<think>`` 151667, ``</think>`` 151668). With it the render answers
equal vLLM 0.33's own, byte for byte, for the plain, tools and ``kv_transfer_params`` chat
renders, the Messages render and the completions render; the Responses render differs only in
the random part of its ``resp_`` id. What differs from a real vLLM server:

- The generated text is scripted (see :class:`SimulatedWorker` and :class:`WorkerSettings`);
  ``stop`` strings, ``min_tokens``, ``ignore_eos`` and seeds do not change it; logprobs are
  made up (the sampled token at -0.1 first, then alternatives).
- ``usage.prompt_tokens_details`` is null unless ``prompt_tokens_details`` (vLLM's
  ``--enable-prompt-tokens-details``) is set: then every route reports the whole 16-token blocks
  of the prompt some earlier call computed (one prefix cache for every route), and a decode leg
  that pulled its KV blocks none.
- A prefill's ``remote_request_id`` ends in a hash instead of a random suffix; its blocks are
  numbered from 1 for every request (16 tokens a block).
- Validation messages follow pydantic's wording for the common failures only; ``content_parts``
  (raw media) are refused. An image part renders to four ``<|image_pad|>`` tokens and
  ``features`` hashed from its URL; a call that runs the encoder answers made-up
  ``ec_transfer_params``.
- ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and ``/v1/messages``
  (coupled serving) run the tool and reasoning parser only when a request offers tools
  (``tool_choice`` not ``none``; then as the generate route's ``derender`` mode, a chat stream
  a delta per token; a Responses or Messages stream never), else answer in text mode; no
  completions, Responses or Messages logprobs.
- ``/v1/models`` lists ``simulated`` and the configured model (or the
  ``served_model_names`` alone), with ``permission: []``.
- A request for structured output is answered with a small JSON value that satisfies its schema
  (docs/testing.md); no grammar is enforced otherwise.
- Generate ids follow vLLM: ``generate-tokens-`` plus the ``x-request-id`` header when sent,
  else the body's ``request_id``, else a random id.
"""

from __future__ import annotations

from disagg_transforms.testing._common import DEFAULT_ENGINE_ID, WorkerSettings
from disagg_transforms.testing._gateway import (
    DEFAULT_PROFILE,
    PROFILE_HEADER,
    PROFILES,
    ROUTING_POLICIES,
    GatewayCall,
    SimulatedGateway,
)
from disagg_transforms.testing._sglang import SGLANG_FAULT_MODES, SimulatedSglangWorker
from disagg_transforms.testing._tokenizer import decode as toy_decode
from disagg_transforms.testing._tokenizer import encode as toy_encode
from disagg_transforms.testing._worker import (
    FAULT_HEADER,
    FAULT_MODES,
    RecordedCall,
    SimulatedWorker,
)

__all__ = [
    "DEFAULT_ENGINE_ID",
    "DEFAULT_PROFILE",
    "FAULT_HEADER",
    "FAULT_MODES",
    "GatewayCall",
    "PROFILES",
    "PROFILE_HEADER",
    "ROUTING_POLICIES",
    "RecordedCall",
    "SGLANG_FAULT_MODES",
    "SimulatedGateway",
    "SimulatedSglangWorker",
    "SimulatedWorker",
    "WorkerSettings",
    "toy_decode",
    "toy_encode",
]
