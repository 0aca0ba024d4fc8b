"""vLLM generation engine (GPU only). `vllm` is imported when the engine is constructed.

Same contract as `HFGenerationEngine`: prompts are token ids, every completion records the
weight version that produced it, and log-probs are the unscaled (temperature 1) log-probs of
the sampled tokens (``logprobs_mode="raw_logprobs"``, vLLM's default). Weights are updated in
place in the running engine (no restart) through `WeightSyncWorkerExtension`:
`load_weights(state, version)` ships tensors by RPC; `receive_weights_broadcast(version)` takes
them from the learner's NCCL group (see `weight_sync.NCCLBroadcastSync`). When colocated with
training, `sleep()` frees GPU memory (level 1 offloads weights to CPU, level 2 drops them:
load weights again after `wake_up()`), `wake_up()` restores it.

Install: ``pip install compassplay[gpu]``. GPU test: ``pytest tests/engines/test_vllm.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from compassplay.config import ConfigError
from compassplay.engines.base import GenerationEngine, SamplingParams, check_version
from compassplay.records import Generation

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


class VLLMGenerationEngine(GenerationEngine):
    """Wraps ``vllm.LLM``. `model` is an HF directory (e.g. a checkpoint's learner/) or hub id."""

    def __init__(self, model: str, tokenizer: Any = None, *, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = False,
                 seed: int = 0, tensor_parallel_size: int = 1, weight_version: int = 0,
                 **llm_kwargs: Any) -> None:
        vllm = import_vllm()
        self._vllm = vllm
        llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.llm = vllm.LLM(model=str(model), dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization,
                            enable_sleep_mode=enable_sleep_mode,
                            tensor_parallel_size=tensor_parallel_size,
                            worker_extension_cls=WORKER_EXTENSION, **llm_kwargs)
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        self._version = weight_version
        self._lock = threading.RLock()
        self._asleep = False

    @property
    def weight_version(self) -> int:
        return self._version

    def _params(self, params: SamplingParams, i: int) -> Any:
        return self._vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, stop=list(params.stop) or None,
            seed=None if params.seed is None else params.seed + i, logprobs=0,
            include_stop_str_in_output=True, skip_special_tokens=True)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        with self._lock:
            if self._asleep:
                raise RuntimeError("vLLM engine is asleep: call wake_up() before generate()")
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

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """In-place update by RPC to every worker (tensors are pickled: prefer CPU tensors)."""
        with self._lock:
            check_version(self._version, version)
            named = list(state.items())
            if hasattr(self.llm, "collective_rpc"):
                self.llm.collective_rpc("update_weights_from_tensors", args=(named,))
            else:  # older vLLM: single in-process driver worker
                runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
                runner.model.load_weights(weights=named)
            self.llm.reset_prefix_cache()
            self._version = version

    def init_weight_broadcast(self, host: str, port: int, rank_offset: int,
                              world_size: int) -> None:
        """Make every worker join the learner's NCCL weight-sync group (once)."""
        self.llm.collective_rpc("init_weight_broadcast",
                                args=(host, port, rank_offset, world_size))

    def receive_weights_broadcast(self, version: int, src: int = 0,
                                  bucket_bytes: int = 256 << 20) -> None:
        """Receive weights the learner is broadcasting now (`NCCLBroadcastSync.send`)."""
        with self._lock:
            check_version(self._version, version)
            got = self.llm.collective_rpc("receive_weights_broadcast", args=(src, bucket_bytes))
            if any(v != version for v in got):
                raise RuntimeError(f"expected weight version {version}, workers got {got}")
            self.llm.reset_prefix_cache()
            self._version = version

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for a colocated learner (see module doc for levels)."""
        with self._lock:
            self.llm.sleep(level=level)
            self._asleep = True

    def wake_up(self) -> None:
        with self._lock:
            self.llm.wake_up()
            self._asleep = False
