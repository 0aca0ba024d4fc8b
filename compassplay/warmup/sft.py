"""Supervised fine-tuning pieces shared by the warm micro model and the format bootstrap.

`SFTExample` is one (prompt, target) pair of token ids; `completion_loss` is the mean
cross-entropy over target tokens with the prompt run as a gradient-free KV cache;
`save_tokenizer` writes a tokenizer directory that transformers 4.56 and 5.x both load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compassplay.engines.generation.hf import cache_arg, kv_cache_of


@dataclass
class SFTExample:
    """One training pair: `kind` groups examples into batches of similar prompts."""

    kind: str
    prompt: list[int]
    target: list[int]


def completion_loss(model: torch.nn.Module, batch: list[SFTExample], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over completion tokens (a scalar, float32).

    The prompt (all but its last token) runs without gradient and is passed as the KV cache,
    which makes a step ~2x cheaper; the completion, preceded by the last prompt token (whose
    logits predict the first completion token), runs with gradient. Prompts are left-padded
    and completions right-padded; positions count real tokens only, as in generation.
    """
    heads = [e.prompt[:-1] for e in batch]
    tails = [e.prompt[-1:] + e.target for e in batch]
    hp, tl = max(len(h) for h in heads), max(len(t) for t in tails)
    hid = torch.full((len(batch), hp), pad_id, dtype=torch.long)
    hmask = torch.zeros((len(batch), hp), dtype=torch.long)
    tid = torch.full((len(batch), tl), pad_id, dtype=torch.long)
    tmask = torch.zeros((len(batch), tl), dtype=torch.long)
    labels = torch.full((len(batch), tl), -100, dtype=torch.long)
    for r, (h, t) in enumerate(zip(heads, tails, strict=True)):
        hid[r, hp - len(h):] = torch.tensor(h)
        hmask[r, hp - len(h):] = 1
        tid[r, :len(t)] = torch.tensor(t)
        tmask[r, :len(t)] = 1
        labels[r, :len(t) - 1] = torch.tensor(t[1:])
    mask = torch.cat([hmask, tmask], dim=1)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = kv_cache_of(model(input_ids=hid, attention_mask=hmask, position_ids=pos[:, :hp],
                                  use_cache=True))
    logits = model(input_ids=tid, attention_mask=mask, position_ids=pos[:, hp:],
                   use_cache=False, **{cache_arg(model): cache}).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                             ignore_index=-100)


def save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    """`tokenizer.save_pretrained(out_dir)`, naming the class PreTrainedTokenizerFast.

    transformers 5 records its own `TokenizersBackend` class, which 4.x cannot load; a fast
    tokenizer's files are otherwise the same, so the portable name keeps shipped data loadable
    by every supported version."""
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    conf = json.loads(path.read_text())
    if conf.get("tokenizer_class") == "TokenizersBackend":
        conf["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(conf, indent=2) + "\n")
