"""A compact Llama/Qwen2 forward for sampling on a preallocated KV cache (CPU and GPU).

The HF module's own forward spends most of a small model's decode step outside its matmuls:
a mask and positions rebuilt per token, a cache grown by concatenation, ~15 modules per block
each with its own Python call. `StaticDecoder` runs the same arithmetic on the module's
weights with one fused matmul for q/k/v and one for gate/up per block, a KV cache allocated
once per call for its whole length, a pad mask built once, and rotary tables computed once by
the model's own `rotary_emb` (so every rope variant the model supports is followed). Rows that
share a prompt prefix have it prefilled once (`prefix_plan`, `start`), and `keep` drops rows
(the engine's finished ones) between decode steps.

Shapes: B rows (left-padded prompts), T prompt width, C = T + new tokens (cache capacity),
H hidden size, nh query heads, nkv key/value heads, d head dim, V vocabulary.
`dtype` (default: the model's) is the weights' and the matmuls' dtype; the residual stream,
norms, the decode steps' attention scores and softmax, and logits stay float32 (with bfloat16
weights the matmuls accumulate in float32 inside oneDNN/cuBLAS and round their outputs to
bfloat16). `dtype_choice.resolve_decode_dtype` picks it from `SamplingSection.decode_dtype`:
on a CPU with native bfloat16 dot products (AVX512-BF16, AMX) bfloat16 weights halve the bytes
a decode step reads and run the matmuls 2-3x faster than float32; on one without, bfloat16 is
emulated and slower, so "auto" measures (once per machine) before it chooses.

`kernels="c"` runs a CPU decode step's work between its matmuls in fused C kernels
(`fused_step`, bfloat16 or float32); `decoder_support` says which models and matmul packings
it serves.

`capture_layer = k` (0 < k < the number of blocks) keeps the residual stream entering block k
at every cache column a prefill or step computes, [B, C, H] float32, which `captured` hands
out per row: the learner that trains only blocks k.. starts its forward from them instead of
running the frozen blocks again (`engines.frozen_states`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compassplay.engines.generation.decoder_support import pack_kind, unsupported_reason
from compassplay.engines.generation.decoder_weights import Block, fused_weights
from compassplay.engines.generation.fused_step import FusedStep, resolve_kernels
from compassplay.engines.generation.prefix_plan import PrefixPlan, plan_prefix
from compassplay.engines.generation.shared_reads import reads_after_keep, reads_after_start


class StaticDecoder:
    """Prefill then one token per call on a KV cache of fixed capacity (see the module doc).

    Call `refresh()` after the model's weights change (the fused copies are rebuilt).
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None,
                 pack: bool = True, kernels: str = "torch", float32_pack: str = "mkl"
                 ) -> None:
        if (why := unsupported_reason(model)) is not None:
            raise ValueError(f"StaticDecoder: {why}")
        cfg = model.config
        self.model = model
        self.dtype = dtype or next(model.parameters()).dtype
        self.nh = cfg.num_attention_heads
        self.nkv = getattr(cfg, "num_key_value_heads", None) or self.nh
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.nh
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.d ** -0.5
        self.blocks: list[Block] = []
        # a float32 decoder packs with `float32_pack` (`dtype_choice.resolve_float32_pack`)
        self.pack = pack_kind(self.dtype, float32_pack) if pack else None
        self._packed: dict[int, dict[int, torch.Tensor]] = {}  # rows -> id(weight) -> pack
        self.share_prefixes = True  # `start` prefills a shared prompt prefix once
        self.prefill_columns = 0  # columns (positions x rows) the last `start` computed
        self.refresh()
        self._t = 0
        kern = resolve_kernels(self, kernels)
        self._fused = FusedStep(self, kern) if kern is not None else None
        self.kernels = "torch" if self._fused is None else "c"
        # a decode step of a few rows: its matmuls as one pass over the weights
        self._small = kern if kern is not None and kern.small_rows else None
        self._small_packed: dict[int, torch.Tensor | None] = {}  # id(weight) -> its layout
        # bfloat16 keys and the kernels' keys are cached transposed (`_alloc`); float32 keys
        # on torch ops keep the [C, d] layout, whose MKL sums their outputs are pinned to
        self.keys_transposed = self.dtype == torch.bfloat16 or self._fused is not None
        self.capture_layer: int | None = None  # keep the states entering this block
        self._states: torch.Tensor | None = None  # [rows, C, H] float32 while capturing

    def set_capture_layer(self, k: int | None) -> None:
        """Keep the hidden states entering block k from the next `start` on (None: none).
        k must be a block index above 0 (block 0's input is the embedding itself)."""
        if k is not None and not 0 < k < len(self.blocks):
            raise ValueError(f"capture_layer {k}: expected 1..{len(self.blocks) - 1}")
        self.capture_layer, self._states = k, None

    def captured(self, row: int, start: int, end: int) -> torch.Tensor:
        """A copy of the kept states of decoder row `row` at cache columns start..end-1,
        [end - start, H] float32 (`capture_layer` must be set)."""
        if self._states is None:
            raise RuntimeError("captured: no states kept (set_capture_layer before start)")
        if not 0 <= start <= end <= self._t:
            raise ValueError(f"captured: columns {start}..{end} outside 0..{self._t}")
        return self._states[row, start:end].clone()

    def weights_fingerprint(self) -> tuple[int, ...]:
        """Changes whenever a parameter is replaced or written in place (load_state_dict, an
        optimizer step on a shared module): each tensor's storage and in-place version."""
        return tuple(x for p in self.model.parameters() for x in (p.data_ptr(), p._version))

    def refresh_if_changed(self) -> bool:
        """`refresh()` when the module's weights changed since the last one (True if so)."""
        if self.weights_fingerprint() == self._fingerprint:
            return False
        self.refresh()
        return True

    def refresh(self) -> None:
        """(Re)build the fused weights from the model's current parameters."""
        self._fingerprint = self.weights_fingerprint()
        self.blocks, self.embed, self.norm, self.head = fused_weights(self.model, self.dtype)
        self._packed = {}
        self._small_packed = {}

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
                ) -> torch.Tensor:
        """x @ w.T + b. A decode step's matmuls (x: [B, 1, K] on CPU) use weights packed once
        for B rows (`pack_kind`): a fraction of `F.linear`'s time at B <= 64, where the
        unpacked kernel re-packs every call (MKL's: the same sums; oneDNN's float32: another
        summation order). With the kernels, a step of at most `small_rows` rows streams the
        weights once instead (`DecodeKernels.small_linear`: float32 up to 32 rows, bfloat16
        up to 32 on AVX512-BF16, from a copy in its layout made once per weight)."""
        rows = x.shape[0]
        if self.pack is None or x.shape[1] != 1 or x.device.type != "cpu":
            return F.linear(x, w, b)
        if self._small is not None and rows <= self._small.small_rows:
            if id(w) not in self._small_packed:
                self._small_packed[id(w)] = self._small.small_weight(w)
            if (sw := self._small_packed[id(w)]) is not None:
                return self._small.small_linear(x.contiguous(), sw, b)
        rows = self._pack_rows(rows)
        packs = self._packed[rows]
        if self.pack == "mkl":
            if (pw := packs.get(id(w))) is None:
                pw = packs[id(w)] = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
            return torch.ops.mkl._mkl_linear(x, pw, w, b, rows)
        if (pw := packs.get(id(w))) is None:
            pw = packs[id(w)] = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        return torch.ops.mkldnn._linear_pointwise(x, pw, b, "none", [], "")

    def decode_matmuls(self, rows: int) -> None:
        """One decode step's matmuls alone at `rows` rows: each block's four (q/k/v, o,
        gate/up, down) and the head, on zero inputs, with the weights packed as a step at
        that row count uses them. What a step costs without its attention and element-wise
        work (`bench generate`'s matmul floor)."""
        dev, dt = self.head.device, self.dtype
        hidden = torch.zeros((rows, 1, self.head.shape[1]), dtype=dt, device=dev)
        heads = torch.zeros((rows, 1, self.nh * self.d), dtype=dt, device=dev)
        mlp = torch.zeros((rows, 1, self.blocks[0].wd.shape[1]), dtype=dt, device=dev) \
            if self.blocks else hidden
        for b in self.blocks:
            self._linear(hidden, b.wqkv, b.bqkv)
            self._linear(heads, b.wo)
            self._linear(hidden, b.wgu)
            self._linear(mlp, b.wd)
        self._linear(hidden, self.head)

    def _pack_rows(self, rows: int) -> int:
        """The row count whose packs serve a `rows`-row matmul; one row count's packs at a
        time (they cost memory). Packs made for more rows serve fewer, so a row count that
        drops after `keep` repacks no weight (0.15-0.25 s in bfloat16, 1 s in float32 for
        SmolLM2-135M on 2 cores): oneDNN's give the same sums as `F.linear`, no slower; MKL's
        `_mkl_linear` runs `F.linear` on the unpacked weight for another row count."""
        held = next(iter(self._packed), None)
        if held is None or rows > held:
            self._packed = {rows: {}}
            return rows
        return held

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMS norm in float32 with the HF modules' own ops, written in the matmul dtype."""
        r = x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device)
        return torch.mul(x * r, weight, out=out)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of float32 x [..., d] (overwritten) -> the matmul dtype; `sin` is
        the signed table of `_alloc` (its first half negated): rotate_half(x) * sin equals
        cat(x2, x1) * signed sin bit for bit."""
        half = x.shape[-1] // 2
        rot = torch.cat((x[..., half:], x[..., :half]), dim=-1)
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device)
        return torch.add(x.mul_(cos), rot.mul_(sin), out=out)

    def start(self, ids: torch.Tensor, pad: torch.Tensor, capacity: int) -> torch.Tensor:
        """Prefill. ids: [B, T] long (left-padded), pad: [B] long (pad count per row),
        capacity: C >= T. Returns the last position's logits [B, V] float32. Equal rows (n
        samples of one prompt) are prefilled once and their cache copied; distinct rows that
        share a long enough prefix prefill it once (`prefix_plan`, `_prefill_shared`). The
        fused decode steps then read those columns from one row (`shared_reads`)."""
        bsz, width = ids.shape
        if capacity < width:
            raise ValueError(f"capacity {capacity} < prompt width {width}")
        dev = ids.device
        uniq, inverse = torch.unique(ids, dim=0, return_inverse=True)
        if len(uniq) == bsz:
            uniq, inverse = ids, None
        upad = pad if inverse is None else \
            torch.zeros(len(uniq), dtype=pad.dtype, device=dev).scatter_(0, inverse, pad)
        valid = self._alloc(len(uniq), upad, capacity, dev)
        self._t = 0
        plan = plan_prefix([r[p:] for r, p in zip(uniq.tolist(), upad.tolist(), strict=True)],
                           width) if self.share_prefixes else None
        if plan is None:
            logits = self._prefill(uniq, upad, valid)
            self.prefill_columns = len(uniq) * width
        else:
            logits = self._prefill_shared(uniq, upad, plan)
            self.prefill_columns = len(uniq) * (width - plan.start) + \
                sum(p.length for p in plan.passes)
        if inverse is not None:
            self._k, self._v = self._k[:, inverse], self._v[:, inverse]
            self._bias, logits = self._bias[inverse], logits[inverse]
            if self._states is not None:
                self._states = self._states[inverse]
        self._pad = pad
        self._reads = reads_after_start(pad.tolist(), width, None if inverse is None
                                        else inverse.tolist(), plan)
        self._t = width
        return logits

    def _prefill(self, ids: torch.Tensor, pad: torch.Tensor, valid: torch.Tensor
                 ) -> torch.Tensor:
        """Every column of every row at once. ids: [U, T], pad: [U], valid: [U, C] bool ->
        last logits [U, V]."""
        width, dev = ids.shape[1], ids.device
        cols = torch.arange(width, device=dev)
        pos = (cols[None, :] - pad[:, None]).clamp(min=0)     # [U, T]
        causal = torch.ones((width, width), dtype=torch.bool, device=dev).tril()
        mask = causal[None] & valid[:, None, :width]            # [U, T, T]
        mask |= torch.eye(width, dtype=torch.bool, device=dev)[None]  # pad rows see themselves
        return self._forward(self.embed[ids].float(), pos, mask[:, None], 0)

    def _prefill_shared(self, ids: torch.Tensor, pad: torch.Tensor, plan: PrefixPlan
                        ) -> torch.Tensor:
        """`plan`'s row-alone passes fill columns before c0 = plan.start (their keys/values
        copied to each member row), then one pass computes columns c0..T-1 of every row,
        attending to the cached columns before it. ids: [U, T], pad: [U] -> logits [U, V].
        Pad columns before c0 keep zero keys/values (masked, as the decode steps mask them)."""
        width, dev, c0 = ids.shape[1], ids.device, plan.start
        pads = pad.tolist()
        for p in plan.passes:
            first = pads[p.source]
            self._prefill_prefix(ids[p.source, first:first + p.length],
                                 [(row, pads[row], n) for row, n in p.members])
        qcols = torch.arange(c0, width, device=dev)               # [S] query columns
        kcols = torch.arange(width, device=dev)                   # [T] key columns
        pos = (qcols[None, :] - pad[:, None]).clamp(min=0)       # [U, S]
        mask = (kcols[None, None, :] >= pad[:, None, None]) & \
            (kcols[None, None, :] <= qcols[None, :, None])       # [U, S, T]: pad_i <= key <= c
        mask |= (kcols[None, :] == qcols[:, None])[None]         # pad columns see themselves
        return self._forward(self.embed[ids[:, c0:]].float(), pos, mask[:, None], c0)

    def _prefill_prefix(self, tokens: torch.Tensor, targets: list[tuple[int, int, int]]
                        ) -> None:
        """Prefill tokens [P] alone (positions 0..P-1) on a scratch cache and copy its first
        n keys/values to each target (row, first column, n) of the cache."""
        n_tok = len(tokens)
        kv = self._cache_tensors(1, n_tok, tokens.device)
        states = None if self._states is None else \
            torch.empty((1, n_tok, self._states.shape[2]), device=tokens.device)
        causal = torch.ones((n_tok, n_tok), dtype=torch.bool, device=tokens.device).tril()
        pos = torch.arange(n_tok, device=tokens.device)[None]
        self._forward(self.embed[tokens][None].float(), pos, causal[None, None], 0, kv=kv,
                      states=states)
        for row, first, n in targets:
            self._key_cols(self._k, row, first, first + n).copy_(
                self._key_cols(kv[0], 0, 0, n))
            self._v[:, row, :, first:first + n] = kv[1][:, 0, :, :n]
            if states is not None:
                self._states[row, first:first + n] = states[0, :n]

    def _key_cols(self, k: torch.Tensor, row: int, start: int, end: int) -> torch.Tensor:
        """A view of cached keys k (`_cache_tensors` layout) of one row at columns
        start..end-1, every block: [L, nkv, d, n] (transposed keys) or [L, nkv, n, d]."""
        return k[:, row, ..., start:end] if self.keys_transposed else \
            k[:, row, :, start:end]

    def _cache_tensors(self, rows: int, capacity: int, dev: torch.device
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `rows` rows of `capacity` columns (see `_alloc`)."""
        kshape = (self.d, capacity) if self.keys_transposed else (capacity, self.d)
        return (torch.zeros((len(self.blocks), rows, self.nkv, *kshape), dtype=self.dtype,
                            device=dev),
                torch.zeros((len(self.blocks), rows, self.nkv, capacity, self.d),
                            dtype=self.dtype, device=dev))

    def _alloc(self, rows: int, pad: torch.Tensor, capacity: int, dev: torch.device
               ) -> torch.Tensor:
        """The KV cache (values [L, rows, nkv, C, d], keys the same or, with
        `keys_transposed`, [L, rows, nkv, d, C]), the decode steps' additive key mask and the
        rotary tables [C, d]. Returns the keys that are not pads, [rows, C] bool. Transposed
        keys: a bfloat16 decode step's `q @ K^T` reads [d, t] slices with contiguous rows,
        which the batched matmul copies at half the cost of a transposed [t, d] slice (the
        same sums, bit for bit)."""
        self._k, self._v = self._cache_tensors(rows, capacity, dev)
        self._states = None if self.capture_layer is None else torch.empty(
            (rows, capacity, self.embed.shape[1]), device=dev)
        cols = torch.arange(capacity, device=dev)
        valid = cols[None, :] >= pad[:, None]
        self._bias = torch.zeros((rows, 1, 1, capacity), device=dev
                                 ).masked_fill_(~valid[:, None, None], float("-inf"))
        cos, sin = self.model.model.rotary_emb(self.embed[:1, None, :].float(), cols[None])
        self._cos, sin = cos[0].float(), sin[0].float()
        half = sin.shape[-1] // 2
        self._sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # signed (`_rope`)
        return valid

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Append one token per row. tok: [B] long -> next logits [B, V] float32."""
        t = self._t
        if t >= self._v.shape[3]:
            raise ValueError(f"the KV cache is full ({t} positions)")
        if self._fused is not None:
            logits = self._fused(tok, t)
        else:
            x = self.embed[tok][:, None, :].float()
            pos = (t - self._pad)[:, None]
            logits = self._forward(x, pos, self._bias[..., :t + 1], t)
        self._t = t + 1
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the current rows `rows` ([A] long, in their new order) for the next
        steps: the cache's columns written so far, the key mask and the pad counts. Columns
        from the next one on are left uninitialised (each step writes its column before it
        reads it)."""
        t = self._t
        k, v = self._k, self._v
        self._k, self._v = torch.empty_like(k[:, :len(rows)]), torch.empty_like(v[:, :len(rows)])
        for j, r in enumerate(rows.tolist()):
            self._key_cols(self._k, j, 0, t).copy_(self._key_cols(k, r, 0, t))
            self._v[:, j, :, :t] = v[:, r, :, :t]
        self._bias = self._bias.index_select(0, rows)
        self._pad = self._pad.index_select(0, rows)
        self._reads = reads_after_keep(self._reads, rows.tolist())
        if self._states is not None:
            self._states = self._states.index_select(0, rows)

    def _keys(self, kc: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """A view of one block's cached keys kc at columns start..end-1 as K^T
        [B, nkv, d, n]."""
        return kc[..., start:end] if self.keys_transposed else \
            kc[:, :, start:end].transpose(-1, -2)

    def _forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 t0: int, kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                 states: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, S, H] float32 at cache columns t0..t0+S-1, pos: [B, S] positions,
        mask: [B, 1, S, t0+S] bool (True = attend) for a prefill (from t0 > 0 the queries
        attend to the cached columns 0..t0+S-1), an additive [B, 1, 1, t0+1] (0 or -inf) for
        a decode step. kv: the cache (keys, values) written and read (None: the
        decoder's). states: where block `capture_layer`'s input goes at columns t0.. (None:
        the decoder's own `_states` when kv is None). x is updated in place (the callers pass
        fresh embedding rows). Returns logits of the last column."""
        bsz, seq, _ = x.shape
        nh, nkv, d = self.nh, self.nkv, self.d
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]  # [B, 1, S, d]
        end = t0 + seq
        group = nh // nkv
        nqk = nh + nkv
        keys, values = kv if kv is not None else (self._k, self._v)
        if states is None and kv is None:
            states = self._states
        if seq == 1 and mask.dtype == torch.bool:  # a one-column prefill: the additive form
            mask = torch.zeros(mask.shape, device=x.device).masked_fill_(~mask, float("-inf"))
        for i, b in enumerate(self.blocks):
            if i == self.capture_layer and states is not None:
                states[:, t0:end] = x
            h = self._rms(x, b.ln1)
            qkv = self._linear(h, b.wqkv, b.bqkv).view(bsz, seq, nqk + nkv, d).transpose(1, 2)
            qk = self._rope(qkv[:, :nqk].float(), cos, sin)  # [B, nh+nkv, S, d]
            kc, vc = keys[i], values[i]  # [B, nkv, C, d] (keys maybe [B, nkv, d, C])
            self._keys(kc, t0, end).copy_(qk[:, nh:].transpose(-1, -2))
            vc[:, :, t0:end] = qkv[:, nqk:]
            if seq == 1:  # decode: a group's queries as rows against its one KV head
                q = qk[:, :nh].reshape(bsz, nkv, group, d)
                # mask + scale * (q K^T) in float32, equal bit for bit to scaling then adding
                scores = torch.add(mask, torch.matmul(q, self._keys(kc, 0, end)),
                                   alpha=self.scale)
                att = torch.matmul(torch.softmax(scores, dim=-1).to(self.dtype),
                                   vc[:, :, :end])
            elif t0 == 0:  # a prefill: this call's keys and values are the whole cache
                att = F.scaled_dot_product_attention(qk[:, :nh], qk[:, nh:], qkv[:, nqk:],
                                                     attn_mask=mask, enable_gqa=group > 1)
            else:  # a prefill's later columns: against the cache's columns 0..end-1, copied
                # contiguous (SDPA on the strided views takes 2-3x as long on CPU)
                att = F.scaled_dot_product_attention(
                    qk[:, :nh], self._keys(kc, 0, end).transpose(-1, -2).contiguous(),
                    vc[:, :, :end].contiguous(), attn_mask=mask, enable_gqa=group > 1)
            att = att.reshape(bsz, nh, seq, d).transpose(1, 2).reshape(bsz, seq, nh * d)
            x.add_(self._linear(att, b.wo))  # float32 += (exactly upcast) matmul output
            h = self._rms(x, b.ln2)
            gate, up = self._linear(h, b.wgu).chunk(2, dim=-1)
            x.add_(self._linear(F.silu(gate).mul_(up), b.wd))
        h = self._rms(x[:, -1:], self.norm)
        return self._linear(h, self.head)[:, 0].float()
