"""The GPU benchmark's parts (bench/gpu_benchmark/): case names, engine arguments, traces, processes, files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clef_head.encoder import EncodedRequest

ROOT = Path(__file__).resolve().parents[2]


def test_case_keys_name_the_case_its_variant_and_repetition() -> None:
    from bench.gpu_benchmark.names import agreement_pairs, base_case, result_key, variant_name

    # Every run of a case named several times keeps its own key (a third run used to overwrite the second's).
    assert [result_key("http+fi", runs_before) for runs_before in range(4)] == [
        "http+fi",
        "http+fi-again",
        "http+fi-again3",
        "http+fi-again4",
    ]
    assert {(base_case(result_key("http+fi", n)), variant_name(result_key("http+fi", n))) for n in range(4)} == {
        ("http", "fi")
    }
    assert [
        base_case(key)
        for key in (
            "http-again",
            "vllm-fp8-graphs+async",
            "vllm-fp8-graphs+async-again",
            "vllm-stock-fp8-graphs",
            "http-dp2",
        )
    ] == [
        "http",
        "vllm-fp8-graphs",
        "vllm-fp8-graphs",
        "vllm-stock-fp8-graphs",
        "http-dp2",
    ]
    assert [variant_name(key) for key in ("vllm-fp8-graphs", "vllm-fp8-graphs+async-again")] == [None, "async"]
    pairs = agreement_pairs(["vllm-fp8-graphs", "vllm-fp8-graphs+async", "vllm-bf16-graphs+t32k"])
    assert pairs == [("vllm-fp8-graphs", "vllm-fp8-graphs+async")]
    assert agreement_pairs(["transformers", "vllm-stock-fp8-graphs", "vllm-fp8-graphs"]) == [
        ("transformers", "vllm-fp8-graphs")
    ]
    assert agreement_pairs(["vllm-bf16-eager", "vllm-fp8-eager", "vllm-nvfp4-eager", "vllm-nvfp4-graphs"]) == [
        ("vllm-bf16-eager", "vllm-fp8-eager"),
        ("vllm-bf16-eager", "vllm-nvfp4-eager"),
        ("vllm-fp8-eager", "vllm-nvfp4-eager"),
        ("vllm-nvfp4-eager", "vllm-nvfp4-graphs"),
    ]


def test_stock_engine_arguments_differ_from_the_plugins_only_in_model_class_and_pooler() -> None:
    import clef_plugin
    from bench.gpu_benchmark.engine_args import STOCK_TASK, stock_engine_kwargs

    plugin = clef_plugin.engine_kwargs("/release", max_model_len=1024, max_num_batched_tokens=4096)
    stock = stock_engine_kwargs(plugin)
    assert "hf_overrides" not in stock and stock["pooler_config"].task == STOCK_TASK
    assert stock["pooler_config"].seq_pooling_type == "LAST"
    same = {key: value for key, value in plugin.items() if key not in ("hf_overrides", "pooler_config")}
    assert {key: value for key, value in stock.items() if key != "pooler_config"} == same


def test_repeated_rates_report_the_median_pass_and_the_spread() -> None:
    from bench.gpu_benchmark.timing import percentiles, repeated_rates

    rates = repeated_rates(10, 1000, [2.0, 1.0, 4.0])
    assert rates["seconds"] == 2.0 and rates["prompt_tokens_per_s"] == 500.0 and rates["repeats"] == 3
    assert rates["prompt_tokens_per_s_spread"] == {
        "median": 500.0,
        "min": 250.0,
        "max": 1000.0,
        "runs": [500.0, 1000.0, 250.0],
    }
    assert percentiles([5.0, 1.0, 3.0]) == {"p50": 3.0, "mean": 3.0, "p95": 5.0, "min": 1.0, "max": 5.0, "count": 3}
    assert percentiles([1.0, 2.0, 9.0])["mean"] == 4.0


def test_variant_compilation_config_is_merged_into_the_mode() -> None:
    from bench.gpu_benchmark.engine_args import merge_engine_args, mode_kwargs
    from clef_plugin.api import prefill_capture_sizes

    merged = merge_engine_args("graphs", mode_kwargs("graphs", None), {"compilation_config": {"mode": 3}}, 1024)
    assert merged["compilation_config"]["cudagraph_capture_sizes"] == prefill_capture_sizes(1024)
    assert merged["compilation_config"]["mode"] == 3
    compiled = merge_engine_args("compile", mode_kwargs("compile", None), {"async_scheduling": True}, 1024)
    assert compiled == {
        "enforce_eager": False,
        "compilation_config": {"cudagraph_mode": "NONE"},
        "async_scheduling": True,
    }


@pytest.mark.parametrize(
    "flags",
    [
        ["--cases", "prepare,vllm-fp8-eager+nope"],
        ["--variant", "Bad Name={}"],
        ["--cases", "prepare,http+x", "--variant", "x={}"],
        ["--variant", "x=[1]"],
        ["--cases", "prepare,http+y", "--http-args", "x=--encode-processes 2"],
        ["--cases", "prepare,vllm-fp8-eager+x", "--http-args", "x=--encode-processes 2"],
        ["--http-args", "x="],
        ["--http-args", "x='unclosed"],
        ["--group-sizes", "2,0"],
    ],
)
def test_bad_cases_and_variants_are_refused(flags: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_benchmark", "--work", str(tmp_path), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "error:" in done.stderr, done.stderr


def test_kernel_kinds_and_trace_summary(tmp_path: Path) -> None:
    from bench.gpu_benchmark.traces import kernel_kind, summarize_trace

    assert kernel_kind("chunk_gated_delta_rule_fwd_kernel_h_blockdim64") == "gdn"
    assert kernel_kind("_causal_conv1d_fwd_kernel") == "conv1d"
    assert kernel_kind("void cutlass::device_kernel<cutlass_3x_gemm_sm90_fp8>") == "gemm"
    assert kernel_kind("flash_fwd_splitkv_kernel") == "attention"
    assert kernel_kind("_per_token_group_quant_fp8") == "fp8 quant"
    assert kernel_kind("something_new") == "other"
    events = [
        {"cat": "kernel", "name": "void cutlass::device_kernel<gemm>", "ts": 0, "dur": 600},
        {"cat": "kernel", "name": "chunk_fwd_kernel_o", "ts": 700, "dur": 300},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
    ]
    (tmp_path / "trace.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    summary = summarize_trace(tmp_path, since=0)
    assert summary["kernels"] == 2 and summary["gpu_busy_ms"] == 0.9 and summary["kernel_span_ms"] == 1.0
    assert summary["by_kind_ms"] == {"gemm": 0.6, "gdn": 0.3}
    assert summary["top_kernels_ms"][0]["kind"] == "gemm"


def test_http_cases_start_the_predictor_with_the_benchmark_settings() -> None:
    from bench.gpu_benchmark.cli import build_parser
    from bench.gpu_benchmark.http_case import predictor_command

    args = build_parser().parse_args(["--max-num-batched-tokens", "32768", "--http-mode", "eager"])
    one = predictor_command(args, "/fp8", 8123, data_parallel=1)
    assert one[1:3] == ["-m", "predictor"] and "--dp" not in one and "--enforce-eager" in one
    assert one[one.index("--max-num-batched-tokens") + 1] == "32768" and one[one.index("--http_port") + 1] == "8123"
    two = predictor_command(args, "/fp8", 8123, data_parallel=2)
    assert two[two.index("--dp") + 1] == "2"


def test_http_variants_pass_their_predictor_arguments_to_the_predictor() -> None:
    from bench.gpu_benchmark.cli import build_parser, http_variants
    from bench.gpu_benchmark.http_case import predictor_command
    from bench.gpu_benchmark.processes import child_command

    args = build_parser().parse_args([])
    args.variants = {}
    args.http_variants = http_variants(["enc4=--encode-processes 4", "quoted=--description 'two words'"])
    assert args.http_variants == {"enc4": ["--encode-processes", "4"], "quoted": ["--description", "two words"]}
    commands = {}
    for key in ("http", "http-dp2+enc4", "http+quoted-again"):
        child = build_parser().parse_args(child_command(args, key)[3:])  # what the case's own process parses
        assert child.result_key == key and child.run_case == key.split("+")[0]
        commands[key] = predictor_command(child, "/fp8", 8123, data_parallel=2 if "dp2" in key else 1)
    assert "--encode-processes" not in commands["http"]
    assert commands["http-dp2+enc4"][-2:] == ["--encode-processes", "4"] and "--dp" in commands["http-dp2+enc4"]
    assert commands["http+quoted-again"][-2:] == ["--description", "two words"]
    assert commands["http-dp2+enc4"][:-2] == predictor_command(build_parser().parse_args([]), "/fp8", 8123, 2)


def test_a_case_past_its_time_is_killed_with_every_process_it_started(tmp_path: Path) -> None:
    """A timed-out case must not leave an engine process holding a GPU for the next case."""
    import os
    import time

    from bench.gpu_benchmark.processes import run_process_group

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    with (tmp_path / "log").open("w") as log, pytest.raises(subprocess.TimeoutExpired):
        run_process_group([sys.executable, "-c", script], log, dict(os.environ), timeout=10)
    grandchild = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {grandchild} outlived its case")


def test_http_loads_never_send_the_same_body_twice() -> None:
    from bench.gpu_benchmark.http_case import UniqueBodies

    records = [{"model": "clef-flash", "state": f"record {i}", "questions": {}} for i in range(3)]
    bodies = UniqueBodies(records)
    sent = [bodies(index) for index in [0, 1, 0, 1, 2, 3, 4, 0]]  # loads and warm-ups repeat their indices
    assert sent[:3] == records
    assert len({json.dumps(body, sort_keys=True) for body in sent}) == len(sent)
    assert sent[3]["state"] == "#1 record 0" and sent[6]["state"] == "#2 record 0"


def test_json_files_are_replaced_whole(tmp_path: Path) -> None:
    """Two invocations (one per GPU) share --work: a reader must never see a half-written releases.json."""
    from bench.gpu_benchmark.workdir import write_json

    target = tmp_path / "releases.json"
    target.write_text('{"bf16": "old"}\n')
    before = target.stat().st_ino
    write_json(target, {"bf16": "/tmp/new", "fp8": "/tmp/fp8"})
    assert json.loads(target.read_text()) == {"bf16": "/tmp/new", "fp8": "/tmp/fp8"}
    assert target.stat().st_ino != before, "written in place, not renamed over"
    assert [path.name for path in tmp_path.iterdir()] == ["releases.json"]


# The vision case starts a vLLM engine with the vision tower and runs every image set: minutes on the CPU, so it is
# not in the CPU smoke run (test_gpu_benchmark_smoke.py); its parts that need no engine are tested here.


def test_vision_case_images_are_seeded_noise_files_of_each_sets_size() -> None:
    from bench.gpu_benchmark.vision_case import IMAGE_SETS, ImageSet, image_files
    from clef_head.media import decode_image

    assert [image_set.name for image_set in IMAGE_SETS] == ["1x448x448", "4x448x448", "1x1024x768", "4x1024x768"]
    files = image_files(ImageSet(3, 64, 48), seed=2)
    assert files == image_files(ImageSet(3, 64, 48), seed=2) and len(set(files)) == 3
    assert files != image_files(ImageSet(3, 64, 48), seed=3)
    assert all(data.startswith(b"\xff\xd8\xff") for data in files)
    image = decode_image(files[0], ("images", 0))
    assert image.size == (64, 48) and image.mode == "RGB"


def _encoded_with_images(pads: int, state_tokens: int, truncated: bool = False) -> EncodedRequest:
    import torch

    from clef_head.layout import RecordLayout
    from clef_head.media import EncodedMedia

    media = EncodedMedia(
        token_ids=[1, *([9] * pads), 2, 3],
        token_type_ids=[0, *([1] * pads), 0, 0],
        pixel_values=torch.zeros(4 * pads, 1536),
        image_grid_thw=torch.tensor([[1, 2, 2 * pads]]),
        pixel_values_videos=None,
        video_grid_thw=None,
        video_timestamps=(),
        video_runs=(),
        digest=b"files",
    )
    ids = [5, 6, *media.token_ids, *([7] * state_tokens)]
    return EncodedRequest(ids, RecordLayout(questions=()), state_truncated=truncated, media=media, media_offset=2)


def test_vision_case_names_every_requests_images_anew() -> None:
    """vLLM keys its encoder cache on the images' names: a request named like an earlier one would skip the tower."""
    import clef_plugin
    from bench.gpu_benchmark.vision_case import renamed

    encoded = _encoded_with_images(pads=4, state_tokens=3)
    first, second = renamed(encoded, "pass 0:1"), renamed(encoded, "pass 1:1")
    assert first.input_ids == encoded.input_ids and first.media is not None and encoded.media is not None
    assert first.media.pixel_values is encoded.media.pixel_values
    prompts = [
        clef_plugin.engine_prompt(item, 9, 10) for item in (encoded, first, second, renamed(encoded, "pass 0:1"))
    ]
    names = [prompt["multi_modal_uuids"]["image"][0] for prompt in prompts]
    assert len(set(names[:3])) == 3 and names[3] == names[1]
    assert len({tuple(prompt["prompt_token_ids"]) for prompt in prompts}) == 1
    with pytest.raises(ValueError):
        renamed(EncodedRequest([1, 2], encoded.layout), "text only")


