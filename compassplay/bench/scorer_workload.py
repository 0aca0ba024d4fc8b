"""The workload of `bench scorer` (`bench.scorer`): the scored model's dtypes and device, a
real model's shape with random weights, and the candidates (random-token examples, each with
optional extra solutions of its prompt)."""

from __future__ import annotations

import torch

from compassplay.bench import model_shapes
from compassplay.rewards.batch import CandidateExamples, Example

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda when CUDA is available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    return dev


def build_shape(shape: str, layers: int | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> torch.nn.Module:
    """A real model's architecture and sizes (`model_shapes`), random init, eval mode;
    `layers` truncates the depth."""
    return model_shapes.build(shape, dtype, device, seed, layers=layers)


def fixed_examples(n: int, prompt: int, target: int, vocab: int,
                   gen: torch.Generator) -> list[Example]:
    """n examples of exactly `prompt` + `target` random tokens."""
    ids = torch.randint(0, vocab, (n, prompt + target), generator=gen).tolist()
    return [Example(r[:prompt], r[prompt:]) for r in ids]


def make_examples(n: int, seq_len: int, vocab: int, gen: torch.Generator) -> list[Example]:
    """n examples of (7/8..1) * seq_len tokens, a quarter of them prompt."""
    out = []
    for _ in range(n):
        total = int(torch.randint(seq_len * 7 // 8, seq_len + 1, (1,), generator=gen))
        p = max(1, total // 4)
        ids = torch.randint(0, vocab, (total,), generator=gen).tolist()
        out.append(Example(ids[:p], ids[p:]))
    return out


def with_solutions(cands: list[Example], k: int, vocab: int,
                   gen: torch.Generator) -> list[CandidateExamples]:
    """Each candidate with `k - 1` more solutions of its prompt (random tokens, 7/8..1 times its
    target length); `k <= 1`: unchanged."""
    if k <= 1:
        return list(cands)
    out: list[CandidateExamples] = []
    for c in cands:
        m = len(c.target_ids)
        more = [Example(c.prompt_ids, torch.randint(0, vocab, (int(torch.randint(
            max(1, m * 7 // 8), m + 1, (1,), generator=gen)),), generator=gen).tolist())
            for _ in range(k - 1)]
        out.append([c, *more])
    return out


def cand_tokens(c: CandidateExamples) -> int:
    """Tokens of a candidate: its longest (prompt, solution) example."""
    return len(c) if isinstance(c, Example) else max(len(e) for e in c)
