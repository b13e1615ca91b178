"""Transform plugins: the entry points third-party distributions publish, listed and loaded.

The one part of the hooks that reads the environment (the installed distributions' metadata),
and only when the host calls :func:`available_transforms` or :func:`load_transforms`. Public
through :mod:`disagg_transforms.hooks`; see ``docs/hooks.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from disagg_transforms._wire.describe import describe, describe_error
from disagg_transforms.errors import ConfigError, PluginLoadError

if TYPE_CHECKING:
    from disagg_transforms.hooks import RequestTransform, ResponseTransform

__all__ = ("ENTRY_POINT_GROUP", "available_transforms", "load_transforms")

ENTRY_POINT_GROUP = "disagg_transforms.transforms"
"""The entry-point group third-party distributions publish their transforms in."""


def _group() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def _distribution(entry_point: EntryPoint) -> str | None:
    dist = entry_point.dist
    return None if dist is None else f"{dist.name} {dist.version}"


def available_transforms() -> dict[str, EntryPoint]:
    """List the installed transform plugins by name, importing none of them.

    When two distributions publish the same name, the first one on ``sys.path`` is listed;
    :func:`load_transforms` refuses such a name as ambiguous.

    Returns:
        Entry-point name → its :class:`importlib.metadata.EntryPoint`, sorted by name.
    """
    found: dict[str, EntryPoint] = {}
    for entry_point in _group():
        found.setdefault(entry_point.name, entry_point)
    return dict(sorted(found.items()))


def _load_one(name: str, candidates: Sequence[EntryPoint], installed: Iterable[str]) -> Any:  # noqa: ANN401 - entry points load anything; checked below
    if not candidates:
        listed = ", ".join(sorted(set(installed))) or "none"
        msg = (
            f"transform plugin {name!r} is not installed: no distribution publishes it in the "
            f"entry-point group {ENTRY_POINT_GROUP!r} (installed: {listed})"
        )
        raise PluginLoadError(msg, plugin=name)
    distributions = sorted({_distribution(ep) or "an unknown distribution" for ep in candidates})
    if len(candidates) > 1:
        msg = f"transform plugin {name!r} is ambiguous: published by {', '.join(distributions)}"
        raise PluginLoadError(msg, plugin=name)
    entry_point = candidates[0]
    dist = _distribution(entry_point)
    where = f"{name!r} ({entry_point.value}, from {dist or 'an unknown distribution'})"
    try:
        loaded: object = entry_point.load()
    except Exception as exc:
        msg = f"transform plugin {where} failed to load: {describe_error(exc)}"
        raise PluginLoadError(msg, plugin=name, distribution=dist) from exc
    if not callable(loaded):
        msg = f"transform plugin {where} is not callable: it is {describe(loaded)}"
        raise PluginLoadError(msg, plugin=name, distribution=dist)
    try:
        inspect.signature(loaded).bind(None, None)
    except TypeError:
        msg = f"transform plugin {where} does not take (body, context)"
        raise PluginLoadError(msg, plugin=name, distribution=dist) from None
    except ValueError:
        pass  # some builtins have no signature to check; calling them will tell
    return loaded


def load_transforms(names: Sequence[str]) -> tuple[RequestTransform | ResponseTransform, ...]:
    """Import the named transform plugins, and only those, in the order given.

    Call it once while the router starts; importing is idempotent, so calling it again (or in
    every worker process) returns the same objects.

    Args:
        names: entry-point names in the group ``disagg_transforms.transforms``.

    Returns:
        The loaded transforms, one per name, in ``names`` order.

    Raises:
        PluginLoadError: a name is not installed, is published twice, fails to import, or is
            not a callable taking ``(body, context)``; it names the plugin and its distribution.
        ConfigError: ``names`` is a string rather than a sequence of names.
    """
    untyped: object = names
    if isinstance(untyped, (str, bytes)) or not isinstance(untyped, Sequence):
        msg = f"transforms: expected a list of entry-point names, got {describe(untyped)}"
        raise ConfigError(msg, param="transforms")
    group = _group()
    loaded: list[RequestTransform | ResponseTransform] = []
    for name in names:
        candidates = [ep for ep in group if ep.name == name]
        loaded.append(_load_one(name, candidates, (ep.name for ep in group)))
    return tuple(loaded)
