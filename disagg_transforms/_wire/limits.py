"""Size limits on what a client or a worker hands in, and the checks that enforce them.

Each limit has a generous default, documented in ``docs/security.md``; a router that needs
others builds one :class:`Limits` at startup and passes it to every leg builder (and, on the
bytes paths, to the entry points that parse bytes). A value past a limit is a
:class:`~disagg_transforms.errors.RequestError` (client side) or
:class:`~disagg_transforms.errors.UpstreamContractError` (worker side) whose message names the
limit, the JSON path and the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from disagg_transforms._wire import keys as w
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.raw import RawMembers, RawTokenIds
from disagg_transforms.errors import DisaggTransformError, RequestError, UpstreamContractError

MAX_CACHE_SALT_CHARS: Final = 128
"""vLLM's validator caps ``cache_salt`` at 128 characters (the schema says 1024)."""
_CACHE_SALT_FORBIDDEN: Final = ("@", "/", "\\", "\x00")
_CACHE_SALT_REFUSED: Final = re.compile("[" + re.escape("".join(_CACHE_SALT_FORBIDDEN)) + "]")
_N_PATH: Final = f"$.{w.N}"
_SAMPLING_N_PATH: Final = f"$.{w.SAMPLING_PARAMS}.{w.N}"
_LEAF_TYPES: Final = frozenset({int, float, str, bool, type(None)})
# What a mapping's walk skips by its exact type: scalars, and token IDs the bytes path proved flat.
_NOT_NESTED: Final = _LEAF_TYPES | {RawTokenIds}
# A list made only of scalars has depth 1 whatever its length: msgspec checks a long one at C
# speed (a 128k token list in 0.5 ms; a type scan takes 2 ms).
_FLAT_LIST: Final = list[int | float | str | bool | None]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds every entry point enforces on hostile input; frozen, build one at startup.

    The defaults are generous: a real request never meets them, a hostile one is refused before
    it costs memory or a worker's time.
    """

    max_depth: int = 128
    """Deepest nesting of objects and arrays in a body (the body itself is depth 1).

    orjson refuses to write anything deeper than 254, Python's ``json`` overflows near 1000.
    """
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest JSON body an entry point parses from bytes."""
    max_token_ids: int = 1 << 20
    """Most token IDs in a prompt (``token_ids``, or a completions ``prompt`` of IDs)."""
    max_n: int = 16384
    """Largest ``n`` (vLLM's ``VLLM_MAX_N_SEQUENCES`` default)."""


DEFAULT_LIMITS: Final = Limits()


def _too_deep(path: str, limit: int, error: type[DisaggTransformError]) -> DisaggTransformError:
    msg = f"{path}: nested deeper than the limit of {limit} levels (Limits.max_depth)"
    return error(msg, param=path)


def check_depth(
    value: object,
    limit: int,
    *,
    path: str = "$",
    error: type[DisaggTransformError] = RequestError,
) -> None:
    """Refuse ``value`` if its objects and arrays nest more than ``limit`` levels.

    The walk is iterative (no ``RecursionError`` whatever the depth) and stops at the first
    container past the limit, whose JSON path the error names. A list of scalars (a token
    array) costs one C-level type scan.

    Raises:
        RequestError: (or ``error``) nested too deep.
    """
    if not isinstance(value, _validate.CONTAINERS):
        return
    pending: list[tuple[Any, int, str]] = [(value, 1, path)]
    while pending:
        node, depth, where = pending.pop()
        if depth > limit:
            raise _too_deep(where, limit, error)
        # A list is matched first: a Mapping ABC check costs more than the rest of the step.
        if isinstance(node, (list, tuple)):
            if not _is_flat(node):
                pending.extend(
                    (item, depth + 1, f"{where}[{index}]")
                    for index, item in enumerate(node)
                    if isinstance(item, _validate.CONTAINERS)
                )
        else:
            pending.extend(
                (item, depth + 1, f"{where}.{key}")
                for key, item in node.items()
                # A scalar's exact type is in a set: no ABC check for the common case.
                if type(item) not in _NOT_NESTED and isinstance(item, _validate.CONTAINERS)
            )


