"""A receiver of the bucketed broadcast holds one bucket at a time when it stages the tensors
(`NCCLBroadcastSync.receive(stage=...)`): every tensor owns its memory, none is a view into a
bucket buffer (with stage=None they are, and all buckets stay alive with the state dict)."""

from __future__ import annotations

import torch

from compassplay.sync.buckets import NCCLBroadcastSync


class _Sender:
    def __init__(self, wire: dict) -> None:
        self.wire = wire

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.wire["tensors"].append(tensor.clone())

    def broadcast_object(self, obj, src: int):
        self.wire["objects"].append(obj)
        return obj


class _Receiver:
    """Replays what the sender broadcast, and remembers every bucket buffer it filled."""

    def __init__(self, wire: dict) -> None:
        self.wire, self.buffers = wire, []

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self.wire["tensors"].pop(0))
        self.buffers.append(tensor)

    def broadcast_object(self, obj, src: int):
        return self.wire["objects"].pop(0)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(40, generator=g), "b": torch.randn(3, 5, generator=g),
            "c": torch.randn(100, generator=g).to(torch.bfloat16),
            "d": torch.randn(7, generator=g)}


def _roundtrip(stage):
    wire: dict = {"tensors": [], "objects": []}
    sent = _state()
    NCCLBroadcastSync(_Sender(wire), bucket_bytes=256, device="cpu").send(sent, 3)
    rx = _Receiver(wire)
    got, version = NCCLBroadcastSync(rx, bucket_bytes=256, device="cpu").receive(stage=stage)
    assert version == 3 and list(got) == list(sent)
    for k in sent:
        assert got[k].dtype == sent[k].dtype and torch.equal(got[k], sent[k]), k
    return got, rx.buffers


def _shares_a_buffer(t: torch.Tensor, buffers: list[torch.Tensor]) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return any(ptr == b.untyped_storage().data_ptr() for b in buffers)


def test_staged_tensors_own_their_memory():
    got, buffers = _roundtrip("cpu")
    assert len(buffers) == 2  # 160 + 60 bytes, then 200 + 28: two buckets of <= 256
    for k, t in got.items():
        assert not _shares_a_buffer(t, buffers), k
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), k


def test_unstaged_tensors_are_views_into_the_buckets():
    got, buffers = _roundtrip(None)
    assert all(_shares_a_buffer(t, buffers) for t in got.values())
