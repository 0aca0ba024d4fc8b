"""The hidden states entering the first scored decoder layer, kept while the layers below it
stay as they were.

A gradient over the top of a transformers decoder-only LM (`scorer.params: last:6` takes the
top 6 of SmolLM2's 30 blocks) needs, below its lowest selected layer k, only the hidden states
entering layer k: the embeddings and layers < k (the prefix) carry no selected parameter. For a
fixed example set (the reference set, scored at every weight version) those hidden states do
not change while the prefix's weights do not, and the learner that trains the same top
(`learner.trainable: last:6`) never changes them. `PrefixCache` computes them once and hands
them back for as long as every prefix tensor is provably unchanged:

- each prefix tensor's autograd version counter (`Tensor._version`) is recorded when the
  states are computed; any in-place write through the tensor (`load_state_dict`'s `copy_`, an
  optimizer step, `p.add_` under `no_grad`) bumps it, and a changed counter means "recompute";
- `unchanged_by(state)` compares a state dict about to be loaded with the prefix exactly
  (`torch.equal`); when it is equal the caller loads it and calls `restamp()`, so a weight
  sync that rewrites the prefix with the same values keeps the states.

A write through `.data` bypasses the counter: code that edits a scored model's prefix that way
must call `invalidate()`. Memory: N x T x hidden of the model's dtype per cached pass (the
reference's 3,101 tokens at SmolLM2's 576: 7 MB in float32; 32 items of 16,446 tokens at a
7B's 3,584 in bf16: 118 MB).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from .batch import Batch, Example, batch_losses, make_batch, plan_batches, scoring_mode

log = logging.getLogger(__name__)


def decoder(model: nn.Module) -> nn.Module | None:
    """The module holding `layers` (a ModuleList) and `embed_tokens`, or None."""
    inner = getattr(model, "model", None)
    if isinstance(getattr(inner, "layers", None), nn.ModuleList) and \
            hasattr(inner, "embed_tokens"):
        return inner
    return None


def lowest_layer_of(model: nn.Module, params: Iterable[nn.Parameter]) -> int:
    """k: how many leading decoder layers (with the embeddings) hold none of `params`. 0 when
    an embedding is among them (tied to a selected head, say) or the model is not a
    transformers decoder-only LM; len(layers) when only the final norm and head are."""
    dec = decoder(model)
    chosen = {id(p) for p in params}
    if dec is None or any(id(p) in chosen for p in dec.embed_tokens.parameters()):
        return 0
    for k, layer in enumerate(dec.layers):
        if any(id(p) in chosen for p in layer.parameters()):
            return k
    return len(dec.layers)


@contextlib.contextmanager
def layers_from(model: nn.Module, k: int, renumber: bool = False) -> Iterator[None]:
    """The model's forward runs only decoder layers k.. (fed `inputs_embeds`). renumber: their
    attention modules take cache slots 0.. (`layer_idx`), so a forward with a KV cache (a
    shared prefix's, `shared_prefix.hidden_after_prefix`) fills the slots the cache's length
    and masks are read from; the indices are restored on exit."""
    dec = decoder(model)
    assert dec is not None, "layers_from needs a transformers decoder-only LM"
    full = dec.layers
    dec.layers = nn.ModuleList(list(full)[k:])
    attn = [getattr(layer, "self_attn", None) for layer in dec.layers] if renumber else []
    idx = [getattr(a, "layer_idx", None) for a in attn]
    for j, a in enumerate(attn):
        if idx[j] is not None:
            a.layer_idx = j
    try:
        yield
    finally:
        dec.layers = full
        for a, i in zip(attn, idx, strict=True):
            if i is not None:
                a.layer_idx = i


class _Reached(Exception):
    """Raised by the capture hook to end a forward at layer k."""


def hidden_entering(model: nn.Module, k: int, batch: Batch) -> torch.Tensor:
    """The hidden states (N, T, hidden) entering decoder layer k (the final norm when k is
    the number of layers) for `batch`, without gradient; layers >= k do not run."""
    return forward_entering(model, k, input_ids=batch.ids, position_ids=batch.position_ids)


def forward_entering(model: nn.Module, k: int, **inputs: torch.Tensor) -> torch.Tensor:
    """`hidden_entering` for any forward inputs (input_ids, attention_mask, position_ids)."""
    dec = decoder(model)
    assert dec is not None and 0 < k <= len(dec.layers)
    target = dec.layers[k] if k < len(dec.layers) else dec.norm
    seen: list[torch.Tensor] = []

    def capture(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).detach())
        raise _Reached

    handle = target.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs, use_cache=False)
    except _Reached:
        pass
    finally:
        handle.remove()
    assert seen, f"decoder layer {k} was not reached by the forward"
    return seen[0]


class PrefixCache:
    """Per pass of a fixed example list, (Batch, hidden states entering layer k), valid while
    the prefix (embeddings and layers < k) is unchanged. k = `lowest_layer_of(model, params)`;
    `enabled` is False when k is 0 (nothing to keep)."""

    def __init__(self, model: nn.Module, params: Iterable[nn.Parameter]) -> None:
        self.model = model
        self.k = lowest_layer_of(model, params)
        dec = decoder(model)
        self.prefix: dict[str, torch.Tensor] = {}
        if self.k:
            assert dec is not None
            below = [dec.embed_tokens, *list(dec.layers)[:self.k]]
            ids = {id(p) for m in below for p in m.parameters()}
            self.prefix = {n: p for n, p in model.named_parameters(remove_duplicate=False)
                           if id(p) in ids}
        self._key: tuple | None = None
        self._stamp: tuple[int, ...] | None = None
        self._passes: list[tuple[Batch, torch.Tensor]] = []
        self.builds = 0  # how many times the states were computed (for tests and logs)

    @property
    def enabled(self) -> bool:
        return self.k > 0

    def _versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.prefix.values())

    def invalidate(self) -> None:
        """Forget the states (the prefix was changed in a way its counters do not show)."""
        self._key, self._stamp, self._passes = None, None, []

    def disable(self) -> None:
        """Keep nothing from now on (k = 0)."""
        self.invalidate()
        self.k, self.prefix = 0, {}

    def unchanged_by(self, state: dict[str, torch.Tensor]) -> bool:
        """Whether loading `state` leaves every prefix tensor's values as they are (a name
        absent from `state` is left as it is by a strict load that accepts the state)."""
        return self._stamp is not None and all(
            torch.equal(state[n].to(p.device, p.dtype), p.detach())
            for n, p in self.prefix.items() if n in state)

    def restamp(self) -> None:
        """After a load that `unchanged_by` approved: the states stay valid."""
        if self._stamp is not None:
            self._stamp = self._versions()

    def passes(self, examples: list[Example], pass_tokens: int, device: torch.device,
               pad_id: int) -> list[tuple[Batch, torch.Tensor]]:
        """(Batch, hidden entering layer k) per pass of `examples` planned at `pass_tokens`:
        the kept ones when the examples, the plan and the prefix are the same, else computed
        now (one forward of the prefix per pass)."""
        key = (tuple((tuple(e.prompt_ids), tuple(e.target_ids)) for e in examples),
               pass_tokens, pad_id, str(device))
        if key == self._key and self._stamp == self._versions():
            return self._passes
        out, start = [], time.perf_counter()
        with scoring_mode(self.model):
            for idx in plan_batches(examples, pass_tokens):
                batch = make_batch([examples[i] for i in idx], idx, device, pad_id)
                out.append((batch, hidden_entering(self.model, self.k, batch)))
        self._key, self._stamp, self._passes = key, self._versions(), out
        self.builds += 1
        log.info("reference states below layer %d computed (%d passes, %.1f s, build %d)",
                 self.k, len(out), time.perf_counter() - start, self.builds)
        return out


# relative and absolute tolerance on a reference loss from a pass's kept states under
# `reference_autocast` (`kept_states_agree`): about 3x the rounding measured
ROUNDING_TOL = 2e-2


def row_ends(batch: Batch) -> list[int]:
    """Each row's length up to its last target token (its last loss-bearing column + 2)."""
    return [int(w.nonzero().max()) + 2 for w in batch.weights]


