"""The vLLM transport's store (sync/pynccl.py) on CPU: vLLM's real StatelessProcessGroup, two
ranks in threads (PyNccl itself needs CUDA: faked where the group is joined whole)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest

pytest.importorskip("vllm.distributed.utils")

from compassplay.engines.training.dist import free_port  # noqa: E402
from compassplay.sync import pynccl  # noqa: E402
from compassplay.sync.pynccl import SYNC_TIMEOUT_S, vllm_store_group  # noqa: E402


def _pair(port: int, timeout_s: float | None) -> list:
    """Rank 0 and rank 1 of one group, formed concurrently (the store waits for both)."""
    kw = {} if timeout_s is None else {"timeout_s": timeout_s}
    groups: list = [None, None]

    def join(rank: int) -> None:
        groups[rank] = vllm_store_group("127.0.0.1", port, rank, 2, **kw)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(g is not None for g in groups), "the group did not form"
    return groups


def test_the_store_waits_the_torch_transports_timeout_not_vllms_300_s():
    sender, receiver = _pair(free_port(), None)
    assert SYNC_TIMEOUT_S == 1800.0
    # vLLM's own default (store_timeout=300) would fail every receiver after 5 min of learn()
    assert receiver.store.timeout == datetime.timedelta(seconds=1800)
    assert sender.data_expiration_seconds >= 2 * 1800  # a header outlives the wait


def test_a_header_later_than_the_timeout_fails_and_one_within_it_arrives():
    sender, receiver = _pair(free_port(), 2.0)
    assert receiver.store.timeout == datetime.timedelta(seconds=2)
    start = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|timed out|wait"):
        receiver.broadcast_obj(None, src=0)  # nobody sends: fails after ~2 s
    assert 1.5 < time.monotonic() - start < 30
    # a header sent 1 s after the receiver started waiting arrives (within the timeout)
    sender2, receiver2 = _pair(free_port(), 5.0)
    timer = threading.Timer(1.0, lambda: sender2.broadcast_obj({"version": 3}, src=0))
    timer.start()
    assert receiver2.broadcast_obj(None, src=0) == {"version": 3}
    timer.join()


def test_the_whole_join_passes_the_timeout_and_checks_devices(monkeypatch):
    """vllm_broadcast_group: store with the timeout, device ids compared before PyNccl's init,
    the communicator created outside vLLM's pinned NCCL variables."""
    import vllm.distributed.device_communicators.pynccl as vllm_pynccl

    order: list[str] = []

    class FakeComm:
        disabled, available = False, True

        def __init__(self, group, device) -> None:
            order.append("nccl-init")
            self.destroyed = False

        def destroy(self) -> None:
            self.destroyed = True

    ids = iter(["GPU-a", "GPU-b"])
    monkeypatch.setattr(vllm_pynccl, "PyNcclCommunicator", FakeComm)
    monkeypatch.setattr("compassplay.sync.identity.device_id", lambda d: next(ids))
    port, out = free_port(), [None, None]

    def join(rank: int) -> None:
        out[rank] = pynccl.vllm_broadcast_group("127.0.0.1", port, rank, 2, 0, timeout_s=7)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(out), "join failed"
    assert out[1].group.store.timeout == datetime.timedelta(seconds=7)
    out[1].close()
    assert out[1].comm is None and order == ["nccl-init", "nccl-init"]


def test_two_ranks_on_one_gpu_are_refused_before_nccl_init(monkeypatch):
    import vllm.distributed.device_communicators.pynccl as vllm_pynccl

    inits: list[int] = []
    monkeypatch.setattr(vllm_pynccl, "PyNcclCommunicator",
                        lambda group, device: inits.append(group.rank))
    monkeypatch.setattr("compassplay.sync.identity.device_id", lambda d: "GPU-same")
    port, errors = free_port(), []

    def join(rank: int) -> None:
        try:
            pynccl.vllm_broadcast_group("127.0.0.1", port, rank, 2, 0, timeout_s=20)
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 2 and inits == []
    assert "ranks [0, 1] on GPU-same" in errors[0] and "NCCL refuses" in errors[0]
