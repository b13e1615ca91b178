"""Checks of what the router and the client hand in: token IDs, multimodal features, typed views.

This is the one home of the typed readers every client mapper and leg builder uses
(:func:`typed`, :func:`integer`, :func:`obj`, :func:`whole_number`, :func:`mapping`) and of
:func:`refuse`, the error they raise.

Every failure is a :class:`~disagg_transforms.errors.RequestError` whose ``param`` is the JSON
path of the bad value (``$.token_ids[3]``, ``$.features.mm_placeholders.image[2].offset``) and
whose message names that value; nothing else escapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Final, NamedTuple, TypeVar

import msgspec

from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import RequestError

T = TypeVar("T")

MAX_TOKEN_ID = 2**63 - 1
"""vLLM stores token IDs as int64."""

CONVERT_FROM = 128
"""Items from which ``msgspec.convert`` checks a list faster than Python (it costs ~2 us a call)."""
_EXACT_TOKEN_IDS = list[Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]]
"""Plain ints in range (a bool is not an int to msgspec): token IDs needing no normalising."""
MAPPINGS = (dict, Mapping)
"""For ``isinstance``: a ``dict`` matches first, without Mapping's ABC machinery."""
CONTAINERS = (dict, list, tuple, Mapping)
"""For ``isinstance``: a JSON object or array, the built-in types matched first."""
CONVERT_ERRORS = (msgspec.ValidationError, RecursionError, UnicodeEncodeError)
"""What ``msgspec.convert`` raises on hostile input: a mismatch, a nesting deeper than the
interpreter's stack, or a key holding a lone surrogate (it cannot be matched as UTF-8)."""

# msgspec ends a validation message with " - at `$.a.b[3]`"; the path is re-rooted on ours.
_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_PATH_STEP = re.compile(r"\.(?P<key>[^.\[]+)|\[(?P<index>\d+)\]")
_MSGSPEC_GOT = re.compile(r", got `[^`]*`$")
# msgspec writes a dict's key as "[...]": which key failed is not in the message.
_HIDDEN_KEY = "[...]"
_MISSING = object()
_STR: Final = frozenset({str})


class MsgspecFailure(NamedTuple):
    """Where and why a msgspec conversion failed, as :func:`msgspec_failure` reads it."""

    path: str
    """The JSON path of the failure under our root (``$.sampling_params.logit_bias``)."""
    inner: str
    """The same path below the converted value (``.logit_bias``; ``""`` for the value)."""
    reason: str
    """msgspec's message without its path (``Expected `float`, got `str```)."""
    exact: bool
    """``inner`` leads to the bad value itself; false when msgspec hid a key of an object on
    the way, and ``path`` stops at that object."""


def msgspec_failure(error: BaseException, root: str = "$") -> MsgspecFailure:
    """Read msgspec's error for a value found at ``root``: the one reader of its paths.

    ``error`` is one of :data:`CONVERT_ERRORS` (or a ``msgspec.DecodeError``). msgspec reports
    ``- at `$.a[0].b``` relative to the value it converted; that path is put under ``root``.
    A dict's key, which msgspec writes as ``[...]``, cuts the path at that object (a JSON path
    must name a real member). An error with no path (nesting too deep, a lone surrogate in a
    key) is at ``root``.
    """
    if isinstance(error, RecursionError):
        reason = "nesting too deep"
    elif isinstance(error, UnicodeEncodeError):
        reason = "a string that is not valid Unicode (a lone surrogate)"
    else:
        reason = str(error)
    found = _MSGSPEC_PATH.search(reason)
    if found is None:
        return MsgspecFailure(root, "", reason, exact=True)
    inner = found.group("path")
    reason = reason[: found.start()]
    hidden = inner.find(_HIDDEN_KEY)
    if hidden >= 0:
        inner = inner[:hidden]
        reason = f"{reason} (in one of its values)"
    return MsgspecFailure(root + inner, inner, reason, exact=hidden < 0)


def _value_at(root: object, path: str) -> object:
    """Follow a msgspec-style ``.key[3]`` path into ``root``; ``_MISSING`` if it goes nowhere."""
    value = root
    for step in _PATH_STEP.finditer(path):
        key, index = step.group("key"), step.group("index")
        if key is not None and isinstance(value, MAPPINGS) and key in value:
            value = value[key]
        elif index is not None and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return _MISSING
    return value


def refuse(value: object, why: str, *, at: str) -> RequestError:
    """The error for the value at JSON path ``at`` (``why``: what was expected or needed)."""
    msg = f"{at}: {why}, got {describe(value)}"
    return RequestError(msg, param=at)


