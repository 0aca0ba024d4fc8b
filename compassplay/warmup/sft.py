"""Supervised fine-tuning pieces shared by the warm micro model and the format bootstrap.

`SFTExample` is one (prompt, target) pair of token ids; `completion_loss` is the mean
cross-entropy over target tokens with the prompt run as a gradient-free KV cache;
`save_tokenizer` writes a tokenizer directory that transformers 4.56 and 5.x both load.
"""

from __future__ import annotations

import inspect
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


SHARED_PREFIX_MIN = 16  # shorter common prompt prefixes are not worth a separate pass


def completion_loss(model: torch.nn.Module, batch: list[SFTExample], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over completion tokens (a scalar, float32).

    The prompt (all but its last token) runs without gradient and is passed as the KV cache,
    which makes a step ~2x cheaper; the completion, preceded by the last prompt token (whose
    logits predict the first completion token), runs with gradient. Prompts are left-padded
    and completions right-padded; positions count real tokens only, as in generation.

    Leading prompt tokens that every example shares (the batches are of one kind: the same
    instructions) run once, at batch size 1, and their keys and values are repeated for the
    batch (`shared_prompt_prefix`); the no-gradient passes compute no vocabulary logits. Both
    change the loss only by float summation order (tests)."""
    heads = [e.prompt[:-1] for e in batch]
    tails = [e.prompt[-1:] + e.target for e in batch]
    p = shared_prompt_prefix(heads)
    rests = [h[p:] for h in heads]
    hp, tl = max(len(h) for h in rests), max(len(t) for t in tails)
    hid = torch.full((len(batch), hp), pad_id, dtype=torch.long)
    hmask = torch.zeros((len(batch), hp), dtype=torch.long)
    tid = torch.full((len(batch), tl), pad_id, dtype=torch.long)
    tmask = torch.zeros((len(batch), tl), dtype=torch.long)
    labels = torch.full((len(batch), tl), -100, dtype=torch.long)
    for r, (h, t) in enumerate(zip(rests, tails, strict=True)):
        hid[r, hp - len(h):] = torch.tensor(h, dtype=torch.long)
        hmask[r, hp - len(h):] = 1
        tid[r, :len(t)] = torch.tensor(t)
        tmask[r, :len(t)] = 1
        labels[r, :len(t) - 1] = torch.tensor(t[1:])
    mask = torch.cat([torch.ones((len(batch), p), dtype=torch.long), hmask, tmask], dim=1)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    arg, no_logits = cache_arg(model), _no_logits(model)
    with torch.no_grad():
        cache = None
        if p:
            cache = kv_cache_of(model(input_ids=torch.tensor([heads[0][:p]]),
                                      position_ids=pos[:1, :p], use_cache=True, **no_logits))
            cache.batch_repeat_interleave(len(batch))
        if hp:
            extra = {} if cache is None else {arg: cache}
            cache = kv_cache_of(model(input_ids=hid, attention_mask=mask[:, :p + hp],
                                      position_ids=pos[:, p:p + hp], use_cache=True,
                                      **no_logits, **extra))
    logits = model(input_ids=tid, attention_mask=mask, position_ids=pos[:, p + hp:],
                   use_cache=False, **({} if cache is None else {arg: cache})).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                             ignore_index=-100)


def shared_prompt_prefix(heads: list[list[int]]) -> int:
    """Leading tokens every one of several `heads` has in common, leaving each at least one
    token of its own; 0 for one head or under `SHARED_PREFIX_MIN`."""
    if len(heads) < 2:
        return 0
    p = 0
    for column in zip(*heads, strict=False):
        if any(t != column[0] for t in column):
            break
        p += 1
    p = min(p, min(len(h) for h in heads) - 1)
    return p if p >= SHARED_PREFIX_MIN else 0


def _no_logits(model: torch.nn.Module) -> dict[str, int]:
    """The keyword that makes a causal LM's forward compute one position's logits (the
    no-gradient prompt passes need only the cache), where the forward takes it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(
        model.forward).parameters else {}


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
