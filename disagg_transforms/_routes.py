"""Routes: which API a path speaks, and which route a leg is sent to."""

from __future__ import annotations

import enum
from typing import Final

__all__ = (
    "CHAT_ROUTE",
    "COMPLETIONS_ROUTE",
    "GENERATE_ROUTE",
    "ROUTE_PATH",
    "Route",
    "detect_route",
    "leg_route",
    "resolve_format",
)


class Route(str, enum.Enum):
    """An HTTP route a client or a worker speaks; the value is its path."""

    CHAT_COMPLETIONS = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"
    MESSAGES = "/v1/messages"
    GENERATE = "/inference/v1/generate"


ROUTE_PATH = {route: route.value for route in Route}
"""Each route's path, read without the descriptor call a member's ``.value`` costs."""

# As plain names for the code every leg runs: on Python 3.10 and 3.11 each read of an enum
# class's attribute goes through EnumType.__getattr__'s hook, a bound method built and called
# (docs/performance.md, "Calls that parse their arguments").
CHAT_ROUTE: Final = Route.CHAT_COMPLETIONS
COMPLETIONS_ROUTE: Final = Route.COMPLETIONS
GENERATE_ROUTE: Final = Route.GENERATE

# Substring matches, as the llm-d coordinator does; chat is tested before completions because
# its path contains the completions path.
# Paired with the path text once: a member's .value is a descriptor call on every read.
_DETECTION_ORDER = tuple(
    (route.value, route)
    for route in (Route.CHAT_COMPLETIONS, Route.COMPLETIONS, Route.RESPONSES, Route.MESSAGES)
)


def detect_route(path: str) -> Route:
    """Return the route ``path`` belongs to; an unknown path is the generate route.

    The match is by substring, so ``/v1/chat/completions/render`` or a path behind a prefix
    such as ``/tenant-a/v1/messages`` is recognised.
    """
    for text, route in _DETECTION_ORDER:
        if text in path:
            return route
    return Route.GENERATE


def resolve_format(use_openai_format: bool, path: str) -> Route:
    """Return the route a leg for a client on ``path`` is sent to.

    Completions is always honoured (a tokens-in completions client sends ``prompt`` as token
    IDs on its own route); otherwise ``use_openai_format=False`` sends the leg to the generate
    route, and ``True`` keeps the client's route.
    """
    return leg_route(use_openai_format, detect_route(path))


def leg_route(use_openai_format: bool, client_route: Route) -> Route:
    """:func:`resolve_format` for a client whose route is known."""
    if client_route is COMPLETIONS_ROUTE:
        return COMPLETIONS_ROUTE
    if not use_openai_format:
        return GENERATE_ROUTE
    return client_route
