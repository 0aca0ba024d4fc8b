"""How the stages turn text into token ids: chat prompts, prefilled reply openings, targets.

One place for the conventions the policy, the scorer and the benchmarks share: a prompt is the
chat template of one user message plus the prefilled opening of the reply (not trained on, not
differentiated); a target is the reply text plus the end-of-turn token.
"""

from __future__ import annotations

import random

from compassplay.config import RunConfig
from compassplay.engines.generation.base import Segment
from compassplay.envs.interface import Environment
from compassplay.records import Candidate
from compassplay.rewards.batch import Example
from compassplay.rewards.functions import regex_tokenize
from compassplay.rewards.reference_set import ReferenceItem


def stage_seed(run_seed: int, step: int, stage: str) -> int:
    """A deterministic 31-bit seed for one stage of one step."""
    return random.Random(f"{run_seed}:{step}:{stage}").getrandbits(31)


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn user message with the generation prompt appended."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def target_ids(tokenizer, text: str) -> list[int]:
    """Token ids of an assistant answer followed by the end-of-turn token."""
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def prefix_of(env: Environment, cfg: RunConfig, role: str, task_type: str) -> str:
    """The prefilled reply opening of `role` ('' unless proposer/solver.prefill)."""
    section = cfg.proposer if role == "proposer" else cfg.solver
    return env.response_prefix(role, task_type) if section.prefill else ""


def template_of(env: Environment, cfg: RunConfig, role: str, task_type: str
                ) -> tuple[Segment, ...]:
    """The constrained-decoding template of `role`'s reply (() unless proposer/solver.template)."""
    section = cfg.proposer if role == "proposer" else cfg.solver
    if not section.template:
        return ()
    return env.response_template(role, task_type,
                                 section.segment_max_tokens or section.max_new_tokens)


def prompt_ids(tokenizer, text: str, prefix: str) -> list[int]:
    """Chat prompt ids followed by the prefilled reply opening (part of the prompt: the
    policy is trained on, and the scorer differentiates, only what comes after it)."""
    ids = chat_ids(tokenizer, text)
    return ids + tokenizer.encode(prefix, add_special_tokens=False) if prefix else ids


def novelty_tokens(tokenizer, text: str, kind: str) -> list:
    """Tokens for the Jaccard novelty: model token ids (default) or regex word tokens."""
    return regex_tokenize(text) if kind == "regex" else tokenizer.encode(
        text, add_special_tokens=False)


def reference_examples(tokenizer, items: list[ReferenceItem]) -> list[Example]:
    """The reference set as scorer Examples: chat prompt -> gold solution + end of turn."""
    return [Example(chat_ids(tokenizer, it.prompt), target_ids(tokenizer, it.solution))
            for it in items]


def candidate_examples(cands: list[Candidate]) -> list[Example]:
    return [Example(list(c.prompt_ids), list(c.target_ids)) for c in cands]
