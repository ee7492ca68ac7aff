"""Quantize a Clef release's backbone (compressed-tensors FP8 W8A8 or NVFP4 W4A4) and write its repository layout.

    python -m clef_tools.quantize SRC DST [--scheme FP8_DYNAMIC|NVFP4] [--device auto|cpu|cuda]

FP8_DYNAMIC: every ``Linear`` of the backbone gets FP8 (e4m3) weights with one static scale per
output channel; activations are quantized per token at run time (vLLM's CUTLASS FP8 GEMM on Hopper).

NVFP4 (format ``nvfp4-pack-quantized``): FP4 (e2m1) weights in groups of 16 along the input, each
group with an FP8 (e4m3) scale, over one FP32 global scale per tensor; activations likewise in
groups of 16 with FP8 scales computed at run time over a static global input scale, calibrated here
on generated records run through the BF16 model (the largest |input| each Linear sees). vLLM fuses
q/k/v, gate/up and Gated DeltaNet's ``in_proj_qkv``+``in_proj_z`` into one GEMM each, which takes
one global scale per fused weight: every member of such a group gets the group's global scales
(weights and inputs), computed over all its members (:data:`FUSED_GROUPS`).

Kept in BF16 (both schemes): ``lm_head`` (the joint schema head reads its rows), embeddings and
norms (not Linear), the vision tower and the Gated DeltaNet gate projections
``linear_attn.in_proj_a`` / ``in_proj_b``.

The weights are streamed tensor by tensor, shard by shard, from the source safetensors: only the
current shard is in memory, so a 9B backbone quantizes in seconds on a GPU and fits in host memory
on a CPU (NVFP4's calibration loads the whole BF16 model once, on ``--device``). The targeted modules are
exactly those compressed-tensors' own matcher selects on the
model class built from the source config on the ``meta`` device (no weights), the scales come from
compressed-tensors' ``calculate_qparams`` (per-channel min/max, i.e. the preset's
``memoryless_minmax`` observer; NVFP4's global scales from its ``generate_gparam``) and the packed
tensors from the scheme's own compressor (float-quantized, nvfp4-pack-quantized); the
``quantization_config`` in ``config.json`` is written by ``ModelCompressor``. The output therefore
loads in vLLM (its compressed-tensors FP8 and NVFP4 support; NVFP4 needs a GPU) and in transformers
(compressed-tensors decompresses it).

One module of ~440 lines on purpose: both schemes share the streaming, the module targeting and the layout
writer; NVFP4 adds only its calibration and fused-group scales, which read the same targets.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_head.checkpoint import HEAD_SUBFOLDER, RANDOM_MARKER, CheckpointError, find_head_files, is_random_release

SCHEMES: tuple[str, ...] = ("FP8_DYNAMIC", "NVFP4")
FORMATS: dict[str, str] = {"FP8_DYNAMIC": "float-quantized", "NVFP4": "nvfp4-pack-quantized"}
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("in_proj_qkv", "in_proj_z"),
)
"""Sibling Linear layers (same parent module) that vLLM runs as one fused GEMM: NVFP4 gives each
group one weight global scale and one input global scale."""
CALIBRATION_RECORDS = 32
CALIBRATION_TOKENS = 512
TARGETS: list[str] = ["Linear"]
# Module names (compressed-tensors "re:" patterns) kept in BF16. Embeddings and norms are not Linear
# and are never targeted.
IGNORE: list[str] = ["re:.*lm_head", "re:.*visual.*", "re:.*linear_attn.in_proj_a$", "re:.*linear_attn.in_proj_b$"]
RECIPE_FILE = "recipe.yaml"
NOTE_FILE = "README.md"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Files of the source that are rewritten rather than copied.
_REWRITTEN = {"config.json", SAFETENSORS_INDEX}


class QuantizationError(ValueError):
    """A source or destination that cannot be quantized as asked."""


@dataclass(frozen=True)
class QuantizationReport:
    """What :func:`quantize_release` wrote."""

    destination: Path
    scheme: str
    quantized_modules: int
    kept_tensors: int
    source_bytes: int
    destination_bytes: int
    seconds: float
    device: str

    def to_json(self) -> dict[str, Any]:
        """Plain-data form (for benchmark summaries)."""
        return {
            "destination": str(self.destination),
            "scheme": self.scheme,
            "quantized_modules": self.quantized_modules,
            "kept_tensors": self.kept_tensors,
            "source_bytes": self.source_bytes,
            "destination_bytes": self.destination_bytes,
            "seconds": round(self.seconds, 2),
            "device": self.device,
        }


def quantization_config(scheme: str = "FP8_DYNAMIC") -> Any:
    """The compressed-tensors ``QuantizationConfig`` (status: compressed) for ``scheme``."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme

    if scheme not in SCHEMES:
        raise QuantizationError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    preset = preset_name_to_scheme(scheme, TARGETS)
    preset.format = FORMATS[scheme]
    return QuantizationConfig(
        config_groups={"group_0": preset},
        ignore=list(IGNORE),
        format=FORMATS[scheme],
        quantization_status=QuantizationStatus.COMPRESSED,
    )


