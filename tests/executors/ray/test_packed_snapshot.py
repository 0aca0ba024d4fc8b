"""Packed weight snapshots through a real Ray object store (`sync.packed`, the learner shell's
`snapshot`): an actor that packs every snapshot into one reused buffer still hands out each
version as it was (Ray copies a call's returns before the actor's next call runs), and a
reader maps the bytes without a copy (read only)."""

import pytest
import ray
import torch

from compassplay.sync.packed import PackArena, PackedWeights

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Packer:
    """Like `actors.shells.LearnerActor.snapshot`: one arena for every pack."""

    def __init__(self) -> None:
        self.w = {"a": torch.zeros(300_000), "b": torch.zeros(7, dtype=torch.bfloat16)}
        self.arena = PackArena()

    def bump(self) -> None:
        for t in self.w.values():
            t.add_(1)

    def snap(self) -> tuple[int, PackedWeights]:
        return int(self.w["a"][0]), PackedWeights.pack(self.w, self.arena)


@ray.remote(num_cpus=0)
class Reader:
    def total(self, box: list) -> float:
        state = ray.get(box[0]).unpack()
        return float(sum(t.float().sum() for t in state.values()))


def test_each_snapshot_keeps_its_version_though_the_arena_is_reused(ray_local):
    p = Packer.remote()
    refs = []
    for _ in range(3):
        refs.append(p.snap.options(num_returns=2).remote())
        p.bump.remote()
    for expect, (version, state) in enumerate(refs):
        assert ray.get(version) == expect
        got = ray.get(state)
        assert not got.buffer.flags.writeable  # mapped from the object store, not copied
        out = got.unpack()
        assert torch.equal(out["a"], torch.full((300_000,), float(expect)))
        assert torch.equal(out["b"], torch.full((7,), float(expect), dtype=torch.bfloat16))
    # another process fetches the same object by reference
    assert ray.get(Reader.remote().total.remote([refs[2][1]])) == 2.0 * (300_000 + 7)