def test_vision_case_figures_count_image_tokens_and_keep_the_spread() -> None:
    from bench.gpu_benchmark.vision_case import ImageSet, image_set_result

    encoded = [
        _encoded_with_images(pads=8, state_tokens=10),
        _encoded_with_images(pads=8, state_tokens=30, truncated=True),
    ]
    tokens = sum(len(item.input_ids) for item in encoded)  # 2 + 11 + 10 and 2 + 11 + 30
    assert tokens == 66
    result = image_set_result(ImageSet(2, 448, 448), encoded, [2.0, 1.0, 4.0], [30.0, 10.0, 20.0], [8.0, 6.0, 10.0])
    assert result["image_tokens_per_request"] == 8 and result["mean_prompt_tokens"] == 33.0
    assert result["states_cut"] == 1 and result["images_per_request"] == 2 and result["image_size"] == [448, 448]
    assert result["seconds"] == 2.0 and result["records_per_s"] == 1.0 and result["prompt_tokens_per_s"] == 33.0
    assert (
        result["records_per_s_spread"]["runs"] == [1.0, 2.0, 0.5] and result["prompt_tokens_per_s_spread"]["max"] == 66
    )
    assert result["single_request_ms"]["p50"] == 20.0 and result["single_request_ms"]["count"] == 3
    assert result["preprocess_ms_per_request"]["median"] == 8.0 and result["preprocess_ms_per_image"] == 4.0
    with pytest.raises(ValueError):
        image_set_result(ImageSet(1, 448, 448), [EncodedRequest([1], encoded[0].layout)], [1.0], [1.0], [1.0])


