"""The weight-sync channel's group lifecycle: members exchange their device ids when the group
forms (here over a gloo group's store), and a re-formed group closes the old communicator."""

from __future__ import annotations

import datetime
import threading

import pytest

from compassplay.config import load_config
from compassplay.engines.training.dist import free_port
from compassplay.sync import channel
from compassplay.sync.channel import StoreBroadcaster
from compassplay.sync.gpu_members import check_distinct_devices, gather_device_ids


def _gather(ids: list[str]) -> list[list[str]]:
    port, out = free_port(), [None] * len(ids)

    def member(rank: int) -> None:
        comm = StoreBroadcaster("127.0.0.1", port, rank, len(ids), "gloo",
                                datetime.timedelta(seconds=30))
        out[rank] = gather_device_ids(comm, rank, len(ids), ids[rank])
        comm.close()
        assert comm.pg is None

    threads = [threading.Thread(target=member, args=(r,)) for r in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_every_member_learns_every_device_and_a_shared_gpu_is_named():
    ids = ["GPU-learner", "GPU-x", "GPU-x"]
    got = _gather(ids)
    assert got == [ids, ids, ids]
    with pytest.raises(RuntimeError, match=r"ranks \[1, 2\] on GPU-x"):
        check_distinct_devices(got[0])


def test_open_channel_closes_the_channel_it_opened_before(monkeypatch):
    opened: list = []

    class Fake:
        def __init__(self, *a, **kw) -> None:
            self.closed = False
            opened.append(self)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(channel, "NcclChannel", Fake)
    monkeypatch.setattr(channel, "_OPEN", [])
    cfg = load_config(None, ["learner.weight_sync=nccl"])
    first = channel.open_channel(cfg, "h", 1, 1, 3)
    second = channel.open_channel(cfg, "h", 2, 1, 3)  # the group re-forms after a recovery
    assert first.closed and not second.closed and opened == [first, second]