def _is_flat(array: list[Any] | tuple[Any, ...]) -> bool:
    """The array holds JSON scalars only (no object or array inside)."""
    if len(array) < _validate.CONVERT_FROM or type(array[0]) not in _LEAF_TYPES:
        return _LEAF_TYPES.issuperset(map(type, array))
    try:
        msgspec.convert(array, _FLAT_LIST)
    except msgspec.ValidationError:
        return False
    return True


def check_body_size(data: bytes, limits: Limits, *, error: type[DisaggTransformError]) -> None:
    """Refuse a JSON body of more than ``limits.max_body_bytes`` bytes, before parsing it.

    Raises:
        RequestError: (or ``error``) the body is too large.
    """
    if len(data) > limits.max_body_bytes:
        msg = (
            f"$: the body is {len(data)} bytes, over the limit of {limits.max_body_bytes} "
            "(Limits.max_body_bytes)"
        )
        raise error(msg, param="$")


def check_client_body(body: Mapping[str, Any], limits: Limits) -> None:
    r"""The limits on a client's body: nesting depth, ``n``, ``cache_salt``.

    ``n`` is read at the top level (OpenAI routes) and in ``sampling_params`` (generate route);
    ``cache_salt`` must be 1..128 characters without ``@``, ``/``, ``\\`` or NUL, as vLLM's
    validator requires.

    Raises:
        RequestError: naming the limit, the JSON path and the value.
    """
    # A body from bytes with few brackets is proved shallow by their count: no walk.
    if not (isinstance(body, RawMembers) and body.nests_within(limits.max_depth)):
        check_depth(body, limits.max_depth)
    max_n = limits.max_n
    n = body.get(w.N)
    # An int in range passes as is (the common n): no call to the rule that names a bad one.
    if n is not None and not (type(n) is int and 1 <= n <= max_n):
        _validate.whole_number(n, _N_PATH, minimum=1, maximum=max_n)
    sampling = body.get(w.SAMPLING_PARAMS)
    # None first: an absent sampling_params would cost the Mapping ABC's check.
    if (
        sampling is not None
        and isinstance(sampling, _validate.MAPPINGS)
        and sampling.get(w.N) is not None
    ):
        _validate.whole_number(sampling[w.N], _SAMPLING_N_PATH, minimum=1, maximum=max_n)
    salt = body.get(w.CACHE_SALT)
    if salt is not None:
        _cache_salt(salt, f"$.{w.CACHE_SALT}")


def _cache_salt(salt: object, path: str) -> None:
    if not isinstance(salt, str):
        raise _validate.refuse(salt, "expected a string", at=path)
    if not 1 <= len(salt) <= MAX_CACHE_SALT_CHARS:
        why = f"expected 1 to {MAX_CACHE_SALT_CHARS} characters (vLLM's cache_salt limit)"
        raise _validate.refuse(salt, why, at=path)
    if _CACHE_SALT_REFUSED.search(salt) is not None:
        bad = [char for char in _CACHE_SALT_FORBIDDEN if char in salt]
        why = f"must not contain {bad[0]!r} (vLLM refuses @, /, \\ and NUL)"
        raise _validate.refuse(salt, why, at=path)


def check_token_count(leg: Mapping[str, Any], limits: Limits) -> None:
    """Refuse a leg whose prompt holds more than ``limits.max_token_ids`` token IDs.

    Read from ``token_ids`` (generate route) or a completions ``prompt`` given as IDs.

    Raises:
        RequestError: naming the limit, the path and the count.
    """
    for key in (w.TOKEN_IDS, w.PROMPT):
        ids = leg.get(key)
        if isinstance(ids, RawTokenIds):
            # N IDs take at least 2N + 1 bytes ("[1,2]"): a short array needs no count.
            if len(ids.raw) <= 2 * limits.max_token_ids + 2:
                continue
        elif not isinstance(ids, list):
            continue
        if len(ids) > limits.max_token_ids:
            path = f"$.{key}"
            msg = (
                f"{path}: {len(ids)} token IDs, over the limit of {limits.max_token_ids} "
                "(Limits.max_token_ids)"
            )
            raise RequestError(msg, param=path)


def check_response_depth(response: object) -> None:
    """A worker's answer nested past the default ``max_depth`` breaks the contract.

    Raises:
        UpstreamContractError: naming the limit and the path.
    """
    check_depth(response, DEFAULT_LIMITS.max_depth, error=UpstreamContractError)
