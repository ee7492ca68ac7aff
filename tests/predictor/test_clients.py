"""System One clients from PyPI, none written here, against a real predictor (transformers engine, toy release):
each one's README calls, unmodified, with the server's root and ``/jev`` as base URL; then what they make of a
model list, of our errors and of a full queue.

The clients (the ``dev`` extra installs them): ``typesafe-sdk`` (the official SDK), ``jev-lite``,
``composable-jev``, ``hev-rerank``, ``decision-circuits``, ``avrik-sdk`` (its discovery calls) and the OpenAI SDK
(the model list). The SDK-based ones read ``TYPESAFE_API_KEY`` and ``TYPESAFE_BASE_URL`` as their READMEs say; the
server needs no key, so any key does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop, tiny_server_args

SDK_DEFAULT = "jev-latest"
API_KEY = "any-key"
BASES = {"root": "", "jev": "/jev"}
MAX_QUEUED = 1
"""One record admitted at once: a client's calls one after another are always admitted (an idle server admits),
concurrent ones are shed."""


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-clients"),
        # hev-rerank's prompt: a query, documents and a question per document
        *tiny_server_args(toy_release, max_model_len=2048, max_batch=8),
        "--max-queued-requests",
        str(MAX_QUEUED),
    )
    yield running
    assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(params=list(BASES.values()), ids=list(BASES))
def base_url(server: Predictor, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The base URL a client is given, also as the environment the TypeSafe clients read."""
    url = f"{server.url}{request.param}"
    monkeypatch.setenv("TYPESAFE_API_KEY", API_KEY)
    monkeypatch.setenv("TYPESAFE_BASE_URL", url)
    monkeypatch.delenv("TYPESAFE_DEFAULT_MODEL", raising=False)
    return url


def test_typesafe_sdk_readme(base_url: str) -> None:
    from typesafe_sdk import Choice, TypeSafeClient

    with TypeSafeClient() as client:
        response = client.system_one(
            state={"document": "I was charged twice. Please fix this ASAP."},
            questions={
                "category": Choice(
                    instructions="What is this ticket about?",
                    criteria={"billing": None, "technical": None, "other": None},
                ),
            },
        )
        models = client.models.list()  # the docstring's example

    assert response.choices["category"].choice in {"billing", "technical", "other"}
    assert response.model == MODEL_NAME, "the model that answered, not the SDK's default alias"
    assert [model.name for model in models.models] == [MODEL_NAME, SDK_DEFAULT]


def test_jev_lite_readme(base_url: str) -> None:
    from jev_lite import AsyncTypeSafe, Choice, Noul, Score, TypeSafe

    client = TypeSafe()  # TYPESAFE_API_KEY
    result = client.system_one.create(
        state="I was charged twice. Please fix this ASAP.",
        questions={
            "billing": Noul(instructions="Is this ticket about billing?"),
            "tone": Choice(
                instructions="What is the customer's tone?",
                criteria={"calm": None, "frustrated": None, "angry": None},
            ),
            "urgency": Score(
                instructions="How urgent is this ticket?",
                criteria=["can wait", "this week", "today"],
            ),
        },
    )
    assert 0 <= result.nouls["billing"].noul <= 1
    assert result.choices["tone"].choice in {"calm", "frustrated", "angry"}
    assert 0 <= result.scores["urgency"].score <= 2
    assert result.elapsed_ms and len(result.request_id or "") == 32 and result.usage.input_tokens
    assert result.model == MODEL_NAME
    assert [model.name for model in client.models.list()] == [MODEL_NAME, SDK_DEFAULT]  # GET /v1/models

    async def asynchronous() -> tuple[float, list[str]]:
        async with AsyncTypeSafe() as client:
            result = await client.system_one.create(
                state="I was charged twice. Please fix this ASAP.",
                questions={"billing": Noul(instructions="Is this ticket about billing?")},
            )
            models = await client.models.list()
        return result.nouls["billing"].noul, [model.name for model in models]

    noul, names = asyncio.run(asynchronous())
    assert 0 <= noul <= 1 and names == [MODEL_NAME, SDK_DEFAULT]


