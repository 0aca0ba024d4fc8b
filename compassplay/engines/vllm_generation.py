"""vLLM generation engine (GPU only). `vllm` is imported when the engine is constructed.

Same contract as `HFGenerationEngine`: prompts are token ids, every completion records the
weight version that produced it, and log-probs are the unscaled (temperature 1) log-probs of
the sampled tokens (``logprobs_mode="raw_logprobs"``, vLLM's default).

Weights are updated in place in the running engine through `vllm_worker.WeightSyncWorkerExtension`
(``LLM(worker_extension_cls=...)`` + ``LLM.collective_rpc``), never by putting tensors into RPC
arguments (vLLM's v1 engine msgpack-encodes them; `_rpc` refuses any tensor):

* `receive_weights_broadcast(version)`: NCCL (`learner.weight_sync=nccl`), after
  `init_weight_broadcast(host, port, rank_offset, world_size)` made every TP worker join the
  learner's group (ranks from `sync.ranks.weight_sync_ranks`);
* `load_weights_ipc(path, version)`: CUDA IPC handles a colocated learner published
  (`learner.weight_sync=ipc`, `sync.ipc`);
* `load_weights(state, version)` (object store, and the local executor): this process puts the
  state on each worker's GPU, bucket by bucket, and publishes CUDA IPC handles of it.

The version changes only after every worker returned it (a stale or unexpected version is
refused by the workers and here); after a failed load the old version stays, and if a worker
may have loaded part of the update the engine refuses to generate until a load succeeds.

Sleep mode (``enable_sleep_mode``, colocated training): `sleep()` frees the GPU (level 1
offloads the weights to CPU, level 2 drops them); a load wakes the weights only
(``wake_up(tags=["weights"])``), loads, then wakes the KV cache (``wake_up(tags=["kv_cache"])``),
the order vLLM documents for RLHF. vLLM without ``tags`` (feature-detected) wakes everything
before the load. Minimum vLLM: 0.10.2 (worker_extension_cls, collective_rpc, wake_up tags).

Install: ``pip install compassplay[gpu]``. GPU test: ``pytest tests/engines/test_vllm.py``.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from typing import Any

import torch

from compassplay.config import ConfigError
from compassplay.engines.base import (
    GenerationEngine,
    SamplingParams,
    StaleWeightsError,
    check_version,
)
from compassplay.records import Generation
from compassplay.sync.ipc import publish

WORKER_EXTENSION = "compassplay.engines.vllm_worker.WeightSyncWorkerExtension"


def import_vllm() -> Any:
    """`import vllm`, or a ConfigError saying how to get it or what to choose instead."""
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise ConfigError(
            "generation engine 'vllm' (model/engine setting) was chosen but vllm cannot be "
            f"imported here ({type(exc).__name__}: {exc}). vLLM needs a CUDA GPU; install it "
            "with `pip install compassplay[gpu]`, or choose the 'hf' engine.") from exc
    return vllm


def _plain(value: Any) -> bool:
    """Whether `value` is made of msgpack-safe plain values only (no tensor anywhere)."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _buckets(state: dict[str, torch.Tensor], bucket_bytes: int
             ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur


