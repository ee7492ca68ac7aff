"""Prometheus metrics, on the default registry that KServe's ``/metrics`` already serves."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "clef_requests_total",
    "Inference requests answered, by route and HTTP status.",
    ["route", "status"],
)
LATENCY = Histogram(
    "clef_request_latency_seconds",
    "Time from request received to response sent, by route.",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
STAGE_SECONDS = Histogram(
    "clef_stage_seconds",
    "Time per record in each stage of a request: encode (read the body, validate, tokenize, spans; with "
    "--encode-processes the round trip to a worker process, as the serving process waits it), engine "
    "(backbone + head), answer (logits to the response body).",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ENCODE_BODIES = Counter(
    "clef_encode_bodies_total",
    "Request bodies handed to the encode stage, by where they were prepared: worker (an encode worker process, "
    "--encode-processes) or serving (a thread of the serving process: --encode-processes 0, or a lone small body, "
    "--inline-encode-max-bytes).",
    ["where"],
)
RECORDS = Counter("clef_records_total", "System One records scored (a V1/V2 request may hold several).")
INPUT_TOKENS = Counter("clef_input_tokens_total", "Prompt tokens of scored records.")
PROMPT_TOKENS = Histogram(
    "clef_prompt_tokens",
    "Prompt length of scored records, in tokens.",
    buckets=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
)
BATCH_SIZE = Histogram(
    "clef_batch_size",
    "Records per forward pass of the transformers engine's micro-batcher, by engine.",
    ["engine"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
IN_FLIGHT = Gauge("clef_engine_in_flight", "Records submitted to an engine and not yet answered.", ["engine"])
WARMUP_SECONDS = Gauge("clef_warmup_seconds", "Duration of the last warm-up, in seconds.")
WARMUP_IMAGE_SECONDS = Gauge(
    "clef_warmup_image_seconds",
    "Duration of the warm-up's image step (--vision: one small image through the engine before ready), in seconds; "
    "0 without it.",
)
READY = Gauge("clef_ready", "1 once warm-up has finished, the engine is alive and no shutdown has begun, else 0.")
QUEUE_DEPTH = Gauge("clef_queue_depth", "Records admitted and not yet answered (bounded by --max-queued-requests).")
REJECTED = Counter(
    "clef_rejected_total",
    "Requests refused with 503 before any work, by reason (overloaded, warming_up, draining, engine_dead).",
    ["reason"],
)
ANSWER_CACHE = Counter(
    "clef_answer_cache_total",
    "Records by answer-cache outcome: hit (a response kept for the same body, or cached logits for the same "
    "prompt), merged (an identical prompt was in flight), miss.",
    ["outcome"],
)
ANSWER_CACHE_BYTES = Gauge(
    "clef_answer_cache_bytes", "Bytes held by the answer cache (--answer-cache-bytes bounds it)."
)