def test_composable_jev_readme(base_url: str) -> None:
    from composable_jev import Graph, Jev

    triage = (
        Graph.make("I was charged twice this month. This is the third time. Refund me now.")
        .ask("refund", "Is the customer asking for money back?", Graph.CONTEXT)
        .ask("angry", "Is the customer angry or out of patience?", Graph.CONTEXT)
        .all("escalate", "refund", "angry")
    )
    jev = Jev.make()
    assert isinstance(triage.run(jev).yes("escalate"), bool)
    assert jev.calls >= 1  # asked of the server, not of a cache


def test_hev_rerank_readme(base_url: str) -> None:
    from hev_rerank import rerank

    first_stage_results = [
        ("Vitamin D and bone", "Vitamin D supplements and bone mineral density in adults over 65."),
        ("Cats", "Domestic cats sleep for most of the day."),
        ("Calcium", "Calcium intake and the risk of fractures."),
    ]
    hits = rerank(
        "does vitamin D supplementation improve bone density in older adults",
        [{"title": t, "text": x} for t, x in first_stage_results],  # strings work too
        top_n=10,  # optional
        threshold=0.1,  # optional: drop candidates the model is confident are irrelevant
    )
    assert hits, "random weights answer near 0.5: every document is above the threshold"
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    assert {hit.index for hit in hits} <= {0, 1, 2} and all(0.1 <= hit.score <= 1 for hit in hits)
    assert all(hit.document["title"] == first_stage_results[hit.index][0] for hit in hits)


def test_decision_circuits_readme(base_url: str) -> None:
    from decision_circuits import Circuit, G, Q, argmax
    from decision_circuits.backends import SystemOne

    c = Circuit()
    c.noul("pii", "Does this text contain personal information about a private individual?")
    c.noul("angry", "Is the writer angry?")
    c.choice(
        "dept",
        "Which team should handle this?",
        {"billing": "Money, refunds", "technical": "Bugs, outages", "other": None},
    )
    c.gate("redact", Q("pii") >= 0.7, on_uncertain="escalate")
    c.gate("route", argmax("dept", min_confidence=0.3))
    c.gate("human", (Q("angry") | Q("pii")) >= 0.6)
    c.route(
        "action",
        [("human", G("redact") | G("human")), ("billing desk", G("route")["billing"])],
        otherwise="general queue",
    )

    jev = SystemOne(f"{base_url}/v1/systemone", api_key=API_KEY, model=SDK_DEFAULT)  # TypeSafe's System One model
    out = c.run(jev, "Card charged twice, refund NOW. My card ends in 4412.")

    assert out["gates"]["redact"]["outcome"] in {"decided", "escalate"} and 0 <= out["gates"]["redact"]["p"] <= 1
    assert out["gates"]["route"]["value"] in {"billing", "technical", "other", None}
    assert out["gates"]["action"]["value"] in {"human", "billing desk", "general queue"}
    assert jev.last_response is not None and jev.last_response["model"] == MODEL_NAME


def test_avrik_sdk_readme_discovery(base_url: str) -> None:
    """The README's discovery calls, unmodified (``avrik-sdk`` validates the model list). Its question call is
    Avrik's own protocol, not System One's: it sends no ``model`` and requires Avrik's ``audit`` block in answers."""
    from avrik_sdk import Client

    with Client(base_url) as client:
        healthy = client.health().ok  # the backend is up: GET /health under the base (/jev/health at /jev)
        names = [m.name for m in client.models()]
        extra = client.models()[0].avrik  # hashes, backend, max_options, max_context_tokens: Avrik's own

    assert healthy and names == [MODEL_NAME, SDK_DEFAULT] and extra is None


def test_openai_sdk_reads_the_same_model_list(base_url: str) -> None:
    """The model card's server answered ``GET /v1/models`` in OpenAI's shape; the one body still is."""
    import openai

    listed = openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY).models.list()
    assert [(model.id, model.object, model.owned_by) for model in listed.data] == [
        (MODEL_NAME, "model", "clef"),
        (SDK_DEFAULT, "model", "clef"),
    ]
    assert all(isinstance(model.created, int) for model in listed.data)