def targeted_modules(source: Path, config: Any) -> list[str]:
    """Names of the source model's modules the scheme quantizes (model built on ``meta``, no weights)."""
    import transformers
    from compressed_tensors.utils.match import match_named_modules

    model_config = transformers.AutoConfig.from_pretrained(source)
    architectures = getattr(model_config, "architectures", None) or []
    if getattr(model_config, "quantization_config", None) is not None:
        raise QuantizationError(f"{source}/config.json already has a quantization_config: the source must be BF16")
    if not architectures or not hasattr(transformers, architectures[0]):
        raise QuantizationError(
            f"{source}/config.json: architectures {architectures} is not a transformers model class"
        )
    with torch.device("meta"):
        model = getattr(transformers, architectures[0])._from_config(model_config)
    return [name for name, _ in match_named_modules(model, config.config_groups["group_0"].targets, config.ignore)]


def _weight_files(source: Path) -> dict[str, list[str]]:
    """Shard file name → tensor names, from the index (sharded) or the single ``model.safetensors``."""
    from safetensors import safe_open

    index = source / SAFETENSORS_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        return shards
    single = source / "model.safetensors"
    if not single.is_file():
        raise QuantizationError(f"{source}: neither {SAFETENSORS_INDEX} nor model.safetensors found")
    with safe_open(str(single), framework="pt") as handle:
        return {single.name: list(handle.keys())}


def fused_group(module: str) -> str:
    """The fused group a module belongs to (``parent.q_proj+k_proj+v_proj``), or the module itself."""
    parent, _, leaf = module.rpartition(".")
    for members in FUSED_GROUPS:
        if leaf in members:
            return f"{parent}.{'+'.join(members)}"
    return module


