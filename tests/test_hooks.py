from __future__ import annotations

import copy
import functools
import pickle
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_objects, json_values

from disagg_transforms import (
    ENTRY_POINT_GROUP,
    ConfigError,
    DecodeParams,
    DisaggTransformError,
    Pipeline,
    PluginLoadError,
    RequestError,
    RequestTransform,
    Route,
    Step,
    TransformContext,
    TransformError,
    UpstreamContractError,
    available_transforms,
    load_transforms,
)
from disagg_transforms._wire.json_copy import json_copy

CONTEXT = TransformContext(client_path="/v1/chat/completions", step=Step.DECODE)


def tag(label: str) -> RequestTransform:
    """A transform that appends ``label`` to the body's ``trail`` list."""

    def transform(body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        return {**body, "trail": [*body.get("trail", []), label]}

    transform.__qualname__ = f"tag_{label}"
    return transform


def mutate_in_place(body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
    # Rude on purpose: it changes what it was given, nested containers included.
    assert isinstance(body, dict)
    body["added"] = True
    for value in body.values():
        if isinstance(value, list):
            value.append("x")
        elif isinstance(value, dict):
            value["x"] = 1
    return body


def explode(_body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
    missing = "sampling_params"
    raise KeyError(missing)


# --- TransformContext --------------------------------------------------------------------------


def test_context_is_frozen_and_knows_the_client_route() -> None:
    context = TransformContext(
        client_path="/v1/messages", step=Step.DECODE, params=DecodeParams(), extra={"tenant": "a"}
    )
    assert context.client_route is Route.MESSAGES
    assert context.extra["tenant"] == "a"
    with pytest.raises(AttributeError):
        context.step = Step.PREFILL  # type: ignore[misc]
    assert dict(CONTEXT.extra) == {}


# --- running -------------------------------------------------------------------------------------


def test_transforms_run_first_to_last() -> None:
    pipeline = Pipeline(request=[tag("a"), tag("b"), tag("c")], response=[tag("z"), tag("y")])
    assert pipeline.run_request({}, CONTEXT) == {"trail": ["a", "b", "c"]}
    assert pipeline.run_response({}, CONTEXT) == {"trail": ["z", "y"]}


def test_each_output_feeds_the_next() -> None:
    def double(body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        return {"n": body["n"] * 2}

    def add_one(body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        return {"n": body["n"] + 1}

    assert Pipeline([double, add_one]).run_request({"n": 3}, CONTEXT) == {"n": 7}
    assert Pipeline([add_one, double]).run_request({"n": 3}, CONTEXT) == {"n": 8}


def test_transforms_see_the_context() -> None:
    seen: list[TransformContext] = []

    def spy(body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        seen.append(context)
        return dict(body)

    Pipeline([spy]).run_request({}, CONTEXT)
    assert seen == [CONTEXT]


def test_empty_pipeline_returns_an_equal_copy() -> None:
    body = {"a": [1, {"b": 2}], "c": (3, 4)}
    result = Pipeline().run_request(body, CONTEXT)
    assert result == {"a": [1, {"b": 2}], "c": [3, 4]}
    assert result is not body
    assert result["a"] is not body["a"]


@given(json_objects)
def test_the_callers_body_is_never_mutated(body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    pipeline = Pipeline([mutate_in_place], [mutate_in_place])
    request = pipeline.run_request(body, CONTEXT)
    response = pipeline.run_response(body, CONTEXT)
    assert body == before
    assert request["added"] is True
    assert response["added"] is True


@given(json_objects)
def test_an_empty_pipeline_keeps_every_field(body: dict[str, Any]) -> None:
    assert Pipeline().run_request(body, CONTEXT) == json_copy(body)
    assert Pipeline().run_request(body, CONTEXT).keys() == body.keys()


@pytest.mark.parametrize("body", [None, [], "body", 3])
def test_a_non_object_body_is_refused_with_the_sides_error(body: Any) -> None:
    with pytest.raises(RequestError) as request_error:
        Pipeline().run_request(body, CONTEXT)
    assert request_error.value.param == "$"
    with pytest.raises(UpstreamContractError):
        Pipeline().run_response(body, CONTEXT)


# --- errors from transforms ---------------------------------------------------------------------


def test_a_foreign_error_is_wrapped_naming_the_transform() -> None:
    pipeline = Pipeline([tag("a"), explode, tag("b")])
    with pytest.raises(TransformError) as caught:
        pipeline.run_request({}, CONTEXT)
    error = caught.value
    assert error.transform == f"{explode.__module__}.explode"
    assert error.transform in str(error)
    assert "KeyError" in str(error)
    assert isinstance(error.__cause__, KeyError)
    assert error.status_hint == 500


def test_our_own_errors_pass_through_unchanged() -> None:
    refusal = RequestError("$.messages: refused, got []", param="$.messages")

    def refuse(_body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        raise refusal

    with pytest.raises(RequestError) as caught:
        Pipeline([refuse]).run_request({}, CONTEXT)
    assert caught.value is refusal


@pytest.mark.parametrize("returned", [None, [], "body", 1, (("a", 1),)])
def test_a_non_dict_result_is_a_transform_error(returned: object) -> None:
    def bad(_body: Mapping[str, Any], _context: TransformContext) -> Any:
        return returned

    with pytest.raises(TransformError) as caught:
        Pipeline(response=[bad]).run_response({}, CONTEXT)
    assert caught.value.transform.endswith("bad")
    assert "expected a dict" in str(caught.value)


def test_names_of_partials_and_callable_objects() -> None:
    class Callable:
        def __call__(self, _body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
            raise ValueError("x" * 1000)

    def with_label(_body: Mapping[str, Any], _context: TransformContext, label: str) -> Any:
        raise ValueError(label)

    with pytest.raises(TransformError) as caught:
        Pipeline([Callable()]).run_request({}, CONTEXT)
    assert caught.value.transform.endswith("Callable")
    assert len(str(caught.value)) < 400
    with pytest.raises(TransformError) as caught:
        Pipeline([functools.partial(with_label, label="L")]).run_request({}, CONTEXT)
    assert caught.value.transform.endswith("with_label")


def test_an_exception_with_a_broken_str_is_still_wrapped() -> None:
    class WeirdError(Exception):
        def __str__(self) -> str:
            raise RuntimeError

    def raise_weird(_body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        raise WeirdError

    with pytest.raises(TransformError, match=r"WeirdError$"):
        Pipeline([raise_weird]).run_request({}, CONTEXT)


@given(st.sampled_from([KeyError, TypeError, ValueError, RecursionError, ZeroDivisionError]))
def test_any_foreign_error_becomes_ours(kind: type[Exception]) -> None:
    def fail(_body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        raise kind

    with pytest.raises(DisaggTransformError) as caught:
        Pipeline(response=[fail]).run_response({}, CONTEXT)
    assert isinstance(caught.value.__cause__, kind)


def test_transform_errors_pickle_with_their_attributes() -> None:
    error = TransformError("boom", transform="pkg.t", param="$.a")
    copied = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own object
    assert (copied.transform, copied.param, str(copied)) == ("pkg.t", "$.a", "boom")
    load = PluginLoadError("gone", plugin="p", distribution="d 1.0")
    copied_load = pickle.loads(pickle.dumps(load))  # noqa: S301 - our own object
    assert (copied_load.plugin, copied_load.distribution) == ("p", "d 1.0")
    assert isinstance(copied_load, ConfigError)


# --- immutability and composition ---------------------------------------------------------------


def test_pipeline_is_immutable() -> None:
    pipeline = Pipeline([tag("a")])
    with pytest.raises(AttributeError):
        pipeline.request = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pipeline.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        del pipeline.request
    assert isinstance(pipeline.request, tuple)


def test_a_list_given_to_the_pipeline_is_copied() -> None:
    transforms = [tag("a")]
    pipeline = Pipeline(transforms)
    transforms.append(tag("b"))
    assert pipeline.run_request({}, CONTEXT) == {"trail": ["a"]}


def test_adding_returns_new_pipelines() -> None:
    a, b, z = tag("a"), tag("b"), tag("z")
    base = Pipeline([a])
    longer = base.with_request(b).with_response(z)
    assert base == Pipeline([a])
    assert longer == Pipeline([a, b], [z])
    assert base + longer == Pipeline([a, a, b], [z])
    assert hash(base) == hash(Pipeline([a]))
    assert base.__add__(1) is NotImplemented
    not_a_pipeline: object = "pipeline"
    assert base != not_a_pipeline
    assert "tag_a" in repr(longer)
    assert "tag_z" in repr(longer)


def test_pipeline_pickles() -> None:
    pipeline = Pipeline([mutate_in_place], [explode])
    assert pickle.loads(pickle.dumps(pipeline)) == pipeline  # noqa: S301 - our own object


@pytest.mark.parametrize(
    ("request_side", "param"),
    [
        ([1], "pipeline.request[0]"),
        ([tag("a"), "b"], "pipeline.request[1]"),
        ("ab", "pipeline.request"),
    ],
)
def test_non_callables_are_refused_at_build_time(request_side: Any, param: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Pipeline(request_side)
    assert caught.value.param == param


def test_one_pipeline_serves_many_threads() -> None:
    def square(body: Mapping[str, Any], _context: TransformContext) -> dict[str, Any]:
        return {**body, "n": body["n"] ** 2}

    pipeline = Pipeline([mutate_in_place, square, tag("done")])
    bodies = [{"n": i, "list": [i], "obj": {"i": i}} for i in range(400)]
    before = copy.deepcopy(bodies)
    results: dict[int, dict[str, Any]] = {}
    barrier = threading.Barrier(8)

    def work(offset: int) -> None:
        barrier.wait()
        for i in range(offset, len(bodies), 8):
            results[i] = pipeline.run_request(bodies[i], CONTEXT)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bodies == before
    for i, result in results.items():
        assert result == {
            "n": i * i,
            "list": [i, "x"],
            "obj": {"i": i, "x": 1},
            "added": True,
            "trail": ["done"],
        }
    assert len(results) == len(bodies)


# --- json_copy ------------------------------------------------------------------------------------


@given(json_values)
def test_json_copy_is_equal_and_unshared(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value
    if isinstance(value, (dict, list)) and value:
        assert copied is not value


def test_json_copy_survives_deep_nesting_and_cycles() -> None:
    deep: list[Any] = []
    node = deep
    for _ in range(100_000):
        child: list[Any] = []
        node.append(child)
        node = child
    copied = json_copy(deep)
    assert copied is not deep
    cyclic: dict[str, Any] = {"a": [1]}
    cyclic["self"] = cyclic
    cyclic["again"] = cyclic["a"]
    copied_cycle = json_copy(cyclic)
    assert copied_cycle["self"] is copied_cycle
    assert copied_cycle["again"] is copied_cycle["a"]
    assert copied_cycle["a"] is not cyclic["a"]


def test_json_copy_copies_token_arrays() -> None:
    tokens = list(range(200_000))
    copied = json_copy({"token_ids": tokens})
    assert copied["token_ids"] == tokens
    assert copied["token_ids"] is not tokens


# --- entry-point discovery ----------------------------------------------------------------------

_PLUGIN_MODULE = """
from __future__ import annotations

def shout(body, context):
    return {**body, "shout": body.get("text", "").upper()}

def stamp(body, context):
    return {**body, "step": context.step.value}

def no_args():
    return {}

NOT_CALLABLE = {"a": "dict"}
"""

_ENTRY_POINTS = """
[disagg_transforms.transforms]
shout = dt_test_plugin:shout
stamp = dt_test_plugin:stamp
broken = dt_test_plugin_broken:transform
not-callable = dt_test_plugin:NOT_CALLABLE
no-args = dt_test_plugin:no_args
missing-attr = dt_test_plugin:nope
twice = dt_test_plugin:stamp

[some.other.group]
unrelated = dt_test_plugin:shout
"""

_PLUGIN_MODULES = ("dt_test_plugin", "dt_test_plugin_broken", "dt_test_plugin_other")


def _distribution(root: Path, name: str, entry_points: str) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    (info / "METADATA").write_text(metadata, encoding="utf-8")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points), encoding="utf-8")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Two real (if tiny) installed distributions publishing transforms, on sys.path."""
    (tmp_path / "dt_test_plugin.py").write_text(_PLUGIN_MODULE, encoding="utf-8")
    (tmp_path / "dt_test_plugin_broken.py").write_text(
        "raise RuntimeError('plugin exploded at import')\n", encoding="utf-8"
    )
    (tmp_path / "dt_test_plugin_other.py").write_text(_PLUGIN_MODULE, encoding="utf-8")
    _distribution(tmp_path, "dt_test_plugins", _ENTRY_POINTS)
    _distribution(
        tmp_path,
        "dt_other_plugins",
        "[disagg_transforms.transforms]\ntwice = dt_test_plugin_other:stamp\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in _PLUGIN_MODULES:
        sys.modules.pop(module, None)


def test_group_name() -> None:
    assert ENTRY_POINT_GROUP == "disagg_transforms.transforms"


@pytest.mark.usefixtures("plugins")
def test_available_lists_without_importing() -> None:
    found = available_transforms()
    for name in ("shout", "stamp", "broken", "not-callable", "no-args", "twice"):
        assert name in found
    assert "unrelated" not in found
    assert found["shout"].value == "dt_test_plugin:shout"
    assert list(found) == sorted(found)
    for module in _PLUGIN_MODULES:
        assert module not in sys.modules


@pytest.mark.usefixtures("plugins")
def test_load_only_the_named_plugins_in_the_hosts_order() -> None:
    stamp, shout = load_transforms(["stamp", "shout"])
    assert "dt_test_plugin_broken" not in sys.modules
    pipeline = Pipeline([stamp, shout])
    assert pipeline.run_request({"text": "hi"}, CONTEXT) == {
        "text": "hi",
        "step": "decode",
        "shout": "HI",
    }
    assert load_transforms(["shout"])[0] is shout  # loading again is idempotent
    assert load_transforms([]) == ()


@pytest.mark.usefixtures("plugins")
def test_a_missing_plugin_is_named() -> None:
    with pytest.raises(PluginLoadError) as caught:
        load_transforms(["shout", "shuot"])
    error = caught.value
    assert error.plugin == "shuot"
    assert error.distribution is None
    assert "'shuot' is not installed" in str(error)
    assert "shout" in str(error)  # what is installed is listed


@pytest.mark.usefixtures("plugins")
def test_a_plugin_failing_at_import_is_named_with_its_distribution() -> None:
    with pytest.raises(PluginLoadError) as caught:
        load_transforms(["shout", "broken"])
    error = caught.value
    assert error.plugin == "broken"
    assert error.distribution == "dt_test_plugins 1.0"
    assert "plugin exploded at import" in str(error)
    assert "dt_test_plugins 1.0" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    assert isinstance(error, ConfigError)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("not-callable", "is not callable"),
        ("no-args", "does not take (body, context)"),
        ("missing-attr", "failed to load: AttributeError"),
        ("twice", "ambiguous: published by dt_other_plugins 1.0, dt_test_plugins 1.0"),
    ],
)
@pytest.mark.usefixtures("plugins")
def test_unusable_plugins_fail_loudly(name: str, says: str) -> None:
    with pytest.raises(PluginLoadError) as caught:
        load_transforms([name])
    assert caught.value.plugin == name
    assert says in str(caught.value)


@pytest.mark.parametrize("names", ["shout", b"shout", 3, None])
def test_names_must_be_a_sequence(names: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        load_transforms(names)
    assert caught.value.param == "transforms"