def test_clients_read_our_errors(base_url: str) -> None:
    """A model this server does not serve: each client's typed error carries our message and its field path."""
    from jev_lite import NotFoundError, Noul, TypeSafe
    from typesafe_sdk import Noul as SdkNoul
    from typesafe_sdk import TypeSafeClient
    from typesafe_sdk._core.errors import TypeSafeNotFoundError

    expected = "model: model 'other' is not served here; this server serves 'clef-flash', 'jev-latest'"
    with TypeSafeClient(model="other") as client, pytest.raises(TypeSafeNotFoundError) as sdk_error:
        client.system_one("hello", {"q": SdkNoul(instructions="Is it?")})
    assert expected in str(sdk_error.value) and sdk_error.value.request_id
    with pytest.raises(NotFoundError) as lite_error:
        TypeSafe(model="other").system_one.create(state="hello", questions={"q": Noul(instructions="Is it?")})
    assert str(lite_error.value).startswith(expected) and str(lite_error.value).endswith("(['body', 'model'])")


def test_a_full_queue_is_the_clients_rate_limit_error(server: Predictor) -> None:
    """Shed requests are 429 with ``Retry-After`` and ``retry-after-ms``: the SDK's ``TypeSafeRateLimitError``
    with its ``retry_after_ms`` (a 503 would be its ``TypeSafeInternalServerError``); every one is retryable."""
    from typesafe_sdk import Noul, RetryPolicy, TypeSafeClient
    from typesafe_sdk._core.errors import TypeSafeAPIError, TypeSafeRateLimitError

    state = {"ticket": "I was charged twice for my subscription. " * 20}

    def call(client: TypeSafeClient) -> object:
        try:
            return client.system_one(state, {"q": Noul(instructions="Is it urgent?")})
        except TypeSafeAPIError as error:
            return error

    no_retries = RetryPolicy(max_retries=0)
    with (
        TypeSafeClient(base_url=f"{server.url}/jev", api_key=API_KEY, retry=no_retries) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        outcomes = list(pool.map(lambda _: call(client), range(32)))
    errors = [outcome for outcome in outcomes if isinstance(outcome, TypeSafeAPIError)]
    assert errors and len(errors) < len(outcomes), outcomes
    assert all(isinstance(error, TypeSafeRateLimitError) for error in errors), errors
    assert all(error.retry_after_ms == 1000 and error.headers["retry-after"] == "1" for error in errors), errors  # type: ignore[attr-defined]
    assert all("at capacity" in str(error) for error in errors)


def test_bad_bodies_get_their_4xx_while_the_queue_is_full(server: Predictor) -> None:
    """Only valid work is shed: whatever the queue holds, a malformed body is answered 400/422 naming its field."""
    bad_field = simple_request()
    bad_field["questions"]["topic"]["criteria"] = {"only": None}
    bad = [
        (b"{not json", 400, None),
        (json.dumps(bad_field).encode(), 422, "questions.topic.criteria"),
        (json.dumps(simple_request(model="other")).encode(), 404, "model"),
        (json.dumps({**simple_request(), "questions": {}}).encode(), 422, "questions"),
    ]
    valid = [json.dumps(simple_request(state={"ticket": f"charged twice, case {i}" * 20})).encode() for i in range(24)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            bodies = [*valid, *[body for body, _, _ in bad] * 4]
            return await asyncio.gather(
                *(
                    client.post("/v1/systemone", content=body, headers={"content-type": "application/json"})
                    for body in bodies
                )
            )

    responses = asyncio.run(burst())
    shed = [response for response in responses[: len(valid)] if response.status_code == 429]
    assert shed, "the burst never filled the queue"
    assert all(response.status_code in (200, 429) for response in responses[: len(valid)])
    assert all(response.headers["retry-after-ms"] == "1000" for response in shed)
    for index, response in enumerate(responses[len(valid) :]):
        _, status, param = bad[index % len(bad)]
        assert response.status_code == status, response.text
        assert response.json()["error"]["param"] == param, response.text