def convert(value: object, view: type[T], path: str) -> T:
    """Read ``value`` through the typed ``view``; a mismatch is a RequestError at ``path``.

    Args:
        value: a decoded JSON value (dicts, lists, scalars).
        view: the msgspec type to read it as.
        path: the JSON path of ``value`` in the client's or router's body (``$`` for the root).
    """
    try:
        return msgspec.convert(value, view)
    except CONVERT_ERRORS as exc:
        failure = msgspec_failure(exc, path)
        bad = _value_at(value, failure.inner) if failure.exact else _MISSING
        if bad is _MISSING:
            msg = f"{failure.path}: {failure.reason}"
            raise RequestError(msg, param=failure.path) from None
        # "Expected `float`, got `str`" names the JSON type; the value itself says more.
        reason = _MSGSPEC_GOT.sub("", failure.reason)
        raise refuse(bad, reason[:1].lower() + reason[1:], at=failure.path) from None


def mapping(value: object, path: str) -> Mapping[str, Any]:
    """Return ``value`` if it is a JSON object, else raise a RequestError at ``path``."""
    if not isinstance(value, MAPPINGS):
        raise refuse(value, "expected an object", at=path)
    return value


def client_object(body: object) -> Mapping[str, Any]:
    """Check that a client body is a JSON object with string keys (the root, ``$``)."""
    body = mapping(body, "$")
    if not _STR.issuperset(map(type, body)):  # a C-speed pass; the loop names a bad key
        for key in body:
            if not isinstance(key, str):
                raise refuse(key, "expected string keys", at="$")
    return body


