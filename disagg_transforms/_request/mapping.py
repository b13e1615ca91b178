"""The contract between a client route's field mapper and the generate-leg builder.

Each client route (chat, completions, responses, messages) has a mapper that reads the client's
body and says what it contributes to a generate leg besides the prompt and the output cap (the cap
is :func:`~disagg_transforms.apply_sampling_caps`' job): the ``sampling_params`` fields, a
``parse_context`` built from the client's tools, and the client keys it dropped on the documented
list. A field the generate route cannot honour and that is not on that list is refused with a
:class:`~disagg_transforms.errors.RequestError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec


class ClientMapping(msgspec.Struct, frozen=True, kw_only=True):
    """What one client body contributes to a generate leg."""

    sampling_params: dict[str, Any]
    """Fields for ``sampling_params``, mapped the way vLLM's ``to_sampling_params`` maps them."""
    parse_context: dict[str, Any] | None = None
    """Derender parse context built from the client's tools (chat tool shape), if any."""
    dropped: tuple[str, ...] = ()
    """Client keys left out of the leg on the documented list (e.g. ``messages``)."""
    context_keys: tuple[str, ...] = ()
    """Client keys that only feed ``parse_context``: dropped too when the leg writes none."""


class ClientMapper(Protocol):
    """Reads a client body (never mutating it); raises ``RequestError`` for a refused field.

    ``generate_leg`` false checks only what every route of the API checks (types, ranges, caps'
    companions): the body goes to a worker on the client's own route, which serves what the
    generate route cannot (e.g. chat's ``echo``, a Responses built-in tool), and the mapping's
    ``parse_context`` is left out.
    """

    def __call__(
        self, body: Mapping[str, Any], /, *, generate_leg: bool = True
    ) -> ClientMapping: ...
