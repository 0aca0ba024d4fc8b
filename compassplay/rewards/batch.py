"""Padding candidates into micro-batches and the per-example loss they define.

An example's loss is the mean token cross-entropy (nats) of `target_ids` given `prompt_ids`
under teacher forcing, using the model's own next-token logits. A candidate with several
verified solutions (`Solutions`) has the mean of its solutions' example losses as its loss, so
its gradient is the mean of the per-solution gradients.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Example:
    """One (prompt, verified target) pair of token ids. Both must be non-empty."""

    prompt_ids: list[int]
    target_ids: list[int]

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("Example.prompt_ids must be non-empty (the first target token "
                             "needs a preceding position to be predicted from)")
        if len(self.target_ids) == 0:
            raise ValueError("Example.target_ids must be non-empty")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.target_ids)


@dataclass(frozen=True)
class Solutions:
    """One candidate: distinct (prompt, solution) examples and their weights (summing to 1).

    The candidate's loss is `sum_j weights[j] * loss(examples[j])`: the mean over its verified
    solutions of each solution's mean token cross-entropy, identical solutions merged into one
    example whose weight counts them (`solution_sets`), so its gradient is the mean of the
    per-solution gradients."""

    examples: tuple[Example, ...]
    weights: tuple[float, ...]

    @property
    def k(self) -> int:
        """Distinct solutions (rows of a micro-batch)."""
        return len(self.examples)

    @property
    def width(self) -> int:
        """Tokens of the longest (prompt, solution) example."""
        return max(len(e) for e in self.examples)


CandidateExamples = Example | Sequence[Example]
"""What the scorer scores: one example (one verified solution), or the examples of one
candidate's verified solutions (its loss: their mean loss; repeats count as often as listed)."""


def solution_sets(cands: Sequence[CandidateExamples | Solutions]) -> list[Solutions]:
    """Each candidate as `Solutions` (kept as is when it is one): identical examples merged
    (weight = count / listed), in first-appearance order. No example is a ValueError."""
    out = []
    for c in cands:
        if isinstance(c, Solutions):
            out.append(c)
            continue
        exs = [c] if isinstance(c, Example) else list(c)
        if not exs:
            raise ValueError("a candidate needs at least one verified solution (Example)")
        count: dict[tuple, int] = {}
        first: dict[tuple, Example] = {}
        for e in exs:
            key = (tuple(e.prompt_ids), tuple(e.target_ids))
            count[key] = count.get(key, 0) + 1
            first.setdefault(key, e)
        out.append(Solutions(tuple(first.values()),
                             tuple(n / len(exs) for n in count.values())))
    return out


@dataclass
class Batch:
    """Right-padded micro-batch. Shapes: ids/position_ids/labels/weights (N, T).

    `labels[n, t]` is the token predicted at position t (-100 where no loss), `weights[n, t]` is
    `w_n / len(target_n)` at target-predicting positions and 0 elsewhere (`w_n` = 1, or the
    row's weight in its candidate), so `sum_t weights * ce` is the row's (weighted) mean token
    cross-entropy. `index`: the example (or candidate) index of each row, or of each candidate
    when `slots` is set. `slots` (C, K) int64: the rows of candidate c (-1: none; K = the most
    rows of a candidate), None when every row is its own candidate.
    """

    ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    index: list[int]
    slots: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Rows N."""
        return int(self.ids.shape[0])

    @property
    def candidates(self) -> int:
        """Candidates C (= N without `slots`)."""
        return self.size if self.slots is None else int(self.slots.shape[0])


def make_batch(examples: list[Example], index: list[int], device: torch.device,
               pad_id: int = 0, row_weights: list[float] | None = None) -> Batch:
    """Right-pad `examples` (no attention mask is needed: causal attention never lets a real
    token see a later pad, and pads carry no loss, so their gradients are exactly zero).
    `row_weights`: each row's loss weight (default 1)."""
    n, t = len(examples), max(len(e) for e in examples)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    labels = torch.full((n, t), -100, dtype=torch.long)
    weights = torch.zeros((n, t), dtype=torch.float32)
    for i, ex in enumerate(examples):
        p, m = len(ex.prompt_ids), len(ex.target_ids)
        w = 1.0 if row_weights is None else row_weights[i]
        ids[i, : p + m] = torch.tensor(list(ex.prompt_ids) + list(ex.target_ids))
        labels[i, p - 1 : p + m - 1] = torch.tensor(list(ex.target_ids))
        weights[i, p - 1 : p + m - 1] = w / m
    pos = torch.arange(t).unsqueeze(0).expand(n, t).contiguous()
    return Batch(ids.to(device), pos.to(device), labels.to(device), weights.to(device), index)


