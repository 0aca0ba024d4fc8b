"""What `LearnerWorker.publish_ipc` shares (issue 37): the live parameters, not copies (the
former CPU copy and its copy back to the GPU cost about 15 GB at 7B), except under ZeRO-3;
and the memory it releases first (DeepSpeed's partition cache, then torch's)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from compassplay.workers import learner_worker
from compassplay.workers.learner_worker import LearnerWorker, ipc_weights


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    m.register_buffer("steps", torch.zeros(2))
    return m


def test_the_live_parameters_are_shared_without_a_copy():
    m = _model()
    lc = SimpleNamespace(backend="torch", zero_stage=0, offload_params=False)
    calls = []
    got = ipc_weights(m, lc, torch.device("cpu"), lambda: calls.append(1) or {})
    live = m.state_dict()
    assert [n for n, _ in got] == list(live) and not calls  # no gathered copy made
    assert all(t.data_ptr() == live[n].data_ptr() for n, t in got)
    assert not any(t.requires_grad for _, t in got)
    # DeepSpeed below ZeRO-3: the module's parameters are whole, shared too
    ds2 = SimpleNamespace(backend="deepspeed", zero_stage=2, offload_params=False)
    assert all(t.data_ptr() == live[n].data_ptr()
               for n, t in ipc_weights(m, ds2, torch.device("cpu"), dict))


def test_zero3_publishes_the_gathered_state():
    m = _model()
    full = {k: v.clone() for k, v in m.state_dict().items()}
    lc = SimpleNamespace(backend="deepspeed", zero_stage=3, offload_params=False)
    got = dict(ipc_weights(m, lc, torch.device("cpu"), lambda: full))
    assert all(torch.equal(got[k], full[k]) for k in full)


def test_release_frees_the_partition_cache_before_torchs(monkeypatch):
    order = []
    slot = SimpleNamespace(release_memory=lambda: order.append("partition_cache"))
    w = object.__new__(LearnerWorker)
    w.release_cache, w.learner = True, SimpleNamespace(slots={"policy": slot})
    monkeypatch.setattr(learner_worker.torch.cuda, "empty_cache",
                        lambda: order.append("torch"))
    w.release_cached_memory()
    assert order == ["partition_cache", "torch"]
    w.release_cache, order[:] = False, []
    w.release_cached_memory()  # not colocated: nothing
    assert order == []
