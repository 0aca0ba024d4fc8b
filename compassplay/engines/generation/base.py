"""The generation-engine interface shared by the HF and vLLM backends.

Log-prob convention (the PPO ratio depends on it): `Generation.logprobs[i]` is the natural-log
probability of `completion_ids[i]` under the *unscaled* model distribution, i.e. temperature 1
and no top-p filtering (``log_softmax(logits)``), as `compassplay.records.Generation` states and
as vLLM reports by default (``logprobs_mode="raw_logprobs"``). The learner recomputes new
log-probs the same way, so with staleness 0 the ratio ``exp(new - old)`` is exactly 1 up to
float rounding, whatever the sampling temperature/top-p. Temperature and top-p only shape which
token is drawn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from compassplay.records import Generation
from compassplay.sync.versions import StaleWeightsError, check_version

__all__ = ["GenerationEngine", "SamplingParams", "Segment", "StaleWeightsError", "check_version",
           "generate_grouped"]

FORCED_TOKENS_PER_SEGMENT = 16  # room for a segment's forced text in a reply's length cap


@dataclass(frozen=True)
class Segment:
    """One free part of a templated reply: sampled text up to and including the first `stop`
    (at most `max_tokens` sampled tokens; if the cap is hit, `stop` is forced on a new line),
    then the forced text `then`. `ends`: other strings that end the free part early (e.g. a
    newline for a one-line block); after one of them `stop` is forced, then `then`.
    End-of-sequence is not sampled inside a segment."""

    stop: str
    then: str = ""
    max_tokens: int = 128
    ends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stop:
            raise ValueError("Segment.stop must be a non-empty string")
        if self.max_tokens < 1:
            raise ValueError(f"Segment.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch.

    max_new_tokens: cap on completion length (tokens); temperature: softmax temperature, 0 means
    greedy (argmax); top_p: nucleus mass in (0, 1]; stop: strings that end a completion (the
    completion keeps the tokens up to and including the one that completes the string);
    seed: equal seeds give equal completions for equal inputs, None = nondeterministic.
    template: constrained decoding of a reply's structure, `Segment`s in order; after the last
    segment's forced text the end-of-sequence token is forced (finish_reason "stop"). Forced
    tokens are part of the completion with their log-probabilities under the model, like
    sampled ones. Empty: free sampling. Not combined with `stop`.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    template: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        if self.template and self.stop:
            raise ValueError("a templated SamplingParams takes no stop strings (each Segment "
                             "has its own stop)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def from_section(cls, section: Any, seed: int | None = None,
                     template: tuple[Segment, ...] = ()) -> SamplingParams:
        """Build from a config `SamplingSection` (or any object with the same fields). With a
        template the reply's length is bounded by its segments' caps plus the forced text
        (`FORCED_TOKENS_PER_SEGMENT` per segment is allowed for it)."""
        cap = section.max_new_tokens
        if template:
            cap = max(cap, sum(s.max_tokens + FORCED_TOKENS_PER_SEGMENT for s in template))
        return cls(max_new_tokens=cap, temperature=section.temperature,
                   top_p=section.top_p, stop=[] if template else list(section.stop), seed=seed,
                   template=tuple(template))


class GenerationEngine(ABC):
    """Batched prompts (token ids, chat template already applied) -> `Generation` records.

    Implementations serialize `generate` and `load_weights`: a generate call reads the weight
    version once at its start and every completion it returns carries that version; weights
    are never swapped in the middle of a call.
    """

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, in prompt order."""

    def generate_each(self, prompts: list[list[int]], params: list[SamplingParams]
                      ) -> list[Generation]:
        """One completion per prompt, prompt i sampled under params[i], in prompt order. This
        default makes one `generate` call per distinct SamplingParams (`generate_grouped`);
        an engine that samples rows with different templates in one batch overrides it."""
        return generate_grouped(self, prompts, params)

    @abstractmethod
    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights (HF parameter names) and set `weight_version` to `version`.

        Raises `StaleWeightsError` when `version` is lower than the current one.
        """

    @property
    @abstractmethod
    def weight_version(self) -> int:
        """Version of the weights the next `generate` call will use (0 = initial weights)."""


def generate_grouped(engine: Any, prompts: list[list[int]], params: list[SamplingParams]
                     ) -> list[Generation]:
    """`engine.generate` once per distinct SamplingParams of `params` (one per prompt),
    results in prompt order."""
    if len(params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    groups: list[tuple[SamplingParams, list[int]]] = []
    for i, p in enumerate(params):
        for q, idx in groups:
            if q == p:
                idx.append(i)
                break
        else:
            groups.append((p, [i]))
    out: list[Generation | None] = [None] * len(prompts)
    for p, idx in groups:
        for i, gen in zip(idx, engine.generate([prompts[i] for i in idx], p), strict=True):
            out[i] = gen
    return out  # type: ignore[return-value]