def make_solutions_batch(cands: list[Solutions], index: list[int], device: torch.device,
                         pad_id: int = 0) -> Batch:
    """One micro-batch holding every row of `cands` (candidate-major: candidate c's solutions
    are consecutive rows), row weights `weights[j]` so that the summed row losses are the sum
    of the candidates' losses; `slots` maps each candidate to its rows (None when every
    candidate has one row)."""
    rows = [e for c in cands for e in c.examples]
    batch = make_batch(rows, index, device, pad_id, [w for c in cands for w in c.weights])
    k = max(c.k for c in cands)
    if k > 1:
        slots = torch.full((len(cands), k), -1, dtype=torch.long)
        start = 0
        for i, c in enumerate(cands):
            slots[i, : c.k] = torch.arange(start, start + c.k)
            start += c.k
        batch.slots = slots.to(device)
    return batch


def plan_batches(examples: list[Example], max_tokens: int) -> list[list[int]]:
    """Group example indices (sorted by length) into micro-batches of at most `max_tokens`
    padded tokens (a single over-long example gets its own batch)."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = len(examples[cur[0]]) if cur else len(examples[i])
        if cur and (len(cur) + 1) * width > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def plan_solution_batches(cands: list[Solutions], max_tokens: int) -> list[list[int]]:
    """Group candidate indices into micro-batches of at most `max_tokens` tokens counted as
    candidates x most rows of a candidate x longest row (what both the padded forward and the
    per-candidate regrouped layer tensors hold); a candidate over the bound gets its own batch.
    Sorted by (rows, length), descending, so a batch's candidates mostly have as many rows;
    with one row each this is `plan_batches`."""
    order = sorted(range(len(cands)), key=lambda i: (-cands[i].k, -cands[i].width))
    groups: list[list[int]] = []
    cur: list[int] = []
    k = width = 0
    for i in order:
        nk, nw = max(k, cands[i].k), max(width, cands[i].width)
        if cur and (len(cur) + 1) * nk * nw > max_tokens:
            groups.append(cur)
            cur, nk, nw = [], cands[i].k, cands[i].width
        cur.append(i)
        k, width = nk, nw
    if cur:
        groups.append(cur)
    return groups


# architectures whose logits are their output embedding applied to the base model's last
# hidden state (no scaling or soft-capping): only the positions that count need the head
HEAD_ON_HIDDEN_TYPES = ("llama", "qwen2", "gpt2")


def batch_losses(model: torch.nn.Module, batch: Batch, all_logits: bool = False,
                 inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """Per-example mean token cross-entropy, shape (N,), float32, differentiable.
    `inputs_embeds` (N, T, hidden): fed instead of `batch.ids` (`rewards.fixed_set_loss`).

    Prompt positions, padding and the positions after a row's target carry no loss, so their
    logits change no loss and no gradient. Where the vocabulary head is frozen in this pass
    and acts on the base model's hidden states (`packs_head`), only the loss-bearing
    positions of every row, packed together ([L, hidden], L = the batch's target tokens), go
    through the head and its log-softmax. Elsewhere a model whose forward takes
    `logits_to_keep` (transformers' causal LMs) computes the head from the batch's first
    loss-bearing column on ([N, keep, V]; a trainable head's per-sample products need its
    rows by example). Either saves most of the head's forward and backward (a 49k-152k
    vocabulary head is 15-25% of a small model's work; SmolLM2's reference set: 1,879 target
    tokens in 3,101). `all_logits`: every position's logits (the oracle's plain loss)."""
    if not all_logits and packs_head(model):
        return _packed_losses(model, batch, inputs_embeds)
    keep = None if all_logits else _kept_columns(model, batch)
    kwargs = {} if keep is None else {"logits_to_keep": keep}
    if inputs_embeds is None:
        kwargs["input_ids"] = batch.ids
    else:
        kwargs["inputs_embeds"] = inputs_embeds
    out = model(position_ids=batch.position_ids, use_cache=False, **kwargs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    n, t, v = logits.shape
    labels, weights = batch.labels[:, -t:], batch.weights[:, -t:]
    ce = F.cross_entropy(logits.float().reshape(n * t, v), labels.reshape(n * t),
                         ignore_index=-100, reduction="none").view(n, t)
    return (ce * weights).sum(1)


def packs_head(model: torch.nn.Module) -> bool:
    """Whether `batch_losses` runs `model`'s head on the loss-bearing positions only: a
    transformers model of `HEAD_ON_HIDDEN_TYPES` whose output embedding takes no gradient now
    (it is not among the scored parameters: `grads_only_for`, or frozen; or grad is off)."""
    from transformers import PreTrainedModel  # lazy: the package's light users skip it

    if not isinstance(model, PreTrainedModel) or \
            getattr(model.config, "model_type", None) not in HEAD_ON_HIDDEN_TYPES:
        return False
    head = model.get_output_embeddings()
    return head is not None and (not torch.is_grad_enabled()
                                 or not any(p.requires_grad for p in head.parameters()))


def _packed_losses(model: torch.nn.Module, batch: Batch,
                   inputs_embeds: torch.Tensor | None) -> torch.Tensor:
    """`batch_losses` with the head on the loss-bearing positions only, packed: (N,)."""
    inputs = {"input_ids": batch.ids} if inputs_embeds is None else \
        {"inputs_embeds": inputs_embeds}
    hidden = model.base_model(position_ids=batch.position_ids, use_cache=False,
                              **inputs).last_hidden_state                     # [N, T, H]
    used = batch.weights != 0                                                  # [N, T]
    head = model.get_output_embeddings()
    rows = hidden[used]                                                        # [L, H]
    ce = F.cross_entropy(head(rows).float(), batch.labels[used], ignore_index=-100,
                         reduction="none")                                     # [L]
    owner = used.nonzero()[:, 0]                                               # [L] row of each
    out = torch.zeros(batch.size, dtype=ce.dtype, device=ce.device)
    return out.index_add(0, owner, ce * batch.weights[used])


def _kept_columns(model: torch.nn.Module, batch: Batch) -> int | None:
    """How many trailing positions hold every loss-bearing one (None: keep all, or the model
    cannot drop logits)."""
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return None
    used = (batch.weights != 0).any(0).nonzero()
    width = batch.ids.shape[1]
    keep = width - int(used[0]) if used.numel() else width
    return keep if 0 < keep < width else None


def mean_example_loss(model: torch.nn.Module, examples: list[Example], pad_id: int = 0,
                      max_batch_tokens: int = 4096) -> float:
    """Mean over `examples` of their mean token cross-entropy (nats), without gradient, in
    micro-batches of at most `max_batch_tokens` padded tokens (the logits of a 49k vocabulary
    make one padded batch of 32 long examples gigabytes), in eval mode. 0.0 for none."""
    if not examples:
        return 0.0
    dev = next(model.parameters()).device
    total = 0.0
    with scoring_mode(model), torch.no_grad():  # eval mode: no dropout
        for index in plan_batches(examples, max_batch_tokens):
            batch = make_batch([examples[i] for i in index], index, dev, pad_id)
            total += float(batch_losses(model, batch).sum())
    return total / len(examples)


def example_loss(model: torch.nn.Module, example: Example,
                 all_logits: bool = False) -> torch.Tensor:
    """Scalar loss of one example, computed unpadded (batch of one)."""
    dev = next(model.parameters()).device
    return batch_losses(model, make_batch([example], [0], dev), all_logits)[0]


@contextlib.contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and grad enabled; restores every module's training flag."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.enable_grad():
            yield
    finally:
        for m, t in flags:
            m.training = t
