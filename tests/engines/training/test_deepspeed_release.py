"""DeepSpeedSlot.release_memory (issue 37): a colocated learner moves AdamW state and fp32
master weights off the GPU between steps (`engine.offload_states`) and frees ZeRO-3's
partition cache; the next collective use reloads them first. Against a recording engine (the
real calls need CUDA)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed")

from compassplay.engines.training.deepspeed import DeepSpeedSlot  # noqa: E402


class Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def offload_states(self, include, pin_memory):
        self.calls.append("offload:" + ",".join(sorted(str(x.value) for x in include)))

    def reload_states(self):
        self.calls.append("reload")

    def empty_partition_cache(self):
        self.calls.append("empty_partition_cache")

    def set_gradient_accumulation_boundary(self, last):
        pass

    def backward(self, loss):
        self.calls.append("backward")

    def step(self):
        self.calls.append("step")

    def get_global_grad_norm(self):
        return 1.0


def _slot(can_offload: bool = True) -> DeepSpeedSlot:
    slot = object.__new__(DeepSpeedSlot)
    slot.engine, slot._can_offload, slot._offloaded = Engine(), can_offload, False
    return slot


def test_offloaded_between_steps_and_reloaded_before_the_next(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    slot = _slot()
    slot.release_memory()
    slot.release_memory()  # twice: offloaded once
    slot.backward(torch.tensor(0.0), last=True)
    slot.step()
    assert slot.engine.calls == ["offload:hp_params,optim_states", "empty_partition_cache",
                                 "empty_partition_cache", "reload", "backward", "step"]


def test_no_offload_without_cuda_or_with_the_optimizer_already_on_cpu(monkeypatch):
    slot = _slot()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    slot.release_memory()
    assert slot.engine.calls == ["empty_partition_cache"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    off = _slot(can_offload=False)  # learner.offload_optimizer or ZeRO-0
    off.release_memory()
    off.step()
    assert off.engine.calls == ["empty_partition_cache", "step"]
