"""PackedWeights: a state dict in one buffer, bit for bit, pickled out of band as one array,
tied tensors stored once, and an arena whose buffer the next pack reuses."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch

from compassplay.sync.packed import ALIGN, PackArena, PackedWeights, layout, unpacked
from tests.tiny_models import tiny_causal_lm


def _mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(7, 5, generator=g)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(9, generator=g).to(torch.float16),
        "i64": torch.arange(11),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "transposed": w.t(),  # not contiguous: packed by value
    }


def test_round_trip_is_bit_exact_in_order_for_every_dtype_and_layout():
    state = _mixed_state()
    packed = PackedWeights.pack(state)
    out = packed.unpack()
    assert list(out) == list(state) == packed.names() and len(packed) == len(state)
    for name, t in state.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        assert torch.equal(out[name], t), name
    assert all(e.offset % ALIGN == 0 for e in packed.entries)


def test_tensors_sharing_storage_are_stored_once():
    model = tiny_causal_lm(tie=True)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    emb, head = "model.embed_tokens.weight", "lm_head.weight"
    assert state[emb].data_ptr() == state[head].data_ptr()
    packed = PackedWeights.pack(state)
    distinct = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    assert packed.nbytes < sum(t.numel() * t.element_size() for t in state.values())
    assert packed.nbytes >= sum(distinct.values())
    out = packed.unpack()
    assert out[emb].data_ptr() == out[head].data_ptr() and torch.equal(out[head], state[head])
    # a copy per name (as full_state_dict makes) is packed per name
    copies = {k: v.clone() for k, v in state.items()}
    assert PackedWeights.pack(copies).nbytes > packed.nbytes


def test_pickles_as_one_out_of_band_buffer_and_unpacks_read_only_without_a_copy():
    state = _mixed_state()
    packed = PackedWeights.pack(state)
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and buffers[0].raw().nbytes == packed.nbytes
    assert len(stream) < 2048  # the index only: the bytes travelled out of band
    frozen = bytes(buffers[0].raw())  # what a reader of the object store maps: read only
    back = pickle.loads(stream, buffers=[memoryview(frozen)])
    assert not back.buffer.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = back.unpack()
    for name, t in state.items():
        assert torch.equal(out[name], t), name
    addr = np.frombuffer(frozen, dtype=np.uint8).ctypes.data
    assert out["f32"].data_ptr() == addr + back.entries[0].offset  # a view, not a copy


def test_arena_reuses_its_buffer_and_grows_when_needed():
    arena = PackArena()
    small = {"a": torch.ones(10)}
    big = {"a": torch.ones(1000), "b": torch.zeros(3)}
    first = PackedWeights.pack(big, arena)
    second = PackedWeights.pack(small, arena)
    assert np.shares_memory(first.buffer, second.buffer)
    assert torch.equal(second.unpack()["a"], small["a"])
    third = PackedWeights.pack({"a": torch.ones(5000)}, arena)
    assert not np.shares_memory(first.buffer, third.buffer)
    assert torch.equal(third.unpack()["a"], torch.ones(5000))


def test_unpacked_passes_plain_state_dicts_and_none_through():
    d = {"w": torch.ones(2)}
    assert unpacked(d) is d and unpacked(None) is None
    assert torch.equal(unpacked(PackedWeights.pack(d))["w"], d["w"])


def test_loading_an_unpacked_snapshot_into_a_model_equals_the_source():
    src, dst = tiny_causal_lm(seed=1), tiny_causal_lm(seed=2)
    snap = PackedWeights.pack({k: v.detach() for k, v in src.state_dict().items()})
    dst.load_state_dict(snap.unpack())
    for (n, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_copies_a_strided_slice_by_value(dtype):
    t = torch.arange(12, dtype=dtype).reshape(3, 4)
    out = PackedWeights.pack({"t": t[:, 1:]}).unpack()["t"]
    assert out.is_contiguous() and torch.equal(out, t[:, 1:])


def test_layout_sizes_the_pack_and_a_reserved_arena_serves_it_in_place():
    model = tiny_causal_lm(tie=True)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    entries, placed, size = layout(state)
    assert [e.name for e in entries] == list(state) and len(placed) == len(state) - 1  # tied
    arena = PackArena()
    arena.reserve(size)
    held = arena.take(size)
    packed = PackedWeights.pack(state, arena)
    assert packed.nbytes == size and np.shares_memory(packed.buffer, held)
    assert all(torch.equal(packed.unpack()[k], v) for k, v in state.items())
