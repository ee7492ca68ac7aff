"""The predictor's /metrics: stage timers, where bodies were prepared and answer-cache counts, scraped between
loads."""

from __future__ import annotations

from typing import Any

TIMERS = (
    "clef_stage_seconds",
    "clef_request_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_inference_time_seconds",
)


def metric_samples(url: str) -> list[Any]:
    """Every sample the server's ``/metrics`` exposes now."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape_timers(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of every histogram series in :data:`TIMERS` from the server's ``/metrics``."""
    found: dict[str, list[float]] = {}
    for sample in metric_samples(url):
        base = sample.name.rsplit("_", 1)[0]
        if base not in TIMERS or not sample.name.endswith(("_sum", "_count")):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k in ("stage", "route"))
        key = f"{base}{{{labels}}}" if labels else base
        pair = found.setdefault(key, [0.0, 0.0])
        pair[0 if sample.name.endswith("_sum") else 1] += sample.value
    return {key: (value[0], value[1]) for key, value in found.items()}


def timer_means(previous: dict[str, tuple[float, float]], current: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean milliseconds per observation of each timer between two scrapes."""
    means = {}
    for key, (total, count) in current.items():
        old_total, old_count = previous.get(key, (0.0, 0.0))
        if count > old_count:
            means[key] = round(1000 * (total - old_total) / (count - old_count), 2)
    return means


def labelled_counts(url: str, counter: str, label: str) -> dict[str, float]:
    """The values of ``counter`` (a sample name, e.g. ``clef_answer_cache_total``) by its ``label``, from the
    server's ``/metrics``."""
    return {sample.labels[label]: sample.value for sample in metric_samples(url) if sample.name == counter}


def count_changes(previous: dict[str, float], current: dict[str, float]) -> dict[str, int]:
    """How much each label's count grew between two :func:`labelled_counts` reads."""
    return {key: int(value - previous.get(key, 0.0)) for key, value in current.items()}


def encode_bodies(url: str) -> dict[str, float]:
    """``clef_encode_bodies_total`` by where bodies were prepared (worker, serving)."""
    return labelled_counts(url, "clef_encode_bodies_total", "where")


def answer_cache_counts(url: str) -> dict[str, float]:
    """``clef_answer_cache_total`` by outcome (hit, merged, miss)."""
    return labelled_counts(url, "clef_answer_cache_total", "outcome")
