from __future__ import annotations

import pytest
from hypothesis import given
from strategies import paths

from disagg_transforms import Route, detect_route, resolve_format


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions", Route.CHAT_COMPLETIONS),
        ("/v1/completions", Route.COMPLETIONS),
        ("/v1/responses", Route.RESPONSES),
        ("/v1/messages", Route.MESSAGES),
        ("/inference/v1/generate", Route.GENERATE),
        # Substring match, as upstream: sub-paths and prefixes are recognised.
        ("/v1/chat/completions/render", Route.CHAT_COMPLETIONS),
        ("/tenant/v1/messages?beta=true", Route.MESSAGES),
        ("/v1/responses/abc/cancel", Route.RESPONSES),
        # Unknown paths are the generate route, as upstream.
        ("/v1/embeddings", Route.GENERATE),
        ("", Route.GENERATE),
        ("/generate", Route.GENERATE),
    ],
)
def test_detect_route(path: str, route: Route) -> None:
    assert detect_route(path) is route


def test_route_values_are_paths() -> None:
    assert {r.value for r in Route} == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
    }


@pytest.mark.parametrize(
    ("use_openai_format", "path", "expected"),
    [
        # Completions is always honoured, whatever the flag.
        (True, "/v1/completions", Route.COMPLETIONS),
        (False, "/v1/completions", Route.COMPLETIONS),
        # Flag false: every other client goes to generate.
        (False, "/v1/chat/completions", Route.GENERATE),
        (False, "/v1/responses", Route.GENERATE),
        (False, "/v1/messages", Route.GENERATE),
        (False, "/inference/v1/generate", Route.GENERATE),
        (False, "/unknown", Route.GENERATE),
        # Flag true: the detected route.
        (True, "/v1/chat/completions", Route.CHAT_COMPLETIONS),
        (True, "/v1/responses", Route.RESPONSES),
        (True, "/v1/messages", Route.MESSAGES),
        (True, "/inference/v1/generate", Route.GENERATE),
        (True, "/unknown", Route.GENERATE),
    ],
)
def test_resolve_format(use_openai_format: bool, path: str, expected: Route) -> None:
    assert resolve_format(use_openai_format, path) is expected


@given(paths, paths)
def test_resolve_format_is_total(path: str, other: str) -> None:
    for flag in (True, False):
        route = resolve_format(flag, path)
        assert isinstance(route, Route)
        detected = detect_route(path)
        if detected is Route.COMPLETIONS:
            assert route is Route.COMPLETIONS
        elif not flag:
            assert route is Route.GENERATE
        else:
            assert route is detected
    # Detection only looks at the path it is given.
    assert detect_route(path + other) in set(Route)
