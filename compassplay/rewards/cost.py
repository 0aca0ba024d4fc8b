"""Cost model of a linear layer's per-sample partials: ghost vs materialized.

For a linear layer with input `a` (T, d_in) and output gradient `b` (T, d_out) per sample, the
per-sample weight gradient is `G = b^T a` (d_out, d_in). Both paths need `<G, V>` and `||G||^2`:

* materialize: `G` by one GEMM (2 T d_in d_out flops), then `<G, V>` and `||G||^2` from `G`
  (4 d_in d_out flops; `G` is written and read back twice, `V` read once: 16 d_in d_out bytes);
* ghost: `||G||^2 = sum_{t,t'} (a_t.a_t')(b_t.b_t')` from two Gram matrices (2 T^2 (d_in+d_out)
  flops) and `<G, V> = sum_t b_t . (V a_t)`, or `sum_t a_t . (V^T b_t)` when d_out > d_in
  (2 T d_in d_out flops either way); temporaries are T x T and T x min(d_in, d_out), never
  d_in x d_out.

Either way the arithmetic is at least one weight-sized product per token (the inner product),
the same as the weight gradient of one plain backward; ghost pays T^2 (d_in+d_out) more for the
norm, materialize pays 2 d_in d_out plus the traffic of G. The cheaper (flops plus
`FLOPS_PER_BYTE` times bytes) is chosen per layer and sequence length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FLOPS_PER_BYTE = 32.0
"""How many flops one byte of memory traffic is worth in the comparison. Calibrated on a
2-core AVX-512 CPU at SmolLM2-135M's head (576 -> 49,152, 257 tokens, 8 candidates): the
materialized path took 0.98 s (117 GFLOP, so about 0.58 s of it moving 3.6 GB of G: 6.2 GB/s
against about 290 GFLOP/s, 47 flops per byte); ghost took 0.57 s. Any value between 16 and 49
gives that shape's choices: ghost for the head, materialize for the MLP and attention matrices
(1536 x 576 G, mostly cache-resident). GPUs have 100-200 flops per byte of HBM, so 32 leans
towards materializing there: at 1,024 tokens every Linear of the Qwen2.5-1.5B/7B shapes stays
materialized (the shape of the H200 measurements), at 320 tokens their MLPs, q/o and head go
ghost (not yet timed on a GPU)."""


@dataclass(frozen=True)
class LinearCost:
    """Per-call cost of one linear layer's partials for `n` samples of `t` tokens."""

    n: int
    t: int
    d_in: int
    d_out: int

    @property
    def materialize_flops(self) -> int:
        return self.n * (2 * self.t * self.d_in * self.d_out + 4 * self.d_in * self.d_out)

    @property
    def materialize_bytes(self) -> int:
        return self.n * 16 * self.d_in * self.d_out

    @property
    def ghost_flops(self) -> int:
        t = self.t
        return self.n * (2 * t * t * (self.d_in + self.d_out) + 2 * t * self.d_in * self.d_out
                         + 2 * t * t)

    @property
    def ghost_bytes(self) -> int:
        t = self.t
        narrow = min(self.d_in, self.d_out)
        return self.n * 4 * (3 * t * t + 2 * t * narrow + t * (self.d_in + self.d_out))

    def cost(self, path: str) -> float:
        if path == "ghost":
            return self.ghost_flops + FLOPS_PER_BYTE * self.ghost_bytes
        return self.materialize_flops + FLOPS_PER_BYTE * self.materialize_bytes

    def choose(self, forced: str = "auto") -> str:
        """"ghost" or "materialize": `forced` unless "auto", else the cheaper."""
        if forced in ("ghost", "materialize"):
            return forced
        return "ghost" if self.cost("ghost") < self.cost("materialize") else "materialize"

    def report(self, path: str) -> dict:
        """JSON-ready: the inputs, both paths' flops and bytes, and the path taken."""
        return {**asdict(self), "path": path,
                "ghost_gflop": round(self.ghost_flops / 1e9, 3),
                "ghost_mb": round(self.ghost_bytes / 2**20, 1),
                "materialize_gflop": round(self.materialize_flops / 1e9, 3),
                "materialize_mb": round(self.materialize_bytes / 2**20, 1)}

    def flops(self, path: str) -> int:
        return self.ghost_flops if path == "ghost" else self.materialize_flops
