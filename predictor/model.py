"""The KServe model: a thin ``kserve.Model`` over an engine, ready only after warm-up.

``load()`` builds the engine; KServe then runs ``start_engine()`` beside its HTTP server, which
starts the engine and warms it up. Until warm-up ends, and again if the engine dies, ``healthy()``
is False, so ``GET /v1/models/<name>``, ``/v2/models/<name>/ready`` and ``/health`` answer 503.

``predict`` serves KServe's V1 (``{"instances": [request, ...]}`` → ``{"predictions": [...]}``) and
V2 (requests as JSON strings in one BYTES input → responses as JSON strings in one BYTES output).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import orjson
from kserve import InferOutput, InferRequest, InferResponse, Model

from clef_head.request import DEFAULT_LIMITS, RequestLimits
from predictor import metrics
from predictor.engines.base import Engine, EngineDead
from predictor.errors import bad_request
from predictor.http_body import decode_json_body
from predictor.service import ModelCard, SystemOneService
from predictor.warmup import run_warmup, schema_tokens, warmup_plan

log = logging.getLogger(__name__)

V2_INPUT = "request"
V2_OUTPUT = "response"


class ClefModel(Model):
    """Clef-flash as a KServe model."""

    def __init__(
        self,
        card: ModelCard,
        engine_factory: Callable[[], Engine],
        limits: RequestLimits = DEFAULT_LIMITS,
        warmup_rounds: int = 1,
        warmup_max_batch: int = 16,
    ) -> None:
        super().__init__(card.name)
        self.card = card
        self.limits = limits
        self.warmup_rounds = warmup_rounds
        self.warmup_max_batch = warmup_max_batch
        self._engine_factory = engine_factory
        self.backend: Engine | None = None
        self.service: SystemOneService | None = None
        self.failure: str | None = None

    def load(self) -> bool:
        """Build the engine (once). The model then waits for ``start_engine`` to warm it up."""
        if self.backend is None:
            started = time.perf_counter()
            self.backend = self._engine_factory()
            self.service = SystemOneService(self.backend, self.card, self.limits)
            log.info("engine %s built in %.1fs", self.backend.kind, time.perf_counter() - started)
        self.ready = True
        self.engine = True  # KServe runs start_engine() beside its servers
        return self.ready

    def start(self) -> None:
        """Nothing to do: readiness waits for warm-up (KServe's default would mark the model ready)."""

    async def start_engine(self) -> None:
        """Start the engine in the serving loop and warm it up; then the model is ready."""
        assert self.backend is not None and self.service is not None, "load() must run first"
        await self.backend.start()
        plan = warmup_plan(self.backend.max_length, self.warmup_max_batch, schema_tokens(self.backend))
        log.info(
            "warm-up started: %d shapes x %d round(s), prompts up to %d tokens; not ready until it ends",
            len(plan),
            self.warmup_rounds,
            self.backend.max_length,
        )
        seconds = await run_warmup(self.backend, plan, self.warmup_rounds)
        metrics.WARMUP_SECONDS.set(seconds)
        self.service.ready = True
        metrics.READY.set(1)
        log.info("warm-up finished in %.1fs: model %r is ready", seconds, self.name)

    async def healthy(self) -> bool:
        """True once warmed up and while the engine is alive (a dead engine stays dead)."""
        if self.service is None or self.backend is None or not self.service.ready:
            return False
        try:
            await self.backend.check_health()
        except EngineDead as exc:
            self.failure = str(exc)
            self.service.ready = False
            metrics.READY.set(0)
            log.error("engine died, model %r is no longer ready: %s", self.name, exc)
            return False
        return True

    def stop_engine(self) -> None:
        """Close the engine (KServe calls this after the HTTP server has drained)."""
        if self.service is not None:
            self.service.ready = False
        metrics.READY.set(0)
        if self.backend is not None:
            self.backend.close()
        self.ready = False

    def get_input_types(self) -> list[dict[str, Any]]:
        """V2 metadata: one BYTES input of System One requests as JSON strings."""
        return [{"name": V2_INPUT, "datatype": "BYTES", "shape": [-1]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        """V2 metadata: one BYTES output of System One responses as JSON strings."""
        return [{"name": V2_OUTPUT, "datatype": "BYTES", "shape": [-1]}]

    def validate(self, payload: Any) -> Any:
        """No KServe-side shape check: ``predict`` validates and names the field in our error shape."""
        return payload

    async def predict(
        self, payload: dict[str, Any] | InferRequest | bytes, headers: dict[str, str] | None = None
    ) -> dict[str, Any] | InferResponse:
        """V1 ``instances`` or a V2 BYTES input → System One responses."""
        assert self.service is not None
        if isinstance(payload, InferRequest):
            return await self._predict_v2(payload)
        if isinstance(payload, bytes):  # KServe passes bodies sent without a JSON Content-Type as bytes
            payload = decode_json_body(payload, headers.get("content-type", "") if headers else "")
        if not isinstance(payload, dict):
            raise bad_request("the request body must be a JSON object with an 'instances' list")
        instances = payload.get("instances")
        if not isinstance(instances, list) or not instances:
            raise bad_request("'instances' must be a non-empty list of System One requests", "instances")
        predictions = await self.service.answer_many(
            instances, [f"instances[{index}]" for index in range(len(instances))]
        )
        return {"predictions": predictions}

    async def _predict_v2(self, request: InferRequest) -> InferResponse:
        assert self.service is not None
        if len(request.inputs) != 1 or request.inputs[0].datatype != "BYTES":
            raise bad_request(
                f"send exactly one BYTES input ({V2_INPUT!r}) holding System One requests as JSON strings",
                "inputs",
            )
        tensor = request.inputs[0]
        try:
            items = tensor.as_numpy().reshape(-1).tolist()
        except (ValueError, TypeError) as exc:
            raise bad_request(f"the input's data does not match its shape: {exc}", "inputs[0].data") from None
        if not items:
            raise bad_request("the input holds no requests", "inputs[0].data")
        bodies = [_decode_v2_item(item, f"inputs[0].data[{index}]") for index, item in enumerate(items)]
        responses = await self.service.answer_many(
            bodies, [f"inputs[0].data[{index}]" for index in range(len(bodies))]
        )
        output = InferOutput(
            name=V2_OUTPUT,
            shape=[len(responses)],
            datatype="BYTES",
            data=[orjson.dumps(response).decode() for response in responses],
        )
        return InferResponse(response_id=request.id or "", model_name=self.name, infer_outputs=[output])


def _decode_v2_item(item: Any, param: str) -> Any:
    if isinstance(item, bytes):
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request("each element must be UTF-8 JSON text", param) from None
    if not isinstance(item, str):
        raise bad_request("each element must be a System One request as a JSON string", param)
    try:
        return orjson.loads(item)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"not valid JSON: {exc}", param) from None
