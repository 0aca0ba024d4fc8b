"""A CPU stand-in for ``vllm.LLM`` as `VLLMGenerationEngine` uses it.

`FakeLLM(tp)` holds `tp` fake workers, each a `FakeWorker` (the real
`WeightSyncWorkerExtension` mixed into a minimal worker: `rank`, `device`, `get_model()`),
and speaks: ``collective_rpc(method, args)`` (every worker, concurrently like vLLM's TP ranks;
arguments arrive as vLLM's msgpack decoding delivers them: tuples become lists, a tensor is
legal but arrives as [dtype, shape, buffer index], not a tensor; a worker's exception comes
back wrapped as vLLM wraps it), ``sleep(level)``,
``wake_up(tags)``, ``reset_prefix_cache()``, ``generate(...)`` (prompt log-probs too),
``get_tokenizer()``. Every call is
appended to `log`. Workers join the weight group over gloo (`StoreBroadcaster`) instead of
PyNccl, and report ``fake-gpu-<rank>`` as their GPU UUID.
"""

from __future__ import annotations

import datetime
import threading
from types import SimpleNamespace
from typing import Any

import torch

from compassplay.engines.generation.vllm_worker import WeightSyncWorkerExtension
from compassplay.sync.channel import StoreBroadcaster

MSGPACK_TYPES = (str, int, float, bool, bytes, type(None), torch.Tensor)


def assert_msgpack_plain(value: Any, where: str) -> None:
    """What vLLM's v1 RPC encodes with its meaning: plain values, tensors, lists, dicts."""
    if isinstance(value, (list, tuple)):
        for v in value:
            assert_msgpack_plain(v, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            assert_msgpack_plain(k, where)
            assert_msgpack_plain(v, where)
    elif not isinstance(value, MSGPACK_TYPES):
        raise AssertionError(f"{where}: {type(value).__name__} in collective_rpc args")


def _encoded(value: Any) -> Any:
    """`value` as the worker receives it from vLLM's schema-less msgpack decoding: tuples
    become lists, a tensor becomes [dtype, shape, data] where data is an index into buffers
    the worker never sees (anything over vLLM's inline threshold; always here)."""
    if isinstance(value, (list, tuple)):
        return [_encoded(v) for v in value]
    if isinstance(value, dict):
        return {k: _encoded(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return [str(value.dtype).removeprefix("torch."), list(value.shape), 1]
    return value


class FakeModel:
    """`load_weights(weights=[(name, tensor)])` into a dict; fails on `fail_on` names or when
    its weights are asleep (vLLM's weights memory not mapped)."""

    def __init__(self, state: dict[str, torch.Tensor], llm: FakeLLM) -> None:
        self.params = {k: v.clone() for k, v in state.items()}
        self.llm, self.fail_on = llm, set()

    def load_weights(self, weights) -> None:
        if not self.llm.weights_awake:
            raise AssertionError("load_weights while the weights are asleep")
        for name, t in weights:
            if name in self.fail_on:
                raise RuntimeError(f"injected load failure at {name}")
            self.params[name].copy_(t)


class FakeWorker(WeightSyncWorkerExtension):
    """The real extension; its vLLM seams (engine rank, layerwise reload, device, group)
    replaced: `begun`/`finished` count reloads, the model is a `FakeModel`."""

    def __init__(self, rank: int, state: dict[str, torch.Tensor], llm: FakeLLM) -> None:
        self.rank, self.device = rank, torch.device("cpu")
        self.model = FakeModel(state, llm)
        self.joined: tuple | None = None
        self.begun = self.finished = 0

    def get_model(self) -> FakeModel:
        return self.model

    def _compassplay_engine_rank(self) -> int:
        return self.rank

    def _compassplay_begin(self) -> None:
        self.begun += 1

    def _compassplay_load_part(self, named) -> None:
        self.model.load_weights(weights=named)

    def _compassplay_finish(self) -> None:
        self.finished += 1

    def _compassplay_device(self) -> str:
        return f"fake-gpu-{self.rank}"

    def _compassplay_join(self, host: str, port: int, rank: int, world_size: int) -> Any:
        self.joined = (rank, world_size)
        return StoreBroadcaster(host, port, rank, world_size, "gloo",
                                datetime.timedelta(seconds=min(60.0,
                                                               self._compassplay_timeout_s)))


class FakeLLM:
    def __init__(self, state: dict[str, torch.Tensor], tp: int = 1) -> None:
        self.log: list[tuple] = []
        self.weights_awake = self.kv_awake = True
        self.finish_reason = "stop"  # what generate() reports (tests set abort/error)
        self.requests: list[list[tuple]] = []  # each generate call's (prompt, params) pairs
        self.workers = [FakeWorker(r, state, self) for r in range(tp)]

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        assert_msgpack_plain(args, f"collective_rpc({method!r})")
        self.log.append(("rpc", method))
        args = _encoded(args)
        out: list[Any] = [None] * len(self.workers)
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                out[i] = getattr(self.workers[i], method)(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(self.workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:  # vLLM wraps a worker's exception; its message carries the original
            raise RuntimeError(f"Call to collective_rpc method failed: Worker failed with "
                               f"error '{type(errors[0]).__name__}: {errors[0]}'") from errors[0]
        assert_msgpack_plain(out, f"collective_rpc({method!r}) result")
        return out

    def sleep(self, level: int = 1) -> None:
        self.log.append(("sleep", level))
        self.weights_awake = self.kv_awake = False

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.log.append(("wake_up", tags))
        for tag in tags or ["weights", "kv_cache"]:
            if tag == "weights":
                self.weights_awake = True
            else:
                self.kv_awake = True

    def reset_prefix_cache(self) -> None:
        self.log.append(("reset_prefix_cache",))

    def get_tokenizer(self) -> None:
        return None

    def generate(self, prompts, params, use_tqdm: bool = False):
        """One token per prompt (log-prob -0.5), or, for a request with prompt_logprobs, the
        prompt's log-probs: -0.25 for each token after the first."""
        assert self.weights_awake and self.kv_awake, "generate while asleep"
        self.log.append(("generate", len(prompts)))
        self.requests.append(list(zip(prompts, params, strict=True)))
        first = self.workers[0].model.params
        tok = int(next(iter(first.values())).flatten()[0].item() * 1000) % 100
        step = {tok: SimpleNamespace(logprob=-0.5)}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[tok], logprobs=[step],
                                                         text=str(tok),
                                                         finish_reason=self.finish_reason)],
                                prompt_logprobs=None if p.get("prompt_logprobs") is None else
                                [None] + [{t: SimpleNamespace(logprob=-0.25)}
                                          for t in q["prompt_token_ids"][1:]])
                for q, p in zip(prompts, params, strict=True)]


class FakeLLMNoTags(FakeLLM):
    """An older vLLM whose wake_up takes no tags."""

    def wake_up(self) -> None:  # type: ignore[override]
        super().wake_up(None)


def fake_sampling_params(**kwargs: Any) -> dict:
    return kwargs


def fake_structured_outputs(**kwargs: Any) -> dict:
    return {"structured_outputs": kwargs}
