"""What a completions body contributes to a generate leg (``/v1/completions``).

Completions shares chat's sampling rules (``chat_family_sampling`` in the chat mapper); only
``logprobs`` differs: it is already a count here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_transforms._request import fields as f
from disagg_transforms._request.chat import chat_family_sampling
from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.validate import client_object, integer

_MAPPED = frozenset(
    {
        *f.SAMPLING_FIELDS,
        w.MAX_TOKENS,
        w.LOGPROBS,
        w.RESPONSE_FORMAT,
        w.STRUCTURED_OUTPUTS,
    }
)


def map_completions_request(
    body: Mapping[str, Any], /, *, generate_leg: bool = True
) -> ClientMapping:
    """Map a completions body's sampling fields (``logprobs`` is already a count there)."""
    body = client_object(body)
    sampling = chat_family_sampling(body, generate_leg=generate_leg)
    count = integer(body, w.LOGPROBS, minimum=-1)
    if count is not None:
        sampling[w.LOGPROBS] = count
    return f.client_mapping(body, sampling, mapped=_MAPPED)
