"""Pieces every route of the simulated worker shares: vLLM's error bodies and their messages."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final


def error_body(message: str, error_type: str, param: str | None, code: int) -> dict[str, Any]:
    """VLLM's error body, the same on every route.

    Args:
        message: The human message.
        error_type: ``BadRequestError``, ``Bad Request``, ``NotFoundError``, ...
        param: The field at fault, or ``None``.
        code: The HTTP status.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}``.
    """
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class Issue:
    """One request-validation failure, written the way vLLM's validation handler prints it."""

    kind: str
    loc: str
    msg: str
    value: object
    ctx: dict[str, object] | None = None


def _summary(value: object) -> str:
    # vLLM's handler summarises containers by their size and writes any other value as text.
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return str(value)


class RequestInvalidError(Exception):
    """A request body that fails validation; answered with 400 ``Bad Request``."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__(issues)
        self.issues = issues

    def body(self) -> dict[str, Any]:
        """The 400 body vLLM's request-validation handler writes.

        Returns:
            The error body, ``param`` naming the first failure's location.
        """
        count = len(self.issues)
        lines = [f"{count} validation error{'' if count == 1 else 's'}:"]
        for issue in self.issues:
            record: dict[str, object] = {
                "type": issue.kind,
                "loc": issue.loc,
                "msg": issue.msg,
                "input": _summary(issue.value),
            }
            if issue.ctx is not None:
                record["ctx"] = issue.ctx
            lines.append(f"  {record!r}")
        return error_body("\n".join(lines), "Bad Request", self.issues[0].loc, 400)


class BadRequestError(Exception):
    """A request vLLM refuses after validation: 400 ``BadRequestError``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def body(self) -> dict[str, Any]:
        """The error body.

        Returns:
            ``{"error": {...}}`` with type ``BadRequestError`` (or the status's vLLM type).
        """
        error_type = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(
            self.status, "BadRequestError"
        )
        return error_body(self.message, error_type, self.param, self.status)


# The major and minor of a release (vLLM's /version: "0.32.0", "0.33.1rc1", "0.32.0+cpu").
_RELEASE: Final = re.compile(r"(\d+)\.(\d+)")
_DERENDER_RELEASE: Final = (0, 33)  # the first with output_mode derender


DEFAULT_ENGINE_ID: Final = "4f8a0c3e-7d2b-4c1a-9e5f-2b6d8a1c3e70"
"""The ``remote_engine_id`` a prefill's ``kv_transfer_params`` names unless told otherwise."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """What the simulated worker is started with (its "model"); build one and share it.

    Raises:
        ValueError: ``max_model_len`` is not positive.
    """

    model: str = "simulated"
    """The model listed by ``/v1/models`` (besides ``simulated``) and answered when a body names
    none; a body's own ``model`` is echoed, whatever it is."""
    served_model_names: tuple[str, ...] = ()
    """vLLM's ``--served-model-name``: ``/v1/models`` lists these alone, a body naming another
    model is answered 404 (``The model `x` does not exist.``), and one naming none is answered
    as the first. Empty (the default): any name is served."""
    max_model_len: int = 4096
    """The context length."""
    created: int | None = None
    """The ``created`` timestamp of generate answers; ``None``: the clock."""
    answer: str = "Hello!"
    """The text the model generates."""
    reasoning: str = "The user greets me."
    """The reasoning the model writes in ``derender`` mode."""
    engine_id: str = DEFAULT_ENGINE_ID
    """``remote_engine_id`` of a prefill's ``kv_transfer_params``."""
    prompt_tokens_details: bool = False
    """vLLM's ``--enable-prompt-tokens-details``: every route's usage reports
    ``prompt_tokens_details.cached_tokens``, the prefix cache's hit over the prompts this worker
    computed before on any route (a decode that pulls the prompt's KV: 0). Off: ``null``."""
    vllm_version: str = "0.33.0"
    """The vLLM release played: ``GET /version`` answers it, and before 0.33 the generate route
    has no ``derender`` (refused with vLLM 0.32's own 400, ``Input should be 'tokens' or
    'text'``). Everything else is answered as 0.33 answers it."""

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            msg = "max_model_len must be positive"
            raise ValueError(msg)
        if _RELEASE.match(self.vllm_version) is None:
            msg = f"vllm_version must be a vLLM release such as 0.32.0, got {self.vllm_version!r}"
            raise ValueError(msg)
        if not all(isinstance(name, str) and name for name in self.served_model_names):
            msg = "served_model_names must be non-empty strings"
            raise ValueError(msg)

    @property
    def output_modes(self) -> tuple[str, ...]:
        """The ``output_mode`` values the played release's generate route takes."""
        found = _RELEASE.match(self.vllm_version)
        assert found is not None  # noqa: S101 - __post_init__ checked it
        if (int(found[1]), int(found[2])) < _DERENDER_RELEASE:
            return ("tokens", "text")
        return ("tokens", "text", "derender")

    @property
    def default_model(self) -> str:
        """The model a body that names none is answered as."""
        return self.served_model_names[0] if self.served_model_names else self.model

    def unknown_model(self, body: object) -> str | None:
        """The model ``body`` names when this worker does not serve it, else ``None``.

        Args:
            body: A request body.

        Returns:
            The unknown name.
        """
        name = body.get("model") if isinstance(body, dict) else None
        if not self.served_model_names or not isinstance(name, str) or not name:
            return None
        return None if name in self.served_model_names else name