def test_vision_case_text_throughput_is_set_against_the_text_case_of_its_mode(tmp_path: Path) -> None:
    from bench.gpu_benchmark.report import vision_rows
    from bench.gpu_benchmark.vision_case import attach_text_ratios, text_ratio

    spread = {"min": 980.0, "max": 1000.0}
    same = {"records": 2, "prompt_tokens": 1000}
    figures = {**same, "records_per_s": 2.0, "prompt_tokens_per_s": 990.0, "prompt_tokens_per_s_spread": spread}
    vision = {"mode": "graphs", "start_s": 90.0, "max_model_len": 4096, "text_only": dict(figures), "images": {}}
    cases: dict[str, Any] = {
        "vllm-fp8-graphs": {**same, "prompt_tokens_per_s": 1000.0},
        "vllm-fp8-eager": {**same, "prompt_tokens_per_s": 10.0},
        "vision": vision,
        "vision-again": {"error": "timed out", "partial": {**vision, "text_only": dict(figures)}},
    }
    attach_text_ratios(cases)
    expected = {
        "case": "vllm-fp8-graphs",
        "same_invocation": True,
        "case_prompt_tokens_per_s": 1000.0,
        "ratio": 0.99,
        "target": 0.98,
        "met": True,
    }
    assert vision["text_only"]["ratio_to_text_case"] == expected
    assert cases["vision-again"]["partial"]["text_only"]["ratio_to_text_case"] == expected
    slower = {**vision, "text_only": {**figures, "prompt_tokens_per_s": 970.0}}
    assert text_ratio(slower, cases) == {**expected, "ratio": 0.97, "met": False}
    other_records = {**vision, "text_only": {**figures, "records": 3}}
    assert text_ratio(other_records, cases) is None
    rows = vision_rows(cases)
    assert "= 0.990x vllm-fp8-graphs" in rows[0] and rows[1] == "vision-again: timed out" and "0.990x" in rows[2]

    # No text case of the vision engine's mode in this invocation: an earlier one's result in --work, else none.
    alone: dict[str, Any] = {"vision": {**vision, "text_only": dict(figures)}}
    attach_text_ratios(alone, tmp_path)
    assert "ratio_to_text_case" not in alone["vision"]["text_only"]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "vllm-fp8-graphs.json").write_text(json.dumps({**same, "prompt_tokens_per_s": 1000.0}))
    attach_text_ratios(alone, tmp_path)
    assert alone["vision"]["text_only"]["ratio_to_text_case"] == {**expected, "same_invocation": False}


