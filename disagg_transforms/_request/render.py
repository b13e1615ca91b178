"""vLLM's render answer, read through a typed view of the ``GenerateRequest`` vLLM writes.

The exchange reads the answer of ``/render`` once per request and builds its legs on it. An
answer laid out as vLLM writes one (its ``GenerateRequest``'s members, in their order) is read
by one typed msgspec call that proves every member of the type the leg's check would require
(every value parsed, so none could fail to decode later) and that the members the rules read or
remove are null; its token IDs are proved by the byte scan. The decode leg is then written from
the answer's raw members (``legs._viewed_render_leg``). Any other answer, and any rule that reads
it as a mapping, gets its members decoded as any body's are
(:class:`~disagg_transforms._wire.raw.RawMembers`). docs/performance.md, "The render answer read
as a typed view".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Final, TypeAlias, get_type_hints

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._wire import keys as w
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire import validate as _validate
from disagg_transforms.envelopes import (
    JSON,
    GenerateRequest,
    ParseContext,
    SamplingParams,
    StreamOptions,
)
from disagg_transforms.errors import UpstreamContractError

__all__ = ("RenderAnswer", "common_sampling")

_ANSWER: Final = "the render answer"


# A cap the cap rule keeps as it is (_plain_cap), and extra_args without transfer params.
_PlainCap: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=_validate.MAX_TOKEN_ID)]
_NoArgs: TypeAlias = Annotated[dict[str, JSON], msgspec.Meta(max_length=0)]


# The objects of a viewed answer: every member one of their fields (an unknown one would be
# skipped, not parsed: such an answer takes the general rules).
class _Sampling(SamplingParams, forbid_unknown_fields=True, kw_only=True):
    # Typed as common_sampling reads them: a cap or extra_args off the common shape fails the
    # view's decode (the general rules), with no Python check after it.
    max_tokens: _PlainCap | UnsetType | None = UNSET
    extra_args: _NoArgs | UnsetType | None = UNSET


class _ParseContext(ParseContext, forbid_unknown_fields=True, kw_only=True):
    pass


class _StreamOptions(StreamOptions, forbid_unknown_fields=True, kw_only=True):
    pass


_STRICT: Final[Mapping[str, object]] = {
    w.SAMPLING_PARAMS: _Sampling,
    w.PARSE_CONTEXT: _ParseContext | None,
    w.STREAM_OPTIONS: _StreamOptions | None,
    # What the common answer holds null: features, and the transfer params a leg removes.
    w.FEATURES: None,
    w.KV_TRANSFER_PARAMS: None,
    w.EC_TRANSFER_PARAMS: None,
}
# The members whose view is a struct, not the value a mapping of the answer holds.
_STRUCTS: Final = frozenset({w.SAMPLING_PARAMS, w.PARSE_CONTEXT, w.STREAM_OPTIONS})


def _layout(without: tuple[str, ...]) -> tuple[tuple[str, ...], msgspec.json.Decoder[Any]]:
    """The members vLLM writes but ``token_ids`` (and ``without``), and their view's decoder.

    The decoder reads the members' values as one JSON array, in that order.
    """
    hints = get_type_hints(GenerateRequest)
    keys = tuple(
        key for key in GenerateRequest.__struct_fields__ if key not in (w.TOKEN_IDS, *without)
    )
    fields = [(key, _STRICT.get(key, hints[key])) for key in keys]
    view = msgspec.defstruct("_RenderView", fields, array_like=True, frozen=True)
    return keys, msgspec.json.Decoder(view)


# vLLM 0.33 writes every GenerateRequest member, in the order the class declares them; 0.32 has
# no parse_context.
_LAYOUTS: Final = dict((_layout(()), _layout((w.PARSE_CONTEXT,))))


def _plain_cap(value: object) -> bool:
    """A cap the cap rule keeps as it is (an int in range, or null)."""
    return value is None or (type(value) is int and 1 <= value <= _validate.MAX_TOKEN_ID)


def common_sampling(sampling: Mapping[str, Any]) -> bool:
    """Whether the cap rules keep ``sampling_params`` as it is.

    It holds a plain cap (an int in range, or none), no ``min_tokens``, and no transfer params
    (``extra_args`` null or empty).
    """
    extra = sampling.get(w.EXTRA_ARGS)
    return (
        _plain_cap(sampling.get(w.MAX_TOKENS))
        and (extra is None or extra == {})
        and w.MIN_TOKENS not in sampling
    )


class RenderAnswer(Mapping[str, Any]):
    """A render answer: its raw members, its view when it has one, its members decoded on demand.

    A mapping of the members as :class:`RawMembers` decodes them (``token_ids`` proved and kept
    as bytes), decoded the first time a rule reads one (at once for an answer without a view, so
    a member no parser reads is refused on arrival, as before).
    """

    __slots__ = ("_decoded", "_split", "raw", "token_ids", "view")

    def __init__(self, data: object) -> None:
        """Split vLLM's answer and read it through its view.

        Raises:
            UpstreamContractError: as :class:`RawMembers` refuses a body (``param`` the path).
        """
        self._split = _raw.split_syntax(data, UpstreamContractError, _ANSWER)
        self.raw: Mapping[str, msgspec.Raw] = self._split[1]
        """The answer's members, each the bytes vLLM wrote, in its order."""
        self.view: Any = None
        """The members but ``token_ids`` read through the view, as a struct's fields (each a
        member's key; ``sampling_params``, ``parse_context`` and ``stream_options`` themselves
        structs), when the answer is of the common shape: laid out as vLLM writes it,
        ``features`` and the transfer params null, ``sampling_params`` common
        (:func:`common_sampling`); else ``None``."""
        self.token_ids: _raw.RawTokenIds | None = None
        """The proved token IDs of an answer with a view."""
        self._decoded: _raw.RawMembers | None = None
        rest = dict(self.raw)  # C-speed copies: no Python loop per member
        tokens = rest.pop(w.TOKEN_IDS, None)
        decoder = _LAYOUTS.get(tuple(rest))
        proved = None if decoder is None or tokens is None else _raw.scan_token_ids(tokens)
        if decoder is not None and proved is not None:
            try:
                view = decoder.decode(b"[" + b",".join(rest.values()) + b"]")
            except (msgspec.ValidationError, RecursionError):
                pass  # off the view (or a value no parser reads): decoded as any body is
            else:
                # common_sampling: the view's types proved the cap and extra_args.
                if getattr(view, w.SAMPLING_PARAMS).min_tokens is UNSET:
                    self.view, self.token_ids = view, proved
                    return
        self.members()

    def members(self) -> _raw.RawMembers:
        """The members decoded (once), as :class:`RawMembers` has them."""
        decoded = self._decoded
        if decoded is None:
            decoded = self._decoded = _raw.RawMembers.of_split(
                self._split, UpstreamContractError, token_ids_key=w.TOKEN_IDS, proved=self.token_ids
            )
        return decoded

    def __getitem__(self, key: str) -> Any:  # noqa: ANN401 - a JSON value
        if self.view is not None and key in self.raw and key not in _STRUCTS:
            # The view's value is the decoded one (a stream's model, ...): no decode of the rest.
            return self.token_ids if key == w.TOKEN_IDS else getattr(self.view, key)
        return self.members()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)