def _local_device(uuid: str) -> torch.device:
    """This process's device for the GPU with `uuid` (CPU where there is no CUDA: tests)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    from compassplay.engines.vllm_worker import device_uuid

    for i in range(torch.cuda.device_count()):
        if device_uuid(torch.device("cuda", i)) == uuid:
            return torch.device("cuda", i)
    raise RuntimeError(f"vLLM worker GPU {uuid} is not visible to the engine's process")


class VLLMGenerationEngine(GenerationEngine):
    """Wraps ``vllm.LLM``. `model` is an HF directory (e.g. a checkpoint's model/) or hub id.

    `llm` / `sampling_params_cls`: an already built engine and its SamplingParams class (the
    CPU tests pass a fake that speaks the same interface); by default ``vllm.LLM`` is built
    with the worker extension and the given options."""

    def __init__(self, model: str, tokenizer: Any = None, *, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = False,
                 sleep_level: int = 1, seed: int = 0, tensor_parallel_size: int = 1,
                 weight_version: int = 0, bucket_bytes: int = 256 << 20, llm: Any = None,
                 sampling_params_cls: Any = None, **llm_kwargs: Any) -> None:
        if llm is None:
            vllm = import_vllm()
            llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
            llm = vllm.LLM(model=str(model), dtype=dtype, seed=seed,
                           gpu_memory_utilization=gpu_memory_utilization,
                           enable_sleep_mode=enable_sleep_mode,
                           tensor_parallel_size=tensor_parallel_size,
                           worker_extension_cls=WORKER_EXTENSION, **llm_kwargs)
            sampling_params_cls = vllm.SamplingParams
        self.llm, self._sampling_params = llm, sampling_params_cls
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        self.enable_sleep_mode, self.sleep_level = enable_sleep_mode, sleep_level
        self.bucket_bytes = bucket_bytes
        self._lock = threading.RLock()
        self._asleep = 0  # 0 awake, else the level it sleeps at
        self._weights_awake = True  # the weights' memory is mapped (may still be stale)
        self._weights_valid = True  # False after sleep(level=2) until a load
        self._torn = False  # a worker may hold part of an update
        self._tags = "tags" in inspect.signature(self.llm.wake_up).parameters
        self._uuids: list[str] | None = None
        self._rpc("compassplay_set_version", weight_version)
        self._version = weight_version

    @property
    def weight_version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ RPC
    def _rpc(self, method: str, *args: Any) -> list[Any]:
        """`collective_rpc` on every worker; the arguments must be plain values."""
        if not _plain(args):
            raise TypeError(f"collective_rpc({method!r}): arguments must be plain values "
                            "(str/int/float), never tensors; vLLM msgpack-encodes them")
        return list(self.llm.collective_rpc(method, args=tuple(args)))

    def worker_uuids(self) -> list[str]:
        """The GPU UUID of each worker (TP rank order)."""
        if self._uuids is None:
            self._uuids = self._rpc("compassplay_device_uuid")
        return self._uuids

    # ------------------------------------------------------------------ generation
    def _params(self, params: SamplingParams, i: int) -> Any:
        return self._sampling_params(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, stop=list(params.stop) or None,
            seed=None if params.seed is None else params.seed + i, logprobs=0,
            include_stop_str_in_output=True, skip_special_tokens=True)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        with self._lock:
            if self._torn:
                raise RuntimeError("vLLM engine holds a partly loaded weight update (a load "
                                   "failed): load weights again before generate()")
            if self._asleep:
                self.wake_up()
            version = self._version
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                     [self._params(params, i) for i in range(len(prompts))],
                                     use_tqdm=False)
        gens = []
        for prompt, out in zip(prompts, outs, strict=True):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, ids, strict=True)]
            gens.append(Generation(prompt_ids=list(prompt), completion_ids=ids, logprobs=lps,
                                   text=c.text, weight_version=version,
                                   finish_reason="length" if c.finish_reason == "length"
                                   else "stop"))
        return gens

    # ------------------------------------------------------------------ weight updates
    def _load(self, version: int, transfer) -> None:
        """Wake the weights, run `transfer()` (the RPCs; returns each worker's version), take
        `version` only if every worker returned it, then wake the KV cache."""
        with self._lock:
            announced_stale = version < self._version
            self._wake_weights()
            try:
                got = transfer()
            except Exception as exc:
                self._after_failure()
                if announced_stale:
                    raise StaleWeightsError(f"refusing weight version {version}: engine "
                                            f"already holds version {self._version}") from exc
                raise
            if len(got) != self._world() or any(g != version for g in got):
                self._after_failure()
                raise RuntimeError(f"expected weight version {version} from every worker, "
                                   f"got {got}")
            self._version, self._torn, self._weights_valid = version, False, True
            self._wake_rest()
            self.llm.reset_prefix_cache()

    def _world(self) -> int:
        return len(self.worker_uuids())

    def _after_failure(self) -> None:
        """The version stays; the engine is torn when a worker reports partial weights."""
        try:
            held = self._rpc("compassplay_weight_version")
        except Exception:  # noqa: BLE001 - cannot tell: assume the worst
            held = [-1]
        self._torn = self._torn or any(v != self._version for v in held)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Object-store path: put `state` on each worker's GPU (`bucket_bytes` at a time) and
        let the workers open CUDA IPC handles of it; raises StaleWeightsError for an older
        version."""
        with self._lock:
            check_version(self._version, version)
            uuids = sorted(set(self.worker_uuids()))
            devices = {u: _local_device(u) for u in uuids}

            def transfer() -> list[int]:
                parts = list(_buckets(state, self.bucket_bytes))
                got: list[int] = []
                for i, part in enumerate(parts):
                    by_device = {u: [(n, t.to(devices[u])) for n, t in part] for u in uuids}
                    with publish(by_device, version) as update:
                        got = self._rpc("compassplay_load_ipc", update.path, version,
                                        i == len(parts) - 1)
                return got

            self._load(version, transfer)

    def load_weights_ipc(self, path: str, version: int) -> None:
        """Colocated path: load the handles a producer (the learner) published at `path`."""
        with self._lock:
            check_version(self._version, version)
            self._load(version, lambda: self._rpc("compassplay_load_ipc", path, version, True))

    def init_weight_broadcast(self, host: str, port: int, rank_offset: int,
                              world_size: int) -> list[int]:
        """Make every worker join the learner's NCCL weight-sync group (once), as ranks
        rank_offset .. rank_offset + TP*PP - 1; returns the ranks joined."""
        ranks = self._rpc("compassplay_join_group", host, port, rank_offset, world_size)
        if sorted(ranks) != list(range(rank_offset, rank_offset + len(ranks))):
            raise RuntimeError(f"vLLM workers joined the weight-sync group as ranks {ranks}, "
                               f"expected {rank_offset}..{rank_offset + len(ranks) - 1}")
        return ranks

    def receive_weights_broadcast(self, version: int, src: int = 0,
                                  bucket_bytes: int = 256 << 20) -> None:
        """Receive the weights the learner is broadcasting now as `version`. The workers
        always drain the broadcast (the group stays in step) and refuse an older version."""
        self._load(version, lambda: self._rpc("compassplay_receive_broadcast", version, src,
                                              bucket_bytes))

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