def test_vision_case_process_gets_the_vision_options() -> None:
    from bench.gpu_benchmark.cli import build_parser
    from bench.gpu_benchmark.processes import child_command

    args = build_parser().parse_args(["--vision-records", "12", "--vision-latency-requests", "3", "--seed", "5"])
    args.variants, args.http_variants = {}, {}
    child = build_parser().parse_args(child_command(args, "vision")[3:])
    assert (child.run_case, child.vision_records, child.vision_latency_requests, child.seed) == ("vision", 12, 3, 5)
    assert child.vision_max_model_len == 4096


def test_lone_records_and_groups_are_compared_between_a_variant_and_its_plain_case(tmp_path: Path) -> None:
    """A variant that changes only lone steps (whole-forward graphs) shows in its lone records' agreement, which
    the batched passes' agreement cannot see."""
    import torch

    from bench.gpu_benchmark.report import agreement
    from bench.gpu_benchmark.workdir import LONE, group_kind, save_logits
    from clef_head.layout import QuestionLayout, RecordLayout

    question = QuestionLayout("q", 1, (0, 1), ((1, 2), (2, 3), (3, 4)), ("a", "b", "c"))
    layout = RecordLayout(questions=(question,))
    (tmp_path / "encoded.json").write_text(json.dumps([{"input_ids": [1, 2, 3, 4], "layout": layout.to_wire()}] * 2))
    batched = [torch.tensor([2.0, 1.0, 0.0])] * 2
    for case in ("vllm-fp8-graphs", "vllm-fp8-graphs+lone"):
        save_logits(tmp_path, case, batched)
    save_logits(tmp_path, "vllm-fp8-graphs", batched, LONE)
    save_logits(tmp_path, "vllm-fp8-graphs+lone", [torch.tensor([0.0, 1.0, 2.0])] * 2, LONE)
    save_logits(tmp_path, "vllm-fp8-graphs", batched, group_kind(2))
    save_logits(tmp_path, "vllm-fp8-graphs+lone", batched, group_kind(2))

    found = agreement(tmp_path)

    assert set(found) == {
        "vllm-fp8-graphs vs vllm-fp8-graphs+lone",
        "vllm-fp8-graphs vs vllm-fp8-graphs+lone, lone records",
        "vllm-fp8-graphs vs vllm-fp8-graphs+lone, groups of 2",
    }
    assert found["vllm-fp8-graphs vs vllm-fp8-graphs+lone"]["top1_agreement"] == 1.0
    assert found["vllm-fp8-graphs vs vllm-fp8-graphs+lone, lone records"]["top1_agreement"] == 0.0
    assert found["vllm-fp8-graphs vs vllm-fp8-graphs+lone, groups of 2"]["top1_agreement"] == 1.0
