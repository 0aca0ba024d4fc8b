"""The vLLM worker extension's reload and communicator lifecycle (engines/generation/vllm_worker.py) on
the fake worker: an unfinished reload is abandoned before any new update starts, and a
re-formed group destroys the communicator of the old one; a stuck receive is aborted."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from compassplay.sync.buckets import encode_named
from compassplay.sync.ipc import publish
from tests.engines.fake_vllm import FakeLLM, FakeWorker


def _state(v: float) -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.full((4, 3), v), "layer.0.w": torch.full((5,), v)}


class Comm:
    """A `Broadcaster` of one rank: the header and bytes of `state` as version `version`;
    `hang` makes a bucket block until the communicator is closed (a dead peer)."""

    def __init__(self, state: dict[str, torch.Tensor], version: int, hang: bool = False):
        self.state, self.version, self.hang = state, version, hang
        self.closed = threading.Event()
        flat = [t.reshape(-1).view(torch.uint8) for t in state.values()]
        self.raw = torch.cat(flat)
        self.off = 0

    def broadcast_object(self, obj, src):
        meta = [(n, str(t.dtype).removeprefix("torch."), list(t.shape),
                 t.numel() * t.element_size()) for n, t in self.state.items()]
        return {"version": self.version, "meta": meta}

    def broadcast(self, tensor, src):
        if self.hang:
            assert self.closed.wait(30), "the watchdog never aborted the communicator"
            raise RuntimeError("NCCL communicator aborted")
        n = tensor.numel()
        tensor.copy_(self.raw[self.off:self.off + n])
        self.off += n

    def close(self):
        self.closed.set()


class Logged(FakeWorker):
    """The fake worker, logging reload begin/finish in order."""

    def __init__(self, llm: FakeLLM) -> None:
        super().__init__(0, _state(0.0), llm)
        self.events: list[str] = []

    def _compassplay_begin(self) -> None:
        super()._compassplay_begin()
        self.events.append("begin")

    def _compassplay_finish(self) -> None:
        super()._compassplay_finish()
        self.events.append("finish")


def _half_open(w: Logged) -> None:
    """An object-store update whose last bucket never came (its RPC failed on the driver)."""
    first = encode_named([("embed.weight", torch.full((4, 3), 9.0))])
    assert w.compassplay_load_tensors(first, 1, True, False) == -1
    assert w.events == ["begin"] and w._compassplay_reloading


def test_a_broadcast_abandons_an_unfinished_reload_before_starting_its_own():
    w = Logged(FakeLLM(_state(0.0)))
    _half_open(w)
    w._compassplay_comm = Comm(_state(2.0), 2)
    assert w.compassplay_receive_broadcast(2, bucket_bytes=1 << 20) == 2
    # the half-open reload is closed before the broadcast's reload begins
    assert w.events == ["begin", "finish", "begin", "finish"]
    assert torch.equal(w.model.params["embed.weight"], torch.full((4, 3), 2.0))
    assert w.compassplay_weight_version() == 2


def test_an_ipc_load_abandons_an_unfinished_reload_even_when_refused():
    w = Logged(FakeLLM(_state(0.0)))
    _half_open(w)
    with publish({"another-gpu": list(_state(3.0).items())}, 3) as update:
        with pytest.raises(RuntimeError, match="share the learner's GPU"):
            w.compassplay_load_ipc(update.path, 3)
    assert w.events == ["begin", "finish"] and not w._compassplay_reloading
    with publish({"fake-gpu-0": list(_state(3.0).items())}, 3) as update:
        assert w.compassplay_load_ipc(update.path, 3) == 3
    assert w.events == ["begin", "finish", "begin", "finish"]


def test_joining_again_destroys_the_old_communicator():
    w = FakeWorker(0, _state(0.0), FakeLLM(_state(0.0)))
    comms: list[Comm] = []

    def join(host, port, rank, world):
        comms.append(Comm(_state(1.0), 1))
        return comms[-1]

    w._compassplay_join = join  # type: ignore[method-assign]
    assert w.compassplay_join_group("h", 1, 1, 2, 5.0) == 1
    assert w._compassplay_timeout_s == 5.0
    assert w.compassplay_join_group("h", 2, 1, 2) == 1  # the group re-forms
    assert comms[0].closed.is_set() and not comms[1].closed.is_set()
    assert w._compassplay_comm is comms[1]
    assert w.compassplay_leave_group() and comms[1].closed.is_set()
    assert not w.compassplay_leave_group()


def test_a_receive_stuck_in_nccl_is_aborted_after_the_timeout():
    w = FakeWorker(0, _state(0.0), FakeLLM(_state(0.0)))
    comm = Comm(_state(1.0), 1, hang=True)
    w._compassplay_join = lambda *a: comm  # type: ignore[method-assign]
    w.compassplay_join_group("h", 1, 1, 2, 0.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="not received within 0 s|communicator destroyed"):
        w.compassplay_receive_broadcast(1)
    assert time.monotonic() - start < 20 and comm.closed.is_set()
    assert w._compassplay_comm is None  # the next update must join again
    with pytest.raises(RuntimeError, match="before compassplay_join_group"):
        w.compassplay_receive_broadcast(1)


def test_an_engine_tells_when_a_level_2_sleep_dropped_its_weights():
    from compassplay.engines.generation.vllm import VLLMGenerationEngine
    from tests.engines.fake_vllm import fake_sampling_params

    llm = FakeLLM(_state(0.0))
    eng = VLLMGenerationEngine("unused", tokenizer=object(), llm=llm,
                               sampling_params_cls=fake_sampling_params,
                               enable_sleep_mode=True, sleep_level=2)
    assert not eng.weights_dropped
    eng.sleep(level=1)
    eng.wake_up()
    assert not eng.weights_dropped  # level 1 keeps a CPU copy
    eng.sleep()
    assert eng.weights_dropped  # the next rollout needs a load, even of version 0
    eng.load_weights(_state(0.0), 0)
    assert not eng.weights_dropped
