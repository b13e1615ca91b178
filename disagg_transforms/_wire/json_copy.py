"""A deep copy of the JSON containers in a body, safe on any nesting and fast on token arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Immutable JSON leaves: a list made only of these is copied with one C-level `list.copy`.
_LEAF_TYPES = frozenset({int, float, str, bool, type(None)})


def json_copy(value: object) -> Any:  # noqa: ANN401 - a copy of any JSON value is any JSON value
    """Copy every mapping and array in ``value``, sharing the immutable leaves.

    Mappings become ``dict`` and arrays (``list`` or ``tuple``) become ``list``, so the result
    is plain JSON-shaped data that no one else holds a reference to. The walk is iterative
    (a hostile nesting depth cannot raise ``RecursionError``) and memoised by identity (a
    shared or cyclic container is copied once, so the copy has the same sharing). A list of
    scalars such as ``token_ids`` is copied without visiting its items one by one in Python.
    """
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    copies: dict[int, Any] = {}
    pending: list[tuple[Any, Any]] = []

    def shell(item: object) -> Any:  # noqa: ANN401 - see json_copy
        if not isinstance(item, (Mapping, list, tuple)):
            return item
        seen = copies.get(id(item))
        if seen is not None:
            return seen
        target: dict[Any, Any] | list[Any] = {} if isinstance(item, Mapping) else []
        copies[id(item)] = target
        pending.append((item, target))
        return target

    root = shell(value)
    while pending:
        source, target = pending.pop()
        if isinstance(target, dict):
            for key, item in source.items():
                target[key] = shell(item)
        elif _LEAF_TYPES.issuperset(map(type, source)):
            target.extend(source)
        else:
            target.extend(map(shell, source))
    return root
