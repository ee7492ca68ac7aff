"""Unit tests of the HTTP API's parts: errors, API keys, the route guard, KServe body checks, the policy."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from predictor.core.errors import Unavailable, format_param, parse_param, quoted
from predictor.http import auth
from predictor.http.api_args import api_config, check_api_args, request_policy
from predictor.http.api_config import ApiConfig
from predictor.http.auth import ApiKeys, bearer_token, parse_keys
from predictor.http.errors import ApiError, from_service_error, invalid_field
from predictor.http.jev_api import model_list
from predictor.http.kserve_inputs import check_v2_binary_body, cloudevent_error
from predictor.http.route_guard import RouteGuardMiddleware
from predictor.serving.request_policy import RequestPolicy
from predictor.serving.service import ModelCard


@pytest.mark.parametrize("param", ["inputs[0].data[2].model", "instances[1].questions.q", "[3].model", "state", ""])
def test_param_paths_round_trip(param: str) -> None:
    assert format_param(parse_param(param)) == param


def test_error_body_has_our_object_and_fastapis_detail() -> None:
    body = invalid_field(
        "a choice question needs 2 to 255 labels, got 1", ("questions", "q", "criteria"), "value_error"
    ).body()
    message = "questions.q.criteria: a choice question needs 2 to 255 labels, got 1"
    assert body["error"] == {"message": message, "type": "invalid_request_error", "param": "questions.q.criteria"}
    assert body["detail"] == [{"loc": ["body", "questions", "q", "criteria"], "msg": message, "type": "value_error"}]
    nested = ApiError(404, "not_found_error", "gone", ("model",)).under(("instances", 2))
    assert nested.param == "instances[2].model" and nested.status == 404


def test_a_full_queue_is_429_and_a_server_that_cannot_serve_503() -> None:
    shed = from_service_error(Unavailable("the server is at capacity", "overloaded", 2))
    assert shed.status == 429 and shed.headers == {"Retry-After": "2", "retry-after-ms": "2000"}
    assert shed.body() == {
        "error": {"message": "the server is at capacity", "type": "too_many_requests", "param": None},
        "detail": "the server is at capacity",  # nothing in the request is at fault: no loc
    }
    for reason in ("warming_up", "draining", "engine_dead", "encoder_died"):
        refused = from_service_error(Unavailable("not now", reason, 5))
        assert refused.status == 503 and refused.headers["Retry-After"] == "5", reason
    import grpc

    from predictor.http.grpc_access import grpc_status

    # over gRPC both stay UNAVAILABLE, gRPC's retryable status, with the delay in the message
    assert grpc_status(Unavailable("full", "overloaded", 2)) == (grpc.StatusCode.UNAVAILABLE, "full (retry after 2 s)")


def test_model_list_satisfies_the_hosted_shape_and_openais() -> None:
    listed = model_list(ModelCard("clef-flash", "the model", "2026-09-15"), ("jev-latest",))
    assert listed["object"] == "list"
    assert listed["data"] == [
        {"id": name, "object": "model", "created": 1789430400, "owned_by": "clef"}
        for name in ("clef-flash", "jev-latest")
    ]
    assert listed["models"] == [
        {"name": name, "description": "the model", "release_date": "2026-09-15"}
        for name in ("clef-flash", "jev-latest")
    ]


def test_keys_from_text_skip_blanks_and_comments() -> None:
    assert parse_keys("# comment\n a \n\nb,c\n") == [b"a", b"b", b"c"]


def test_bearer_token() -> None:
    assert bearer_token([(b"authorization", b"Bearer abc ")]) == b"abc"
    assert bearer_token([(b"Authorization", b"bearer abc")]) == b"abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer ")]) is None
    assert bearer_token([]) is None


def test_key_file_is_read_again_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", 0.0)
    path = tmp_path / "keys"
    path.write_text("one\n")
    keys = ApiKeys(path, "env-key")
    assert keys.enabled and keys.accepts(b"one") and keys.accepts(b"env-key") and not keys.accepts(b"two")
    path.write_text("two\nthree\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert keys.accepts(b"two") and not keys.accepts(b"one")
    path.unlink()
    assert not keys.accepts(b"two") and keys.accepts(b"env-key"), "a vanished file accepts none of its keys"
    assert not ApiKeys(None, "").enabled and not ApiKeys(None, None).accepts(b"")


def test_route_guard() -> None:
    guard = RouteGuardMiddleware(lambda *_: None, served_names=("clef-flash", "jev-latest"))
    for path in (
        "/v2/repository/models/clef-flash/unload",
        "/openapi.json",
        "/docs",
        "/redoc",
        "/v2/models/clef-flash/versions/1/infer",
        "/v1/models/clef-flash:explain",
        "/v1/models/other:predict",
        "/v2/models/other/ready",
    ):
        refusal = guard.refusal(path)
        assert refusal is not None and refusal.status == 404, path
    for path in (
        "/v1/models/clef-flash:predict",
        "/v2/models/jev-latest/infer",
        "/v1/models",
        "/health",
        "/v1/systemone",
    ):
        assert guard.refusal(path) is None, path
    opened = RouteGuardMiddleware(lambda *_: None, ("m",), enable_model_repository=True, enable_docs=True)
    assert opened.refusal("/v2/repository/models/m/unload") is None and opened.refusal("/openapi.json") is None
    assert quoted("x" * 1000) == repr("x" * 64) + "... (1000 characters)"


def _binary(header: object, payload: bytes) -> tuple[bytes, str]:
    raw = json.dumps(header).encode()
    return raw + payload, str(len(raw))


ELEMENT = struct.pack("<I", 2) + b"{}"


@pytest.mark.parametrize(
    "header, payload, length, param",
    [
        (
            {"inputs": [{"name": "r", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]},
            ELEMENT,
            "x",
            "inference-header-content-length",
        ),
        ([], b"", None, None),
        (
            {"inputs": [{"name": "r", "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]},
            ELEMENT,
            None,
            "inputs[0].shape",
        ),
        (
            {"inputs": [{"name": "r", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 0}}]},
            ELEMENT,
            None,
            "inputs[0].parameters.binary_data_size",
        ),
        (
            {"inputs": [{"name": "r", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}]},
            ELEMENT,
            None,
            "inputs[0].parameters.binary_data_size",
        ),
        (
            {"inputs": [{"name": "r", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 6}}]},
            ELEMENT,
            None,
            "inputs[0].parameters.binary_data_size",
        ),
        ({"inputs": [{"name": "r", "datatype": "BYTES", "shape": [10**9]}]}, b"", None, "inputs[0].shape"),
        ({"inputs": []}, b"", None, "inputs"),
    ],
)
def test_malformed_v2_binary_bodies_name_the_field(
    header: object, payload: bytes, length: str | None, param: str | None
) -> None:
    body, json_length = _binary(header, payload)
    with pytest.raises(ApiError) as caught:
        check_v2_binary_body(body, length if length is not None else json_length)
    assert caught.value.status == 400 and caught.value.param == param


def test_well_formed_v2_binary_body_passes() -> None:
    body, length = _binary(
        {"inputs": [{"name": "r", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]}, ELEMENT
    )
    check_v2_binary_body(body, length)


def test_unreadable_cloudevents_are_400() -> None:
    headers = {"ce-specversion": "1.0", "ce-source": "s", "ce-type": "t", "ce-id": "1"}
    for content_type in ("application/cloudevents+json", "application/json"):
        error = cloudevent_error("/v1/models/m:predict", {**headers, "content-type": content_type}, b"{")
        assert content_type == "application/json" or (error is not None and error.status == 400)
    assert cloudevent_error("/v1/models/m:predict", {"content-type": "application/json"}, b"{") is None
    empty = cloudevent_error("/v1/models/m:predict", {**headers, "content-type": "application/json"}, b"")
    assert empty is not None and "no data" in empty.message
    assert cloudevent_error("/v1/models/m:predict", {**headers, "content-type": "application/json"}, b"{}") is None


def test_policy_names() -> None:
    policy = RequestPolicy(aliases=("jev-latest",))
    assert policy.serves("clef-flash", "clef-flash") and policy.serves("clef-flash", "jev-latest")
    assert not policy.serves("clef-flash", "@cf/cloudflare/clef-flash")
    assert RequestPolicy(accept_any_name=True).serves("clef-flash", "@cf/cloudflare/clef-flash")


def test_api_flags(tmp_path: Path) -> None:
    from predictor.cli import build_parser

    parser = build_parser(["--engine", "transformers"])
    args = parser.parse_args([])
    assert (args.host, args.api_key_file, args.enable_model_repository, args.model_alias) == (
        "127.0.0.1",
        None,
        False,
        [],
    )
    assert request_policy(args) == RequestPolicy(aliases=("jev-latest",))  # the TypeSafe SDK's default, built in
    assert api_config(args) == ApiConfig()  # the flags' defaults are the configuration's
    assert api_config(args).limits.max_header_bytes == 65536
    args.model_name = "jev-latest"
    assert request_policy(args) == RequestPolicy()  # the served name is no alias of itself
    args = parser.parse_args(
        [
            "--host",
            "0.0.0.0",
            "--model-alias",
            "a",
            "--model-alias",
            "b",
            "--state-overflow",
            "refuse",
            "--accept-any-model-name",
            "--api-key-file",
            str(tmp_path / "missing"),
        ]
    )
    expected = RequestPolicy(aliases=("a", "b", "jev-latest"), accept_any_name=True, state_overflow="refuse")
    assert request_policy(args) == expected
    assert api_config(args).limits.host == "0.0.0.0"
    with pytest.raises(SystemExit):
        check_api_args(parser, args)
