"""The plugin's records reach vLLM's handlers in an offline engine, unless the application configured logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from clef_plugin import ENGINE_SIDE_LOGGERS, log_where_vllm_logs

NAMES = ("vllm", *ENGINE_SIDE_LOGGERS)


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def loggers() -> Iterator[dict[str, logging.Logger]]:
    """The loggers involved, emptied, and restored afterwards."""
    found = {name: logging.getLogger(name) for name in NAMES}
    saved = {name: (list(log.handlers), log.level, log.propagate) for name, log in found.items()}
    for log in found.values():
        log.handlers = []
    yield found
    for name, (handlers, level, propagate) in saved.items():
        found[name].handlers, found[name].level, found[name].propagate = handlers, level, propagate


@contextmanager
def root_handlers(*handlers: logging.Handler) -> Iterator[None]:
    """The root logger with only ``handlers`` (pytest attaches its own there for each test phase)."""
    root = logging.getLogger()
    saved = list(root.handlers)
    root.handlers = list(handlers)
    try:
        yield
    finally:
        root.handlers = saved


def test_engine_side_records_reach_vllms_handlers(loggers: dict[str, logging.Logger]) -> None:
    vllm_handler = Kept()
    loggers["vllm"].addHandler(vllm_handler)
    loggers["vllm"].setLevel(logging.INFO)
    with root_handlers():
        log_where_vllm_logs()
        logging.getLogger("clef_plugin.prompt_graphs").info("graphs captured")
        logging.getLogger("clef_head.graphs").debug("below vLLM's level")
    assert vllm_handler.messages == ["graphs captured"]


def test_a_root_handler_added_later_does_not_print_the_records_twice(loggers: dict[str, logging.Logger]) -> None:
    vllm_handler = Kept()
    loggers["vllm"].addHandler(vllm_handler)
    loggers["vllm"].setLevel(logging.INFO)
    loggers["vllm"].propagate = False  # as vLLM's own logging configuration sets it
    late_root = Kept()
    with root_handlers():
        log_where_vllm_logs()
        logging.getLogger().addHandler(late_root)
        logging.getLogger("clef_plugin.prompt_graphs").info("graphs captured")
    assert vllm_handler.messages == ["graphs captured"]
    assert late_root.messages == []


def test_a_logger_the_application_configured_is_left_alone(loggers: dict[str, logging.Logger]) -> None:
    loggers["vllm"].addHandler(Kept())
    own = Kept()
    loggers["clef_plugin"].addHandler(own)
    with root_handlers():
        log_where_vllm_logs()
    assert loggers["clef_plugin"].handlers == [own]
    assert loggers["clef_head"].handlers == loggers["vllm"].handlers


def test_nothing_changes_where_the_application_configured_the_root_logger(loggers: dict[str, logging.Logger]) -> None:
    loggers["vllm"].addHandler(Kept())
    with root_handlers(Kept()):
        log_where_vllm_logs()
    assert loggers["clef_plugin"].handlers == [] and loggers["clef_head"].handlers == []
