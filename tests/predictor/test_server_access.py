"""A predictor with API keys, a model alias and over-long states refused, driven by the TypeSafe SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop, tiny_server_args

KEY, SECOND_KEY, ENV_KEY = "key-one", "key-two", "key-from-env"
ALIAS = "clef-latest"
SDK_DEFAULT = "jev-latest"  # served without a flag
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(f"# rotated monthly\n{KEY}\n\n")
    return path


@pytest.fixture(scope="module")
def server(
    toy_release: Path, key_file: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None
) -> Iterator[Predictor]:
    """A server that needs a key (PROBES and warm-up polling are exempt or answered 401, see below)."""
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-access"),
        *tiny_server_args(toy_release, max_model_len=MAX_MODEL_LEN),
        "--warmup-rounds",
        "1",
        "--api-key-file",
        str(key_file),
        "--model-alias",
        ALIAS,
        "--state-overflow",
        "refuse",
        env={"CLEF_API_KEYS": ENV_KEY},
    )
    yield running
    assert stop(running) == 0, running.log()[-3000:]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_probes_and_metrics_need_no_key(client: httpx.Client) -> None:
    for path in (
        "/health",
        "/jev/health",
        "/jev/health/live",
        "/metrics",
        f"/v1/models/{MODEL_NAME}",
        f"/v2/models/{MODEL_NAME}/ready",
        "/v2/health/live",
    ):
        assert client.get(path).status_code == 200, path


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/systemone"),
        ("POST", "/jev/v1/systemone"),
        ("POST", "/v1/systemone/batch"),
        ("GET", "/jev/v1/models"),
        ("GET", "/v1/models"),
        ("GET", "/v2/models"),
        ("GET", f"/v2/models/{MODEL_NAME}"),
        ("POST", f"/v1/models/{MODEL_NAME}:predict"),
        ("POST", f"/v2/models/{MODEL_NAME}/infer"),
    ],
)
def test_inference_and_listing_routes_need_a_valid_key(client: httpx.Client, method: str, path: str) -> None:
    for headers in ({}, _auth("wrong"), {"Authorization": KEY}, {"Authorization": "Basic a2V5LW9uZQ=="}):
        response = client.request(method, path, json=simple_request(), headers=headers)
        assert response.status_code == 401, (path, headers, response.text)
        body = response.json()
        assert body["error"]["type"] == "authentication_error" and body["error"]["param"] == "Authorization"
        assert body["detail"][0]["loc"] == ["header", "Authorization"], "the header is at fault, not the body"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["x-typesafe-request-id"]
    accepted = client.request(
        method, path, json=[simple_request()] if path.endswith("batch") else simple_request(), headers=_auth(KEY)
    )
    assert accepted.status_code != 401, (path, accepted.text)


def test_environment_keys_are_accepted(client: httpx.Client) -> None:
    assert client.post("/v1/systemone", json=simple_request(), headers=_auth(ENV_KEY)).status_code == 200


def test_key_file_is_read_again_when_it_changes(client: httpx.Client, key_file: Path) -> None:
    assert client.post("/v1/systemone", json=simple_request(), headers=_auth(SECOND_KEY)).status_code == 401
    key_file.write_text(f"{KEY}\n{SECOND_KEY}\n")
    deadline = time.monotonic() + 30
    while client.post("/v1/systemone", json=simple_request(), headers=_auth(SECOND_KEY)).status_code != 200:
        assert time.monotonic() < deadline, "the new key was never accepted"
        time.sleep(0.5)
    key_file.write_text(f"{SECOND_KEY}\n")
    deadline = time.monotonic() + 30
    while client.post("/v1/systemone", json=simple_request(), headers=_auth(KEY)).status_code != 401:
        assert time.monotonic() < deadline, "the removed key was still accepted"
        time.sleep(0.5)
    key_file.write_text(f"{KEY}\n")
    time.sleep(1.5)


def test_typesafe_sdk_with_key_alias_and_errors(server: Predictor) -> None:
    import typesafe_sdk
    from typesafe_sdk._core.errors import TypeSafeAPIError, TypeSafeAuthenticationError

    questions = {"urgent": typesafe_sdk.Noul(instructions="Is this urgent?")}
    base = f"{server.url}/jev"
    with typesafe_sdk.TypeSafeClient(base_url=base, api_key=KEY, model=ALIAS, timeout=300) as client:
        answer = client.system_one("I was charged twice", questions)
        assert answer.model == MODEL_NAME and answer.request_id  # the model that answered, not the alias asked for
        assert [model.name for model in client.models.list().models] == [MODEL_NAME, ALIAS, SDK_DEFAULT]
        with pytest.raises(TypeSafeAPIError) as too_long:
            client.system_one("charged twice " * 4000, questions)
        assert too_long.value.status == 413
        assert "state: the state needs more than" in str(too_long.value) and f"{MAX_MODEL_LEN}-token prompt" in str(
            too_long.value
        )
    with typesafe_sdk.TypeSafeClient(base_url=base, api_key=KEY, timeout=300) as client:  # the SDK's default model
        assert client.system_one("I was charged twice", questions).model == MODEL_NAME
    with typesafe_sdk.TypeSafeClient(base_url=base, api_key="wrong", model=ALIAS, timeout=300) as client:
        with pytest.raises(TypeSafeAuthenticationError) as refused:
            client.system_one("I was charged twice", questions)
        assert "API key is not valid" in str(refused.value) and refused.value.request_id


def test_alias_is_served_on_kserve_routes(client: httpx.Client) -> None:
    assert client.get(f"/v1/models/{ALIAS}").status_code == 200
    response = client.post(
        f"/v1/models/{ALIAS}:predict", json={"instances": [simple_request(model=ALIAS)]}, headers=_auth(KEY)
    )
    assert response.status_code == 200, response.text
    assert response.json()["predictions"][0]["model"] == MODEL_NAME


def test_only_http_listens_and_only_on_the_host(server: Predictor) -> None:
    """gRPC is off unless asked for (KServe's default would listen on every interface, keys or not)."""
    from tests.predictor.conftest import listening_addresses

    assert listening_addresses(server.process.pid) == {("127.0.0.1", server.port)}
