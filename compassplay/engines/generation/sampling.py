"""Next-token sampling for the HF engine: one draw per row of a [B, V] logits batch, no
per-row Python.

`sample_next` is the rule: greedy (argmax) at temperature 0, else a draw from
softmax(logits / temperature), restricted to the top-p nucleus when top_p < 1. `TokenSampler`
runs the same rule, and the engine's per-token log-probs, in buffers allocated once per
generate call: a decode step's full-vocabulary temporaries (B x 49k floats and doubles, 3-6 MB
each at 16 rows) otherwise come fresh from the allocator at every token, and once glibc
trims them back to the system each token pays their page faults again (5 ms of a 7 ms
sampling step at 16 rows on the 2026-12-06 EPYC, docs/measurements/decode-profile-2026-12-06).
Both give the same tokens and log-probs, bit for bit.

A batch may be some rows of a larger one (`rows`, the engine's unfinished rows after it
dropped the finished ones): the uniforms are still drawn for the whole batch and the rows'
taken, so a row's draws do not depend on which other rows were dropped.
"""

from __future__ import annotations

import torch

TOP_P_CANDIDATES = 1024  # top-p looks among this many most likely tokens first


def draw(probs: torch.Tensor, generator: torch.Generator,
         out: torch.Tensor | None = None, rows: torch.Tensor | None = None,
         batch: int = 0) -> torch.Tensor:
    """One index per row drawn with probability proportional to probs [B, N] (>= 0): inverse
    CDF with one uniform per row (float64 sums), where `torch.multinomial` draws an exponential
    per vocabulary entry (22 ms a step at 16 x 49k on 2 cores). out: a float64 [B, N] buffer
    for the running sums (None: allocated). rows: probs' rows as indices [B] long into a
    batch of `batch` rows, whose uniforms are drawn (None: probs is the batch). -> [B] int64."""
    cum = torch.cumsum(probs, dim=-1, dtype=torch.float64, out=out)
    u = torch.rand((probs.shape[0] if rows is None else batch, 1), generator=generator,
                   device=probs.device, dtype=torch.float64)
    u = (u if rows is None else u[rows]) * cum[:, -1:]
    return torch.searchsorted(cum, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def nucleus_draw(probs: torch.Tensor, top_p: float, generator: torch.Generator,
                 rows: torch.Tensor | None = None, batch: int = 0) -> torch.Tensor:
    """A draw from probs [B, V] restricted to each row's top-p nucleus: the smallest prefix of
    tokens by probability whose mass reaches top_p, looked for among the `TOP_P_CANDIDATES`
    likeliest first (the same nucleus when their mass reaches top_p, which `topk` finds
    without sorting the vocabulary), else in the full sort. rows, batch: see `draw`.
    -> [B] int64."""
    sorted_p, order = probs.topk(min(TOP_P_CANDIDATES, probs.shape[-1]), dim=-1)
    if not bool((sorted_p.sum(dim=-1) >= top_p).all()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    picked = draw(sorted_p.masked_fill(drop, 0.0), generator, rows=rows, batch=batch)
    return order.gather(-1, picked[:, None]).squeeze(-1)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator, rows: torch.Tensor | None = None,
                batch: int = 0) -> torch.Tensor:
    """Draw one token per row. logits: [B, V] float32 -> token ids [B] (int64); see the
    module doc for the rule. rows, batch: see `draw`."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return draw(probs, generator, rows=rows, batch=batch)
    return nucleus_draw(probs, top_p, generator, rows=rows, batch=batch)


class TokenSampler:
    """`sample_next` and log-probs for batches of `rows` x `vocab` float32 logits, reusing
    buffers allocated at construction (one generate call's). The buffers are overwritten by
    the next call: a returned tensor is only the token ids or log-probs, never a buffer.
    A batch of fewer rows (`sample`'s `rows`: which of the `rows` they are) uses the
    buffers' first rows."""

    def __init__(self, rows: int, vocab: int, device: torch.device | str) -> None:
        self.shape = (rows, vocab)
        self._scaled = torch.empty(self.shape, device=device)                  # logits / T
        self._probs = torch.empty(self.shape, device=device)
        self._cum = torch.empty(self.shape, dtype=torch.float64, device=device)
        self._logp = torch.empty(self.shape, device=device)
        self._masked = torch.empty(self.shape, device=device)

    def _fits(self, logits: torch.Tensor) -> bool:
        """Whether logits [A, V] fit the buffers (A <= rows, the same V)."""
        return logits.shape[0] <= self.shape[0] and logits.shape[1] == self.shape[1]

    def masked(self, logits: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """A copy of logits [A, V] with columns `cols` (int64) set to -inf, in a buffer."""
        buf = self._masked[:len(logits)] if self._fits(logits) else torch.empty_like(logits)
        return buf.copy_(logits).index_fill_(-1, cols, float("-inf"))

    def sample(self, logits: torch.Tensor, temperature: float, top_p: float,
               generator: torch.Generator, rows: torch.Tensor | None = None
               ) -> torch.Tensor:
        """`sample_next(logits, temperature, top_p, generator)`: the same tokens [A] int64
        from the same generator state. rows: logits' rows as indices [A] into this sampler's
        `rows` (None: all of them); the uniforms are drawn for all `rows`."""
        batch = self.shape[0]
        if temperature == 0.0 or not self._fits(logits):
            return sample_next(logits, temperature, top_p, generator, rows, batch)
        n = len(logits)
        scaled = logits if temperature == 1.0 else \
            torch.div(logits, temperature, out=self._scaled[:n])  # x / 1.0 == x exactly
        probs = torch.softmax(scaled, dim=-1, out=self._probs[:n])
        if top_p >= 1.0:
            return draw(probs, generator, out=self._cum[:n], rows=rows, batch=batch)
        return nucleus_draw(probs, top_p, generator, rows=rows, batch=batch)

    def logprobs(self, logits: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """log_softmax(logits)[row, tok[row]] -> [A] float32 (the engine's log-prob
        convention: unscaled logits, temperature 1, no top-p)."""
        out = self._logp[:len(logits)] if self._fits(logits) else None
        return torch.log_softmax(logits, dim=-1, out=out).gather(-1, tok[:, None]).squeeze(-1)
