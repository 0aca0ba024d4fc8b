"""Randomly initialised causal LMs at real model shapes, for benchmarks (no download).

`build(name, dtype, device, seed)` returns a transformers model with the published
architecture of `name` (layer count, widths, heads, vocabulary, tying) and random weights,
created directly on `device` in `dtype`. "toy" is the 4M-parameter Qwen2-style model the
scorer bench used before (its width, depth and vocabulary are arguments).
"""

from __future__ import annotations

import torch

# Published configs (config.json of each model), the fields that set the arithmetic.
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0),
    "qwen2.5-1.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=1536,
                         intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6),
    "qwen2.5-7b": dict(arch="qwen2", vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1e6),
}
SHAPE_NAMES = ["toy", *SHAPES]


def toy_fields(hidden: int, layers: int, vocab: int) -> dict:
    """Qwen2-style tiny LM (GQA, q/k/v biases, RMSNorm, untied head)."""
    return dict(arch="qwen2", vocab_size=vocab, hidden_size=hidden,
                intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                num_attention_heads=max(1, hidden // 64),
                num_key_value_heads=max(1, hidden // 128), tie_word_embeddings=False)


def build(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
          seed: int = 0, toy: dict | None = None, layers: int | None = None) -> torch.nn.Module:
    """The model of shape `name` (one of SHAPE_NAMES; "toy" takes `toy_fields(...)` as
    `toy`), random weights from `seed`, in eval mode. `layers` truncates a real shape's depth
    (quick runs; the widths stay)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if name == "toy":
        fields = dict(toy or toy_fields(256, 4, 2048))
    elif name in SHAPES:
        fields = dict(SHAPES[name])
    else:
        raise ValueError(f"--shape: unknown model shape {name!r} (expected one of "
                         f"{', '.join(SHAPE_NAMES)})")
    arch = fields.pop("arch")
    if layers and name != "toy":
        fields["num_hidden_layers"] = layers
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                          "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = cfg_cls(max_position_embeddings=4096, **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg)
    return model.to(dtype).eval()


def param_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in model.parameters())
