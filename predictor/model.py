"""The KServe model: a thin ``kserve.Model`` over an engine, ready only after warm-up.

``load()`` builds the engine and launches the encode workers; KServe then runs ``start_engine()`` beside its HTTP
server, which starts the engine, warms it up (while the workers' probes are checked; with ``--vision`` then one
small image through the engine) and then watches it. The model's one state is its
:class:`~predictor.serving.lifecycle.Lifecycle`: until warm-up ends, after SIGTERM and once the engine is dead,
``healthy()`` is False, so ``GET /v1/models/<name>`` and ``/v2/models/<name>/ready`` answer 503.

``predict`` serves KServe's V1 (``{"instances": [request, ...]}`` → ``{"predictions": [...]}``) and
V2 (requests as JSON strings in one BYTES input → responses as JSON strings in one BYTES output).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
from kserve import InferOutput, InferRequest, InferResponse, Model

from clef_head.request import DEFAULT_LIMITS, RequestLimits
from predictor.core import metrics
from predictor.core.errors import Unreadable, parse_param
from predictor.engines.base import Engine, EngineDead
from predictor.serving.body_limits import (
    check_item_count,
    check_texts_json_counts,
)
from predictor.serving.lifecycle import EngineWatchdog, Lifecycle, Phase
from predictor.serving.options import DEFAULT_OPTIONS, ServingOptions, build_service
from predictor.serving.prepare import decode_json_body
from predictor.serving.service import ModelCard, SystemOneService
from predictor.serving.warmup import (
    ImageWarmup,
    WarmupDoesNotFit,
    WarmupResult,
    WarmupSchema,
    WarmupStep,
    run_image_warmup,
    run_warmup,
    warmup_plan,
    warmup_schema,
)

log = logging.getLogger(__name__)

V2_INPUT = "request"
V2_OUTPUT = "response"


class ClefModel(Model):
    """Clef-flash as a KServe model; its one readiness state is :attr:`lifecycle`."""

    def __init__(
        self,
        card: ModelCard,
        engine_factory: Callable[[], Engine],
        limits: RequestLimits = DEFAULT_LIMITS,
        options: ServingOptions = DEFAULT_OPTIONS,
        exit_process: Callable[[int], Any] = os._exit,
    ) -> None:
        self.lifecycle = Lifecycle(card.name)
        super().__init__(card.name)
        self.card = card
        self.limits = limits
        self.options = options
        self._engine_factory = engine_factory
        self._exit_process = exit_process
        self.backend: Engine | None = None
        self.service: SystemOneService | None = None
        self.watchdog: EngineWatchdog | None = None
        self.warmup: WarmupSchema | None = None
        self._warming_up: asyncio.Future[tuple[WarmupResult, ImageWarmup | None]] | None = None

    @property
    def ready(self) -> bool:
        """KServe registers a model only when this is true: the engine is built and not stopped.
        Readiness to serve is :meth:`healthy` (warm-up finished, engine alive)."""
        return self.backend is not None and self.lifecycle.phase is not Phase.STOPPED

    @ready.setter
    def ready(self, value: bool) -> None:
        """KServe's base class assigns ``ready``; the lifecycle decides it here."""

    @property
    def engine(self) -> bool:
        """True once built: KServe then runs :meth:`start_engine` beside its servers."""
        return self.backend is not None

    @engine.setter
    def engine(self, value: bool) -> None:
        """KServe's base class assigns ``engine``; whether one exists decides it here."""

    def load(self) -> bool:
        """Build the engine (once). The model then waits for ``start_engine`` to warm it up."""
        if self.backend is None:
            started = time.perf_counter()
            backend = self._engine_factory()
            try:
                self.warmup = warmup_schema(backend.tokenizer, backend.max_length)
            except WarmupDoesNotFit:
                backend.close()
                raise
            if not self.warmup.full:
                log.warning(
                    "--max-model-len %d is too short for the full warm-up schema: warming up with one choice "
                    "question only; the first requests with other question types may compile kernels",
                    backend.max_length,
                )
            self.watchdog = EngineWatchdog(
                self.lifecycle,
                backend.check_health,
                backend.close,
                exit_on_death=self.options.exit_on_engine_death,
                exit_process=self._exit_process,
            )
            self.service = build_service(
                backend, self.card, self.lifecycle, self.options, self.limits, on_engine_failure=self.watchdog.poke
            )
            # The engine (and vLLM's engine core) exists: the encode workers start now, beside the listeners.
            self.service.preparer.launch(self.service.settings)
            self.backend = backend
            log.info(
                "engine %s built in %.1fs; admission queue %d records",
                backend.kind,
                time.perf_counter() - started,
                self.service.max_queued,
            )
        return self.ready

    def start(self) -> None:
        """Nothing to do: readiness waits for warm-up (KServe's default would mark the model ready)."""

    async def start_engine(self) -> None:
        """Start the engine in the serving loop, warm it up (then ready), and watch it until it stops."""
        assert self.backend is not None and self.watchdog is not None, "load() must run first"
        self.lifecycle.enter(Phase.WARMING_UP)
        await self.backend.start()
        assert self.service is not None and self.warmup is not None
        plan = warmup_plan(self.backend.max_length, self.options.warmup_max_batch, self.warmup.tokens)
        log.info(
            "warm-up started: %d shapes x %d round(s), prompts up to %d tokens; not ready until it ends",
            len(plan),
            self.options.warmup_rounds,
            self.backend.max_length,
        )
        self._warming_up = asyncio.ensure_future(self._warm_up(plan))
        try:
            warmed, image_step = await self._warming_up
        except (asyncio.CancelledError, EngineDead):
            if self.lifecycle.phase not in (Phase.DRAINING, Phase.STOPPED):
                raise
            log.info("warm-up stopped: the server is shutting down before the model was ready")
            return
        metrics.WARMUP_SECONDS.set(warmed.seconds)
        metrics.WARMUP_IMAGE_SECONDS.set(image_step.seconds if image_step is not None else 0.0)
        self.service.rate.start_per_second = warmed.tokens_per_s
        self.lifecycle.enter(Phase.OK)
        log.info(
            "warm-up finished in %.1fs%s: model %r is ready (admission's start rate: %.0f prompt tokens/s)",
            warmed.seconds,
            f" and its image step in {image_step.seconds:.1f}s" if image_step is not None else "",
            self.name,
            warmed.tokens_per_s,
        )
        await self.watchdog.run()

    async def _warm_up(self, plan: list[WarmupStep]) -> tuple[WarmupResult, ImageWarmup | None]:
        """The text warm-up (the encode workers' probes are checked meanwhile), then, on a server that reads images,
        the image step (:func:`run_image_warmup`)."""
        assert self.backend is not None and self.service is not None and self.warmup is not None
        text = asyncio.ensure_future(run_warmup(self.backend, self.warmup, plan, self.options.warmup_rounds))
        try:
            await self.service.preparer.start(self.service.settings)
        except BaseException:
            text.cancel()
            raise
        warmed = await text
        if self.service.vision is None:
            return warmed, None
        return warmed, await run_image_warmup(self.backend, self.service.preparer, self.service.settings)

    async def healthy(self) -> bool:
        """Readiness (KServe's model routes): warmed up, engine alive, no shutdown begun."""
        return self.lifecycle.ready

    def stop_engine(self) -> None:
        """Close the engine (KServe calls this after the HTTP server has drained). A warm-up still running is
        cancelled first: a closed engine never answers its requests (they would wait forever)."""
        self.lifecycle.enter(Phase.STOPPED)
        if self._warming_up is not None:
            self._warming_up.cancel()
        if self.service is not None:
            self.service.preparer.close()
        if self.backend is not None:
            self.backend.close()

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
            raise unreadable("the request body must be a JSON object with an 'instances' list")
        instances = payload.get("instances")
        if not isinstance(instances, list) or not instances:
            raise unreadable("'instances' must be a non-empty list of System One requests", "instances")
        check_item_count(len(instances), self.options.max_batch_items, "instances")
        predictions = await self.service.answer_many(
            instances, [f"instances[{index}]" for index in range(len(instances))]
        )
        return {"predictions": predictions}

    async def _predict_v2(self, request: InferRequest) -> InferResponse:
        assert self.service is not None
        if len(request.inputs) != 1 or request.inputs[0].datatype != "BYTES":
            raise unreadable(
                f"send exactly one BYTES input ({V2_INPUT!r}) holding System One requests as JSON strings",
                "inputs",
            )
        tensor = request.inputs[0]
        try:
            items = tensor.as_numpy().reshape(-1).tolist()
        except (ValueError, TypeError) as exc:
            raise unreadable(f"the input's data does not match its shape: {exc}", "inputs[0].data") from None
        if not items:
            raise unreadable("the input holds no requests", "inputs[0].data")
        check_item_count(len(items), self.options.max_batch_items, "inputs[0].data")
        texts = [_v2_item_text(item, f"inputs[0].data[{index}]") for index, item in enumerate(items)]
        check_texts_json_counts(texts, "inputs[0].data")
        bodies = [_decode_v2_item(text, f"inputs[0].data[{index}]") for index, text in enumerate(texts)]
        responses = await self.service.answer_many(bodies, [f"inputs[0].data[{index}]" for index in range(len(bodies))])
        output = InferOutput(
            name=V2_OUTPUT,
            shape=[len(responses)],
            datatype="BYTES",
            data=[orjson.dumps(response).decode() for response in responses],
        )
        return InferResponse(response_id=request.id or "", model_name=self.name, infer_outputs=[output])


def _v2_item_text(item: Any, param: str) -> bytes:
    """One V2 element as UTF-8 JSON text (not parsed yet: its values are counted first)."""
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if not isinstance(item, bytes):
        raise unreadable("each element must be a System One request as a JSON string", param)
    try:
        item.decode("utf-8")
    except UnicodeDecodeError:
        raise unreadable("each element must be UTF-8 JSON text", param) from None
    return item


def _decode_v2_item(item: bytes, param: str) -> Any:
    try:
        return orjson.loads(item)
    except orjson.JSONDecodeError as exc:
        raise unreadable(f"not valid JSON: {exc}", param) from None


def unreadable(message: str, param: str = "") -> Unreadable:
    """A body, or the field ``param`` of it, that cannot be read as System One requests (400 at the HTTP layer)."""
    return Unreadable(message, parse_param(param))
