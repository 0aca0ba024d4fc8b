"""The Ray driver's weight-sync calls, with recording stand-ins for the actors (no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from compassplay.config import load_config  # noqa: E402
from compassplay.executors.ray import driver as ray_driver  # noqa: E402


class _Method:
    def __init__(self, actor: str, name: str, calls: list, result) -> None:
        self.actor, self.name, self.calls, self.result = actor, name, calls, result

    def remote(self, *args):
        self.calls.append((self.actor, self.name, args))
        return self.result(*args) if callable(self.result) else self.result

    def options(self, **kw):
        return self


class _Actor:
    def __init__(self, name: str, calls: list, results: dict | None = None) -> None:
        self._name, self._calls, self._results = name, calls, results or {}

    def __getattr__(self, item: str) -> _Method:
        if item.startswith("_"):
            raise AttributeError(item)
        return _Method(self._name, item, self._calls, self._results.get(item, f"{self._name}."
                                                                         f"{item}"))


def _pipeline(overrides: list[str], monkeypatch) -> tuple[ray_driver.Pipeline, list]:
    calls: list = []
    cfg = load_config(None, overrides)
    actors = SimpleNamespace(
        proposer=_Actor("proposer", calls), solver=_Actor("solver", calls),
        scorers=[_Actor(f"scorer{i}", calls) for i in range(cfg.scorer.num_scorers)],
        learner=_Actor("learner", calls, {"snapshot": ("v", "state")}), verifiers=[])
    monkeypatch.setattr(ray_driver.ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray_driver, "call_when_up", lambda method, *a, poll=None: ("h", 99))
    pipe = ray_driver.Pipeline.__new__(ray_driver.Pipeline)
    pipe.cfg, pipe.actors, pipe.stop = cfg, actors, SimpleNamespace(check=lambda: None)
    pipe.nccl = cfg.learner.weight_sync == "nccl"
    pipe.ipc = cfg.learner.weight_sync == "ipc"
    pipe.sync_calls = []
    return pipe, calls


def test_nccl_group_gives_tp_workers_their_own_ranks(monkeypatch):
    pipe, calls = _pipeline(["learner.weight_sync=nccl", "proposer.engine=vllm",
                             "proposer.tensor_parallel_size=2", "solver.engine=vllm",
                             "solver.tensor_parallel_size=4", "scorer.num_scorers=2"],
                            monkeypatch)
    pipe._init_sync()
    joins = {a: args for a, name, args in calls if name == "init_sync"}
    assert joins == {"learner": ("h", 99, 9), "proposer": ("h", 99, 1, 9),
                     "solver": ("h", 99, 3, 9), "scorer0": ("h", 99, 7, 9),
                     "scorer1": ("h", 99, 8, 9)}


def test_ipc_snapshot_pairs_publish_receive_release(monkeypatch):
    pipe, calls = _pipeline(["learner.weight_sync=ipc", "solver.engine=vllm",
                             "solver.enable_sleep_mode=true"], monkeypatch)
    snap = pipe._snapshot()
    names = [(a, n) for a, n, _ in calls]
    assert names[:3] == [("learner", "publish_ipc"), ("solver", "receive_ipc"),
                         ("learner", "release_ipc")]
    assert calls[1][2] == ("learner.publish_ipc",) and calls[2][2] == ("solver.receive_ipc",)
    assert ("proposer", "receive_ipc") not in names  # the HF proposer takes the object store
    assert snap["solver"] == ("v", ["state"])


def test_nccl_snapshot_starts_receivers_without_waiting_for_the_sender(monkeypatch):
    """A receiver given the broadcast's ObjectRef would start only after the broadcast
    returned, and a multi-bucket broadcast waits for its receivers: no ref between them."""
    pipe, calls = _pipeline(["learner.weight_sync=nccl", "scorer.num_scorers=1"], monkeypatch)
    monkeypatch.setattr(ray_driver.ray, "wait",
                        lambda refs, num_returns=1, timeout=None: (refs, []))
    snap = pipe._snapshot()
    names = [(a, n, args) for a, n, args in calls]
    assert names == [("learner", "broadcast", ()), ("proposer", "receive", ()),
                     ("solver", "receive", ()), ("scorer0", "receive", ())]
    assert snap["solver"] == ("learner.broadcast", [])
    assert pipe.sync_calls == ["learner.broadcast", "proposer.receive", "solver.receive",
                               "scorer0.receive"]
    pipe._snapshot()  # the next broadcast first settles the previous one's calls
    assert pipe.sync_calls[0] == "learner.broadcast" and len(calls) == 8