def whole_number(
    value: object, path: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Return ``value`` as an int in ``[minimum, maximum]``; a whole float such as 5.0 is 5.

    Bools, floats with a fraction, strings, null and anything else are refused, as are values
    out of range.
    """
    number: int | None = None
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None:
        raise refuse(value, "expected an integer", at=path)
    # Name the bound that was broken: "at most 2**63 - 1" is noise to a client who sent 0.
    if minimum is not None and number < minimum:
        raise refuse(value, f"expected an integer at least {minimum}", at=path)
    if maximum is not None and number > maximum:
        raise refuse(value, f"expected an integer at most {maximum}", at=path)
    return number


# The field readers: ``body[key]`` at ``{parent}.{key}``; absent and null are both ``None``
# (vLLM reads null as "not set", and a leg must not invent a server default).


def _str_list(value: object) -> bool:
    return type(value) is list and _STR.issuperset(map(type, value))


def _str_keyed(value: object) -> bool:
    return type(value) is dict and _STR.issuperset(map(type, value))


ARRAY: Final = list[Any]
STRINGS: Final = list[str]
OBJECT: Final = dict[str, Any]
STRING_OR_STRINGS: Final = str | list[str]
STRING_OR_OBJECT: Final = str | dict[str, Any]
# The values msgspec accepts for a view, recognised by their exact types: msgspec builds a
# generic view (`list[str]`, `str | ...`) anew on each convert (1-2 µs, ten times a class's),
# and hashing a union costs 0.4 µs, so the views above are found by identity. Anything else
# goes to msgspec, which accepts it or names what is wrong.
_CONFORMS: Final[Mapping[int, Callable[[object], bool]]] = {
    id(bool): lambda value: type(value) is bool,
    id(float): lambda value: type(value) is float,
    id(str): lambda value: type(value) is str,
    id(ARRAY): lambda value: type(value) is list,
    id(STRINGS): _str_list,
    id(OBJECT): _str_keyed,
    id(STRING_OR_STRINGS): lambda value: type(value) is str or _str_list(value),
    id(STRING_OR_OBJECT): lambda value: type(value) is str or _str_keyed(value),
}


def typed(body: Mapping[str, Any], key: str, view: Any, parent: str = "$") -> Any:  # noqa: ANN401 - a JSON value of the view's type
    """``body[key]`` checked against the msgspec type ``view`` and returned as sent.

    ``int`` is read by :func:`whole_number` (``20.0`` is 20, as vLLM reads it); for any other
    view the value is returned unchanged once it conforms (``1`` for a ``float`` stays ``1``).
    """
    value = body.get(key)
    if value is None or type(value) is view:  # msgspec takes a value of the very class
        return value
    if view is int:
        return whole_number(value, f"{parent}.{key}")
    conforms = _CONFORMS.get(id(view))
    if conforms is None or not conforms(value):
        convert(value, view, f"{parent}.{key}")
    return value


def integer(
    body: Mapping[str, Any], key: str, parent: str = "$", *, minimum: int | None = None
) -> int | None:
    """``body[key]`` as an integer of at least ``minimum`` (a whole float counts)."""
    value = body.get(key)
    return None if value is None else whole_number(value, f"{parent}.{key}", minimum=minimum)


def obj(body: Mapping[str, Any], key: str, parent: str = "$") -> Mapping[str, Any] | None:
    """``body[key]`` as a JSON object (returned as sent, not copied)."""
    value = body.get(key)
    if value is None or isinstance(value, MAPPINGS):
        return value  # the path is formatted only for the error
    return mapping(value, f"{parent}.{key}")


def token_ids(
    value: object, path: str = "$.token_ids", *, maximum: int | None = MAX_TOKEN_ID
) -> list[int]:
    """Check a token-ID list: integers in ``[0, maximum]``; whole floats become ints.

    Returns the list itself when every item is already an int (no copy; an ``int`` subclass such
    as an ``IntEnum`` counts as one), else a normalised copy. ``maximum`` ``None``: no upper
    bound (the bytes path leaves the range to the worker).

    Raises:
        RequestError: with the index of the first bad item, e.g. ``$.token_ids[3]``.
    """
    if type(value) is list and len(value) >= CONVERT_FROM:
        try:
            msgspec.convert(value, _EXACT_TOKEN_IDS)  # the common case, checked at C speed
        except msgspec.ValidationError:
            pass  # a whole float, or a bad item: the loop below normalises it or names it
        else:
            return value
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise refuse(value, "expected an array of token IDs", at=path)
    exact = True
    for index, item in enumerate(value):
        # The common case (a plain int in range) stays on this cheap branch.
        if type(item) is int and 0 <= item <= MAX_TOKEN_ID:
            continue
        whole_number(item, f"{path}[{index}]", minimum=0, maximum=maximum)
        exact = False
    if exact and isinstance(value, list):
        return value
    return [whole_number(item, path, minimum=0) for item in value]


def _modality_list(group: Mapping[str, Any], modality: str, path: str) -> Sequence[Any]:
    value = group.get(modality)
    if not isinstance(value, list):
        raise refuse(value, "expected an array", at=f"{path}.{modality}")
    return value


def _placeholder(value: object, n_tokens: int, path: str) -> None:
    item = mapping(value, path)
    offset = whole_number(item.get(w.OFFSET), f"{path}.{w.OFFSET}", minimum=0)
    length = whole_number(item.get(w.LENGTH), f"{path}.{w.LENGTH}", minimum=0)
    # describe(), not f"{offset}": an attacker-sized integer has too many digits for str().
    if offset >= n_tokens:
        where = f"{path}.{w.OFFSET}"
        msg = f"{where}: offset {describe(offset)} is outside the prompt of {n_tokens} token IDs"
        raise RequestError(msg, param=where)
    if offset + length > n_tokens:
        where = f"{path}.{w.LENGTH}"
        msg = (
            f"{where}: the span at offset {offset} with length {describe(length)} runs past "
            f"the prompt of {n_tokens} token IDs"
        )
        raise RequestError(msg, param=where)


def _data_items(features: Mapping[str, Any], key: str, modality: str, count: int) -> None:
    group = obj(features, key, "$.features")
    if group is None or modality not in group:
        return
    path = f"$.features.{key}"
    items = _modality_list(group, modality, path)
    _same_length(items, count, f"{path}.{modality}")
    for index, item in enumerate(items):
        # A cache hit is JSON null: vLLM decodes "" as an inline tensor and fails.
        if item is None or (isinstance(item, str) and item):
            continue
        why = "expected a non-empty string or null (a cache hit)"
        raise refuse(item, why, at=f"{path}.{modality}[{index}]")


def _same_length(items: Sequence[Any], count: int, path: str) -> None:
    if len(items) != count:
        msg = f"{path}: has {len(items)} items but mm_hashes has {count} for this modality"
        raise RequestError(msg, param=path)


def features(value: object, n_tokens: int) -> Mapping[str, Any]:
    """Check multimodal ``features`` against a prompt of ``n_tokens`` token IDs.

    Per modality, ``mm_hashes`` / ``mm_placeholders`` / ``kwargs_data`` / ``mm_metadata`` are
    parallel lists of equal length; each placeholder's ``offset`` and ``length`` are
    non-negative integers with ``offset < n_tokens`` and ``offset + length <= n_tokens``; a
    ``kwargs_data`` item is a non-empty string or JSON null. Returns ``value`` unchanged.

    Raises:
        RequestError: with the JSON path, e.g. ``$.features.mm_placeholders.image[2].offset``.
    """
    root = mapping(value, "$.features")
    hashes = mapping(root.get(w.MM_HASHES), f"$.features.{w.MM_HASHES}")
    placeholders = mapping(root.get(w.MM_PLACEHOLDERS), f"$.features.{w.MM_PLACEHOLDERS}")
    for modality in placeholders:
        if modality not in hashes:
            where = f"$.features.{w.MM_PLACEHOLDERS}.{modality}"
            msg = f"{where}: modality {describe(modality)} has placeholders but no mm_hashes"
            raise RequestError(msg, param=where)
    for modality in hashes:
        hash_path = f"$.features.{w.MM_HASHES}"
        items = _modality_list(hashes, modality, hash_path)
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise refuse(item, "expected a string", at=f"{hash_path}.{modality}[{index}]")
        place_path = f"$.features.{w.MM_PLACEHOLDERS}"
        spans = _modality_list(placeholders, modality, place_path)
        _same_length(spans, len(items), f"{place_path}.{modality}")
        for index, span in enumerate(spans):
            _placeholder(span, n_tokens, f"{place_path}.{modality}[{index}]")
        _data_items(root, w.KWARGS_DATA, modality, len(items))
        _data_items(root, w.MM_METADATA, modality, len(items))
    return root
