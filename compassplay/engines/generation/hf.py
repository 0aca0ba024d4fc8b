"""HF transformers generation engine (CPU and GPU): left-padded batches, KV-cache sampling loop.

Two decoders run the model. "static" (the default on CPU, for Llama and Qwen2 modules):
`engines.generation.static_decoder`, the same arithmetic on the module's weights with a preallocated KV
cache, fused matmuls and, on CPU, MKL-packed weights for the decode steps (greedy outputs equal
the "hf" decoder's; docs/measurements/generation-speed-2026-12-03). "hf": the module's own
forward with its dynamic cache, for every other architecture (and `decoder="hf"`). With the
static decoder, rows that finished are dropped from the cache during a call (`_should_compact`);
a row's draws do not depend on it (`sampling`).

Per-token log-probs follow the convention in `compassplay.engines.generation.base` (unscaled logits,
temperature 1, no top-p). Sampling draws from a `torch.Generator` seeded by
`SamplingParams.seed`, so equal seeds on the same device give equal completions.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from typing import Any

import torch

from compassplay.engines.dtype_choice import resolve_decoding
from compassplay.engines.frozen_states import states_key, states_positions
from compassplay.engines.generation.base import GenerationEngine, SamplingParams, check_version
from compassplay.engines.generation.decoder_support import unsupported_reason
from compassplay.engines.generation.sampling import TokenSampler
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.engines.generation.templating import TemplateCursor
from compassplay.records import Generation

log = logging.getLogger(__name__)


def kv_cache_of(out: Any) -> Any:
    """The KV cache of a forward output (`cache` in transformers >= 5.x, else past_key_values)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def cache_arg(model: torch.nn.Module) -> str:
    """The forward keyword that takes a KV cache: `cache` (transformers 5.x) or past_key_values."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"


class ModuleDecoder:
    """The module's own forward with its dynamic cache, behind `StaticDecoder`'s interface:
    `start(ids, pad, capacity)` -> logits [B, V], then `step(tok)` -> logits [B, V]."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._cache_arg = cache_arg(model)
        # the prefill needs only the last position's logits: a 49k vocabulary head over every
        # prompt position of a 48-prompt batch is ~20% of its work and gigabytes of logits
        self._prefill_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in \
            inspect.signature(model.forward).parameters else {}

    def refresh_if_changed(self) -> bool:
        return False  # runs on the module itself

    def start(self, ids: torch.Tensor, pad: torch.Tensor, capacity: int) -> torch.Tensor:
        cols = torch.arange(ids.shape[1], device=ids.device)
        self._mask = (cols[None, :] >= pad[:, None]).long()
        self._pos = (self._mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=self._mask, position_ids=self._pos,
                         use_cache=True, **self._prefill_kwargs)
        self._cache = kv_cache_of(out)
        return out.logits[:, -1, :].float()

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        ones = torch.ones((len(tok), 1), dtype=self._mask.dtype, device=tok.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        self._pos = self._pos[:, -1:] + 1
        out = self.model(input_ids=tok[:, None], attention_mask=self._mask,
                         position_ids=self._pos, use_cache=True,
                         **{self._cache_arg: self._cache})
        self._cache = kv_cache_of(out)
        return out.logits[:, -1, :].float()


DECODERS = ("auto", "static", "hf")
COMPACT_MIN_ROWS = 1    # finished rows that make dropping them worth a cache copy
COMPACT_MIN_STEPS = 8   # tokens an unfinished row may still need, for the same


class HFGenerationEngine(GenerationEngine):
    """Generation with a `transformers` causal LM on its device (run in eval mode).

    `pad_token_id`/`eos_token_id` default to the tokenizer's. EOS ends a completion (the EOS
    token is kept in `completion_ids`, finish_reason "stop"); so does a stop string;
    reaching `max_new_tokens` gives finish_reason "length". `text` decodes `completion_ids`
    without special tokens and so includes a matched stop string.
    decoder: "auto" (the default: "static" for a supported architecture on CPU, else "hf";
    on a GPU the fused weight copies would cost memory the memory plan does not reserve, and
    the GPU configs generate with vLLM), "static" (`StaticDecoder` on any device, "hf" with a
    log line where the architecture is not supported) or "hf" (`ModuleDecoder`).
    decode_dtype: the static decoder's matmul dtype, "model" (the weights' own, the default),
    "bfloat16", or "auto" (bfloat16 where this CPU runs it faster: `resolve_decode_dtype`);
    `self.decode_dtype` names the one in use.
    A float32 static decoder on CPU packs its decode matmuls as `resolve_float32_pack`
    measured fastest on this machine (MKL or oneDNN).
    decode_kernels: "auto" (the default: a bfloat16 or float32 static decoder on CPU runs its
    decode steps' non-matmul work in `decode_kernels`, where the library builds), "c" (the
    same, an error where it cannot) or "torch" (torch ops); `self.decode_kernels` names the
    one in use.
    capture_layer: keep the hidden states entering this block for every sampled sequence
    (`engines.frozen_states`), where the static decoder runs (None: keep none);
    `take_states()` hands them out. `self.capture_layer` is the one in force (None where the
    decoder cannot).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, pad_token_id: int | None = None,
                 eos_token_id: int | list[int] | None = None, weight_version: int = 0,
                 decoder: str = "auto", decode_dtype: str = "model",
                 decode_kernels: str = "auto", capture_layer: int | None = None) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"decoder: unknown decoder {decoder!r} (expected one of "
                             f"{DECODERS})")
        self.model = model
        self.tokenizer = tokenizer
        pad = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
        eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            pad = eos if isinstance(eos, int) else 0
        self.pad_token_id = int(pad)
        eos_list = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list)
                                                             else [eos])]
        self.eos_token_ids = set(eos_list)
        self.template_eos = eos_list[0] if eos_list else None  # forced after a template
        self.compact = True  # drop finished rows from a decoder that can (`_should_compact`)
        self._version = weight_version
        self._lock = threading.RLock()
        on_cpu = next(model.parameters()).device.type == "cpu"
        if decoder == "auto":
            decoder = "static" if on_cpu and unsupported_reason(model) is None else "hf"
        why = unsupported_reason(model) if decoder == "static" else None
        if why is not None:
            log.info("generation: the static decoder cannot run this model (%s); using the "
                     "module's own forward", why)
        if decoder == "static" and why is None:
            # a float32 decoder packs its matmuls as measured fastest on this machine
            dtype, pack = resolve_decoding(decode_dtype, model)
            self._decoder: StaticDecoder | ModuleDecoder = StaticDecoder(
                model, dtype=dtype, kernels=decode_kernels, float32_pack=pack)
        else:
            if decode_dtype != "model":
                log.info("generation: decode_dtype=%s applies to the static decoder only; "
                         "the module's forward runs in its own dtype", decode_dtype)
            self._decoder = ModuleDecoder(model)
        self.decoder = "static" if isinstance(self._decoder, StaticDecoder) else "hf"
        self.decode_kernels = self._decoder.kernels \
            if isinstance(self._decoder, StaticDecoder) else "torch"
        if self.decode_kernels == "c":
            log.info("generation: decode steps between the matmuls on the fused C kernels (%s)",
                     self._decoder._fused.kern.path)  # type: ignore[union-attr]
        self.decode_dtype = str(self._decoder.dtype).removeprefix("torch.") \
            if isinstance(self._decoder, StaticDecoder) else \
            str(next(model.parameters()).dtype).removeprefix("torch.")
        self.capture_layer = self._capture(capture_layer)
        self._captured: dict[str, torch.Tensor] = {}

    def _capture(self, k: int | None) -> int | None:
        """The block whose input states this engine keeps: `k` where the static decoder
        computes them (its float32 residual stream, with float32 or bfloat16 matmuls), else
        None (logged)."""
        if k is None:
            return None
        dec = self.static_decoder
        if dec is None:
            log.info("generation: no frozen states for the learner (the %s decoder keeps none; "
                     "the static decoder does)", self.decoder)
            return None
        dec.set_capture_layer(k)
        return k

    def take_states(self) -> dict[str, torch.Tensor]:
        """The states kept since the last call, by `frozen_states.states_key` of each
        sampled sequence ([prompt + completion - 1, H] float32); empty when none are kept."""
        out, self._captured = self._captured, {}
        return out

    @property
    def static_decoder(self) -> StaticDecoder | None:
        """The static decoder this engine samples with (None: the module's own forward)."""
        return self._decoder if isinstance(self._decoder, StaticDecoder) else None

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy `state` (HF names, any device) into the model; waits for a running generate."""
        with self._lock:
            check_version(self._version, version)
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
            missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
            if missing or unexpected:
                raise KeyError(f"weight names do not match the model: missing={missing[:5]} "
                               f"unexpected={unexpected[:5]}")
            self._version = version

    def _cursor(self, params: SamplingParams) -> TemplateCursor:
        return TemplateCursor(params.template,
                              lambda s: self.tokenizer.encode(s, add_special_tokens=False),
                              lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                              self.template_eos)

    def _stopped(self, ids: list[int], stop: list[str]) -> bool:
        """Whether the newest token completes a stop string. Checked after every token, so
        only a tail window is decoded (4 tokens per stop character covers partial bytes)."""
        if not stop:
            return False
        window = 4 * max(len(s) for s in stop) + 4
        text = self.tokenizer.decode(ids[-window:], skip_special_tokens=True)
        return any(s and s in text for s in stop)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self._generate_rows(prompts, [params] * len(prompts))

    def generate_each(self, prompts: list[list[int]], params: list[SamplingParams]
                      ) -> list[Generation]:
        """Rows whose SamplingParams differ only in template, seed and length cap (each a
        template's own) are sampled in one batch: each row follows its own template and cap,
        and the draws come from one generator seeded by the first row's seed. Others: one
        call per distinct SamplingParams."""
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        if not params:
            return []
        head = params[0]
        same = all(dataclasses.replace(p, template=head.template, seed=head.seed,
                                       max_new_tokens=head.max_new_tokens) == head
                   for p in params)
        if not same or any(bool(p.template) != bool(head.template) for p in params):
            return super().generate_each(prompts, params)
        return self._generate_rows(prompts, params)

    @torch.no_grad()
    def _generate_rows(self, prompts: list[list[int]], params: list[SamplingParams]
                       ) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        with self._lock:
            version = self._version
            was_training = self.model.training  # the learner may share this module
            self.model.eval()
            try:
                outs, reasons = self._sample(prompts, params)
            finally:
                self.model.train(was_training)
        gens = []
        for prompt, (ids, lps), reason in zip(prompts, outs, reasons, strict=True):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(Generation(prompt_ids=list(prompt), completion_ids=ids, logprobs=lps,
                                   text=text, weight_version=version, finish_reason=reason))
        return gens

    def _sample(self, prompts: list[list[int]], rows: list[SamplingParams]
                ) -> tuple[list[tuple[list[int], list[float]]], list[str]]:
        """The KV-cache loop: row i under rows[i] (equal but for template, seed and cap; the
        first row's seed seeds the draws). Returns per prompt (completion ids, log-probs) and
        finish reasons. A decoder with `keep` (the static one) drops finished rows
        (`_should_compact`); `act` maps its rows to the prompts' indices."""
        params = rows[0]
        caps = [p.max_new_tokens for p in rows]
        longest = max(caps)
        dev = self.device
        bsz, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((bsz, width), self.pad_token_id, dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        pad = torch.tensor([width - len(p) for p in prompts], dtype=torch.long)
        ids, pad = ids.to(dev), pad.to(dev)
        gen = torch.Generator(device=dev)
        gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        comp: list[list[int]] = [[] for _ in range(bsz)]
        lps: list[list[float]] = [[] for _ in range(bsz)]
        reasons = ["length"] * bsz
        done = [False] * bsz
        cursors = [self._cursor(p) for p in rows] if params.template else None
        dec = self._decoder
        dec.refresh_if_changed()
        logits = dec.start(ids, pad, width + longest)
        sampler = TokenSampler(bsz, logits.shape[-1], dev)
        act = list(range(bsz))  # the decoder's rows, as prompt indices
        for step in range(longest):
            tok = self._pick(logits, sampler, cursors, act, params, gen)
            logp = sampler.logprobs(logits, tok)
            tok_l, logp_l = tok.tolist(), logp.tolist()
            for j, i in enumerate(act):
                if done[i]:
                    continue
                comp[i].append(tok_l[j])
                lps[i].append(logp_l[j])
                if cursors is not None:
                    cursors[i].advance(comp[i])
                    if cursors[i].finished:
                        done[i], reasons[i] = True, "stop"
                elif tok_l[j] in self.eos_token_ids or self._stopped(comp[i], params.stop):
                    done[i], reasons[i] = True, "stop"
                if not done[i] and len(comp[i]) >= caps[i]:
                    done[i] = True  # reason stays "length"
            if all(done) or step == longest - 1:
                break
            if self._should_compact(act, done, comp, caps):
                keep = [j for j, i in enumerate(act) if not done[i]]
                self._keep_states(prompts, comp, act, width, [j for j, i in enumerate(act)
                                                              if done[i]])
                dec.keep(torch.tensor(keep, dtype=torch.long, device=dev))
                act, tok_l = [act[j] for j in keep], [tok_l[j] for j in keep]
            nxt = torch.tensor([self.pad_token_id if done[i] else t for i, t in zip(act, tok_l,
                                                                                  strict=True)],
                               dtype=torch.long, device=dev)
            logits = dec.step(nxt)
        self._keep_states(prompts, comp, act, width, range(len(act)))
        return list(zip(comp, lps, strict=True)), reasons

    def _keep_states(self, prompts: list[list[int]], comp: list[list[int]], act: list[int],
                     width: int, rows) -> None:
        """Take decoder rows `rows` (prompt indices `act[j]`) out of the capture buffer: a
        prompt sits at columns width - P .. width - 1 and completion token j at width + j, so
        a sequence's states are columns width - P .. width + C - 2."""
        if self.capture_layer is None:
            return
        dec = self._decoder
        for j in rows:  # on the CPU, as the object store carries them to the learner
            i = act[j]
            first = width - len(prompts[i])
            self._captured[states_key(prompts[i], comp[i])] = dec.captured(
                j, first, first + states_positions(prompts[i], comp[i])).cpu()

    def _pick(self, logits: torch.Tensor, sampler: TokenSampler,
              cursors: list[TemplateCursor] | None, act: list[int], params: SamplingParams,
              gen: torch.Generator) -> torch.Tensor:
        """The next token of each decoder row (logits [A, V] of prompts `act`) -> [A] long.
        Templated: no end-of-sequence inside a segment, and forced tokens override."""
        dev = logits.device
        sel = None if len(act) == sampler.shape[0] else \
            torch.tensor(act, dtype=torch.long, device=dev)
        if cursors is None:
            return sampler.sample(logits, params.temperature, params.top_p, gen, sel)
        eos_cols = torch.tensor(sorted(self.eos_token_ids), dtype=torch.long, device=dev)
        masked = sampler.masked(logits, eos_cols)
        for j, i in enumerate(act):
            if ban := cursors[i].banned():
                masked[j, ban] = float("-inf")
        tok = sampler.sample(masked, params.temperature, params.top_p, gen, sel)
        forced = [(j, f) for j, i in enumerate(act) if (f := cursors[i].forced()) is not None]
        if forced:
            at, forced_ids = zip(*forced, strict=True)
            tok[list(at)] = torch.tensor(forced_ids, dtype=tok.dtype, device=dev)
        return tok

    def _should_compact(self, act: list[int], done: list[bool], comp: list[list[int]],
                        caps: list[int]) -> bool:
        """Whether to drop the finished rows from the decoder now: it can (`keep`), at least
        a quarter of its rows (and `COMPACT_MIN_ROWS`) are finished, and an unfinished row
        may still run `COMPACT_MIN_STEPS` tokens (a finished row costs ~1 ms a step at
        SmolLM2-135M's shape on 2 cores; the copy of the cache ~1-3 ms a row)."""
        if not self.compact or not hasattr(self._decoder, "keep"):
            return False
        finished = sum(done[i] for i in act)
        if finished < max(COMPACT_MIN_ROWS, len(act) / 4):
            return False
        left = max((caps[i] - len(comp[i]) for i in act if not done[i]), default=0)
        return left >= COMPACT_MIN_STEPS