def shortest_row(kept: tuple[Batch, torch.Tensor]) -> int:
    """The shortest row's length in a kept pass (Batch, states)."""
    return min(row_ends(kept[0]))


def kept_states_agree(model: nn.Module, k: int, batch: Batch, hidden: torch.Tensor,
                      rounds: bool, tol: float = 1e-4) -> bool:
    """Whether a pass's kept states (hidden [rows, T, H] entering layer k) give the plain
    forward's loss, checked on the pass's shortest row (the caller passes the pass holding
    the shortest reference item: one plain forward of 244 tokens for SmolLM2's reference on 2
    cores, 0.8 s, against 4.6 s for the whole first pass). Two claims, each with its own
    tolerance:

    * the top layers need only their input: the row's loss from the states its own forward
      computes equals its plain forward's to `tol` in any numerics (the same kernels on the
      same shapes);
    * the pass's states are this row's: the loss from them agrees to `tol` in float32, and
      to `ROUNDING_TOL` where the passes run under autocast (`rounds`), as a pass of another
      shape rounds otherwise (SmolLM2's shortest item in bfloat16 on a 2-core Zen 4: 1.3367
      from the pass's states, 1.3276 from its own forward, 0.7%).

    A disagreement logs a warning naming the three losses."""
    ends = row_ends(batch)
    j = min(range(batch.size), key=ends.__getitem__)
    n = ends[j]
    batch = Batch(batch.ids[j:j + 1, :n], batch.position_ids[j:j + 1, :n],
                  batch.labels[j:j + 1, :n], batch.weights[j:j + 1, :n], batch.index[j:j + 1])
    hidden = hidden[j:j + 1, :n]
    with scoring_mode(model), torch.no_grad():
        plain = batch_losses(model, batch)
        own = forward_entering(model, k, input_ids=batch.ids, position_ids=batch.position_ids)
        with layers_from(model, k):
            from_own = batch_losses(model, batch, inputs_embeds=own)
            kept = batch_losses(model, batch, inputs_embeds=hidden)
    loose = ROUNDING_TOL if rounds else tol
    if torch.allclose(from_own, plain, rtol=tol, atol=tol) and \
            torch.allclose(kept, plain, rtol=loose, atol=loose):
        return True
    log.warning("reference losses from the kept prefix states %s (from the row's own states "
                "%s) != the plain forward's %s: computing g_ref with the whole model",
                kept.tolist(), from_own.tolist(), plain.tolist())
    return False
