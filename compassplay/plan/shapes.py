"""Architecture arithmetic for the memory plan (pure: no torch): parameter counts, KV-cache
bytes and activation bytes per token of decoder-only transformers (LLaMA / Qwen2 layout:
RMSNorm, grouped-query attention, SwiGLU MLP, optional q/k/v biases, optional tied head).

Where a shape comes from (`shape_of`): the tiny config (model.source=tiny), the model's own
config.json (model.source=local; a hub id already in the Hugging Face cache), or the published
config.json values in `KNOWN` (hub ids of the shipped configs and their neighbours). The
counts are exact for these layouts: tests check them against transformers models built on the
meta device, and SmolLM2-135M's 134,515,008 against its safetensors file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from compassplay.config import ModelSection

# Tiny random models use the byte tokenizer: 256 byte symbols + 4 special tokens
# (compassplay/models/byte_tokenizer.py; a test checks the count).
TINY_VOCAB = 260
# Bytes per vocabulary entry per token of the log-prob head beyond the logits themselves: the
# float32 copy (4), the float32 log-softmax kept for backward (4) and its gradient (4).
LOGIT_EXTRA_BYTES = 12


@dataclass(frozen=True)
class Shape:
    """The config.json fields that set the arithmetic (widths in units, context in tokens)."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool  # the output head shares the input embedding
    qkv_bias: bool  # Qwen2: biases on the q/k/v projections
    context: int  # max_position_embeddings (tokens)
    head_dim: int = 0  # 0: hidden // heads

    @property
    def q_dim(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    def layer_params(self) -> int:
        """One block: q/k/v/o projections (+ q/k/v biases), gate/up/down MLP, two norms."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    def params(self) -> int:
        """All parameters (a tied head counted once): embeddings, blocks, final norm, head."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def last_blocks_params(self, k: int) -> int:
        """Parameters of `learner.trainable` / `scorer.params` = 'last:K': K blocks + final norm."""
        return min(k, self.layers) * self.layer_params() + self.hidden

    def largest_tensor_params(self) -> int:
        """Elements of the largest single weight: the embedding (or untied head, the same
        shape), or an MLP / attention projection when wider."""
        h = self.hidden
        return max(self.vocab * h, self.intermediate * h, self.q_dim * h)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache per token: keys and values of every layer."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def layer_activation_bytes(self, dtype_bytes: int) -> int:
        """Bytes one block keeps for backward per token: (12 h + 4 I + 4 kv) elements (the
        two norms' inputs, float32 copies and outputs; q, k, v after rotary and the attention
        output with a fused (SDPA) kernel; the MLP's gate, up, activation and product)."""
        return (12 * self.hidden + 4 * self.intermediate + 4 * self.kv_dim) * dtype_bytes

    def logit_bytes_per_token(self, dtype_bytes: int) -> int:
        """The head per token: logits in the model's dtype + float32 copy, log-softmax and its
        gradient (LOGIT_EXTRA_BYTES per vocabulary entry)."""
        return self.vocab * (dtype_bytes + LOGIT_EXTRA_BYTES)

    def activation_bytes_per_token(self, dtype_bytes: int, checkpointing: bool) -> int:
        """Peak bytes per token of a training forward + backward: every block's activations,
        or with gradient checkpointing each block's input plus one block recomputed; plus the
        head. At Qwen2.5-7B's shape in bf16 without checkpointing: 8.48 MiB/token (the GPU
        check measured 8.18 MiB/token for the scorer's 4,096-token passes, 2026-11-30)."""
        layer = self.layer_activation_bytes(dtype_bytes)
        if checkpointing:
            blocks = self.layers * self.hidden * dtype_bytes + layer
        else:
            blocks = self.layers * layer
        return blocks + self.logit_bytes_per_token(dtype_bytes)


QWEN25_CODER_7B = Shape("Qwen2.5-Coder-7B", vocab=152064, hidden=3584, intermediate=18944,
                        layers=28, heads=28, kv_heads=4, tied=False, qkv_bias=True,
                        context=32768)
SMOLLM2_135M = Shape("SmolLM2-135M", vocab=49152, hidden=576, intermediate=1536, layers=30,
                     heads=9, kv_heads=3, tied=True, qkv_bias=False, context=8192)
# DeepSeek-Prover-V2-7B: the LLaMA layout of DeepSeek-Prover-V1.5-Base (the published
# config.json of that base: 4096 / 11008 / 30 layers / 32 heads, no GQA, 102,400 tokens,
# untied) with V2's 32K context; 6,910,365,696 parameters.
DEEPSEEK_PROVER_7B = Shape("DeepSeek-Prover-7B", vocab=102400, hidden=4096, intermediate=11008,
                           layers=30, heads=32, kv_heads=32, tied=False, qkv_bias=False,
                           context=32768)

KNOWN: dict[str, Shape] = {
    "Qwen/Qwen2.5-Coder-7B": QWEN25_CODER_7B,
    "Qwen/Qwen2.5-Coder-7B-Instruct": QWEN25_CODER_7B,
    "HuggingFaceTB/SmolLM2-135M": SMOLLM2_135M,
    "HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2_135M,
    "deepseek-ai/DeepSeek-Prover-V2-7B": DEEPSEEK_PROVER_7B,
}

PLANNED_TYPES = ("llama", "qwen2", "mistral")


def from_hf_config(d: dict, name: str) -> Shape | None:
    """The shape of a config.json dict, or None for a layout the plan does not model."""
    kind = d.get("model_type", "")
    if kind not in PLANNED_TYPES:
        return None
    heads = int(d["num_attention_heads"])
    return Shape(name, vocab=int(d["vocab_size"]), hidden=int(d["hidden_size"]),
                 intermediate=int(d["intermediate_size"]), layers=int(d["num_hidden_layers"]),
                 heads=heads, kv_heads=int(d.get("num_key_value_heads") or heads),
                 tied=bool(d.get("tie_word_embeddings", False)),
                 qkv_bias=bool(d.get("attention_bias", kind == "qwen2")),
                 context=int(d.get("max_position_embeddings", 2048)),
                 head_dim=int(d.get("head_dim") or 0))


def _local_dir(path: str) -> Path | None:
    """The HF directory model.source=local names (as `models.loading.resolve_local`: the
    path itself, else relative to the package root)."""
    p = Path(path)
    for cand in (p, Path(__file__).resolve().parents[2] / p):
        if (cand / "config.json").is_file():
            return cand
    return None


def _cached_hub_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` if the Hugging Face cache already holds it (no download)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 -- an odd id: the plan just cannot tell
        return None
    return Path(found) if isinstance(found, str) else None


def shape_of(model: ModelSection) -> tuple[Shape | None, str]:
    """(shape of the configured model, where it came from) or (None, why not)."""
    if model.source == "tiny":
        t = model.tiny
        if t.arch == "gpt2":
            return None, "model.tiny.arch=gpt2: the plan models LLaMA/Qwen2 layouts only"
        return Shape(f"tiny-{t.arch}", vocab=TINY_VOCAB, hidden=t.hidden_size,
                     intermediate=t.intermediate_size, layers=t.num_layers, heads=t.num_heads,
                     kv_heads=t.num_kv_heads, tied=t.tie_embeddings,
                     qkv_bias=t.arch == "qwen2", context=t.max_positions), "model.tiny"
    if model.source == "smollm2-gguf":
        return SMOLLM2_135M, "SmolLM2-135M (published config.json)"
    name = model.name_or_path
    if model.source == "hub" and name in KNOWN:
        return KNOWN[name], f"{name} (published config.json)"
    found = _local_dir(name) if model.source == "local" else _cached_hub_config(name)
    if found is None:
        return None, (f"model.name_or_path={name!r}: no config.json found locally "
                      f"(known hub ids: {', '.join(sorted(KNOWN))})")
    path = found / "config.json" if found.is_dir() else found
    shape = from_hf_config(json.loads(path.read_text()), name)
    if shape is None:
        return None, f"model.name_or_path={name!r}: layout not modelled (not {PLANNED_TYPES})"
    return shape, str(path)