def _group_maxima(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per module, the largest of ``values`` over the module's fused group."""
    groups: dict[str, torch.Tensor] = {}
    for module, value in values.items():
        key = fused_group(module)
        groups[key] = torch.maximum(groups[key], value) if key in groups else value
    return {module: groups[fused_group(module)] for module in values}


def _global_scale(absmax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' NVFP4 global scale for a tensor whose largest magnitude is ``absmax``."""
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    return generate_gparam(-absmax, absmax)


def _quantize_weight(
    weight: torch.Tensor, scheme: Any, global_scale: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """One Linear weight [out, in] compressed: FP8 with per-channel scales, or NVFP4 packed with
    FP8 scales per group of 16 over ``global_scale`` (the fused group's)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = scheme.weights
    if args.group_size:
        if weight.shape[1] % args.group_size:
            raise QuantizationError(
                f"input width {weight.shape[1]} is not a multiple of the group size {args.group_size}"
            )
        grouped = weight.unflatten(1, (-1, args.group_size))
        scale, zero_point = calculate_qparams(grouped.amin(dim=2), grouped.amax(dim=2), args, global_scale=global_scale)
        state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point}
        state["weight_global_scale"] = global_scale
    else:
        scale, zero_point = calculate_qparams(weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), args)
        state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point}
    return BaseCompressor.load_from_registry(scheme.format).compress(state, scheme)


def weight_absmax(
    source: Path, shards: dict[str, list[str]], targets: set[str], device: torch.device
) -> dict[str, torch.Tensor]:
    """Largest |weight| of every targeted Linear (one streaming pass over the shards)."""
    from safetensors import safe_open

    absmax: dict[str, torch.Tensor] = {}
    for shard, names in shards.items():
        with safe_open(str(source / shard), framework="pt", device=str(device)) as handle:
            for name in names:
                module = name.removesuffix(".weight")
                if name.endswith(".weight") and module in targets:
                    absmax[module] = handle.get_tensor(name).abs().amax().float()
    return absmax


@torch.inference_mode()
def calibrate_input_absmax(
    source: Path, targets: set[str], device: torch.device, records: int = CALIBRATION_RECORDS, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Largest |input| every targeted Linear sees while the BF16 backbone reads ``records`` generated
    System One prompts (about :data:`CALIBRATION_TOKENS` tokens each) one at a time."""
    import transformers

    from clef_head.encoder import encode_request
    from clef_head.request import parse_request
    from clef_tools.sized_records import make_records

    model_config = transformers.AutoConfig.from_pretrained(source)
    model_class = getattr(transformers, model_config.architectures[0])
    model = model_class.from_pretrained(source, dtype=torch.bfloat16, device_map={"": str(device)}).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    absmax: dict[str, torch.Tensor] = {}

    def observe(name: str) -> Any:
        def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            value = inputs[0].detach().abs().amax().float()
            absmax[name] = torch.maximum(absmax[name], value) if name in absmax else value

        return hook

    handles = [
        module.register_forward_pre_hook(observe(name)) for name, module in model.named_modules() if name in targets
    ]
    try:
        spread = CALIBRATION_TOKENS // 2
        for body in make_records(tokenizer, records, seed=seed, tokens=CALIBRATION_TOKENS, spread=spread):
            ids = encode_request(tokenizer, parse_request(body)).input_ids
            model.model.language_model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(targets - absmax.keys())
    if missing:
        raise QuantizationError(f"calibration never reached {len(missing)} targeted module(s), e.g. {missing[0]}")
    del model
    return absmax


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise QuantizationError("--device cuda was asked for but CUDA is not available")
    return resolved


def _recipe(scheme: str) -> str:
    """llm-compressor's recipe for the same quantization (reproducible with ``oneshot``)."""
    return (
        "# Quantization applied by clef_tools.quantize (equivalent llm-compressor recipe).\n"
        "default_stage:\n"
        "  default_modifiers:\n"
        "    QuantizationModifier:\n"
        f"      targets: {json.dumps(TARGETS)}\n"
        f"      ignore: {json.dumps(IGNORE)}\n"
        f"      scheme: {scheme}\n"
    )


SCHEME_DESCRIPTIONS: dict[str, str] = {
    "FP8_DYNAMIC": "W8A8: FP8 weights with per-output-channel scales, FP8 activations with per-token scales "
    "computed at run time",
    "NVFP4": "W4A4: FP4 weights and activations in groups of 16 with FP8 group scales over a per-tensor global "
    "scale, shared by the members of each fused GEMM (q/k/v, gate/up, in_proj_qkv/in_proj_z); input global "
    "scales calibrated on generated records",
}


def _note(source: Path, scheme: str, report_counts: tuple[int, int], random: bool) -> str:
    quantized, kept = report_counts
    warning = (
        "\n**Random weights.** The source is a random-weight release: this model's answers carry no "
        "meaning. It exists to test and measure the serving stack.\n"
        if random
        else ""
    )
    return (
        f"# Clef {scheme} release\n\n"
        f"Backbone quantized from `{source.name}` with compressed-tensors {scheme} ({SCHEME_DESCRIPTIONS[scheme]}). "
        f"{quantized} Linear modules are quantized; {kept} tensors are kept as in the source (lm_head, "
        "embeddings, norms, the vision tower, `linear_attn.in_proj_a`/`in_proj_b`).\n\n"
        f"- `config.json`: `quantization_config` for vLLM and transformers\n"
        f"- `{RECIPE_FILE}`: the recipe (llm-compressor format)\n"
        f"- `{HEAD_SUBFOLDER}/`: the joint schema head, unchanged\n"
        f"{warning}"
    )


def quantize_release(
    source: str | Path,
    destination: str | Path,
    scheme: str = "FP8_DYNAMIC",
    device: str = "auto",
    calibration_records: int = CALIBRATION_RECORDS,
) -> QuantizationReport:
    """Write the quantized repository layout of release ``source`` into the new folder ``destination``.

    NVFP4 first reads every targeted weight once for the fused groups' global scales and runs
    ``calibration_records`` generated prompts through the BF16 model for the input global scales.
    """
    from compressed_tensors.compressors.model_compressors.model_compressor import ModelCompressor
    from safetensors import safe_open
    from safetensors.torch import save_file

    started = time.perf_counter()
    src, dst = Path(source), Path(destination)
    if not (src / "config.json").is_file():
        raise QuantizationError(f"{src} is not a release: config.json is missing")
    if dst.exists() and any(dst.iterdir()):
        raise QuantizationError(f"{dst} exists and is not empty")
    head = find_head_files(src)
    config = quantization_config(scheme)
    group = config.config_groups["group_0"]
    targets = set(targeted_modules(src, config))
    torch_device = _resolve_device(device)
    shards = _weight_files(src)
    stored = {name for names in shards.values() for name in names}
    missing = sorted(name for name in targets if f"{name}.weight" not in stored)
    if missing:
        raise QuantizationError(
            f"{src}: {len(missing)} targeted Linear weight(s) not in the checkpoint, e.g. {missing[0]}.weight"
        )

    weight_global: dict[str, torch.Tensor] = {}
    input_global: dict[str, torch.Tensor] = {}
    if group.weights.group_size:  # NVFP4: global scales shared by each fused group
        weight_global = {
            module: _global_scale(value)
            for module, value in _group_maxima(weight_absmax(src, shards, targets, torch_device)).items()
        }
        calibrated = calibrate_input_absmax(src, targets, torch_device, records=calibration_records)
        input_global = {module: _global_scale(value) for module, value in _group_maxima(calibrated).items()}

    dst.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    kept = source_bytes = destination_bytes = 0
    for shard, names in shards.items():
        source_bytes += (src / shard).stat().st_size
        output: dict[str, torch.Tensor] = {}
        with safe_open(str(src / shard), framework="pt", device=str(torch_device)) as handle:
            for name in names:
                tensor = handle.get_tensor(name)
                module = name.removesuffix(".weight")
                if name.endswith(".weight") and module in targets:
                    if tensor.dim() != 2:
                        raise QuantizationError(f"{name}: a Linear weight must be 2-D, got {tuple(tensor.shape)}")
                    for local, value in _quantize_weight(tensor, group, weight_global.get(module)).items():
                        output[f"{module}.{local}"] = value
                    if module in input_global:
                        output[f"{module}.input_global_scale"] = input_global[module]
                else:
                    output[name] = tensor
                    kept += 1
        output = {name: value.contiguous().cpu() for name, value in output.items()}
        save_file(output, str(dst / shard), metadata={"format": "pt"})
        destination_bytes += (dst / shard).stat().st_size
        weight_map.update(dict.fromkeys(output, shard))
        del output
    if (src / SAFETENSORS_INDEX).is_file():
        index = {"metadata": {"total_size": destination_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")

    for item in sorted(src.iterdir()):
        if item.is_file() and item.suffix != ".safetensors" and item.name not in _REWRITTEN | {head.config.name}:
            shutil.copy2(item, dst / item.name)
    shutil.copy2(src / "config.json", dst / "config.json")
    ModelCompressor(quantization_config=config).update_config(str(dst))
    (dst / HEAD_SUBFOLDER).mkdir(exist_ok=True)
    shutil.copy2(head.config, dst / HEAD_SUBFOLDER / head.config.name)
    shutil.copy2(head.weights, dst / HEAD_SUBFOLDER / head.weights.name)
    (dst / RECIPE_FILE).write_text(_recipe(scheme))
    random = is_random_release(src)
    (dst / NOTE_FILE).write_text(_note(src, scheme, (len(targets), kept), random))
    if random and not (dst / RANDOM_MARKER).is_file():
        shutil.copy2(src / RANDOM_MARKER, dst / RANDOM_MARKER)
    return QuantizationReport(
        destination=dst,
        scheme=scheme,
        quantized_modules=len(targets),
        kept_tensors=kept,
        source_bytes=source_bytes,
        destination_bytes=destination_bytes,
        seconds=time.perf_counter() - started,
        device=str(torch_device),
    )


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m clef_tools.quantize SRC DST [--scheme FP8_DYNAMIC|NVFP4] [--device auto]``."""
    parser = argparse.ArgumentParser(prog="python -m clef_tools.quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="BF16 release folder (head at the root or in clef_head/)")
    parser.add_argument("destination", type=Path, help="new folder for the quantized release")
    parser.add_argument("--scheme", choices=SCHEMES, default="FP8_DYNAMIC")
    parser.add_argument("--device", default="auto", help="where scales are computed: auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--calibration-records",
        type=int,
        default=CALIBRATION_RECORDS,
        help="NVFP4: generated prompts run through the BF16 model to set the input global scales",
    )
    args = parser.parse_args(argv)
    if args.calibration_records < 1:
        parser.error("--calibration-records must be at least 1")
    try:
        report = quantize_release(
            args.source,
            args.destination,
            scheme=args.scheme,
            device=args.device,
            calibration_records=args.calibration_records,
        )
    except (QuantizationError, CheckpointError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps(report.to_json()))


if __name__ == "__main__":
    main()
