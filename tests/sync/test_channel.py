"""learner.weight_sync=nccl: the config check, and NcclChannel over gloo (CPU) or NCCL (2 GPUs).

GPU check (needs >= 2 CUDA devices): pytest tests/sync/test_channel.py -k nccl
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from compassplay.config import ConfigError, load_config
from compassplay.engines.generation.base import StaleWeightsError
from compassplay.engines.training.dist import free_port
from compassplay.sync.channel import NcclChannel, check_weight_sync
from compassplay.workers.versioned import Versioned

# 1 KiB buckets: several buckets per send, tensors at odd byte offsets inside a bucket
BUCKET = 1024


def _state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"embed.weight": torch.randn(37, 11, generator=g),
            "layer.0.bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
            "layer.0.mask": torch.randint(0, 2, (13,), generator=g).bool(),
            "layer.1.big": torch.randn(300, generator=g),  # bigger than one bucket
            "step": torch.tensor([version], dtype=torch.int64)}


class _Holder(Versioned):
    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights, version: int) -> None:
        self.loaded = weights


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(a[k].cpu().view(torch.uint8), b[k].cpu().view(torch.uint8))
        if a[k].dtype != torch.bool else torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def _worker(rank: int, port: int, backend: str) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    ch = NcclChannel("127.0.0.1", port, rank, 2, bucket_bytes=BUCKET, backend=backend,
                     timeout_s=60)
    if rank == 0:
        ch.send(_state(1), 1)
        ch.send(_state(3), 3)
        with pytest.raises(StaleWeightsError):
            ch.send(_state(2), 2)  # the sender refuses to go back
        ch.sync.send(_state(2), 2)  # a stale sender, bypassing that check
        ch.send(_state(4), 4)
        ch.send(_state(5), 5)
        return
    got = ch.receive(1, like=_state(0))
    assert _same(got, _state(1)), "version 1 not bit-identical"
    assert got["step"].device.type == "cpu"  # staged out of each bucket: one on the GPU
    assert _same(ch.receive(3), _state(3))
    with pytest.raises(StaleWeightsError):
        ch.receive(2)  # older than held: refused, buckets drained
    assert ch.version == 3
    assert _same(ch.receive(4), _state(4)), "group out of step after a refusal"
    role = _Holder()
    role.weight_version, role.channel = 4, ch
    assert role.receive(5) == 5 and _same(role.loaded, _state(5))


def _run(backend: str) -> None:
    mp.spawn(_worker, args=(free_port(), backend), nprocs=2, join=True)


def test_nccl_config_loads_on_cpu_but_check_fails_clearly() -> None:
    cfg = load_config(None, ["learner.weight_sync=nccl", "learner.sync_bucket_mb=64"])
    assert cfg.learner.weight_sync == "nccl" and cfg.learner.sync_bucket_mb == 64
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"learner\.weight_sync=nccl.*torch\.cuda"):
        check_weight_sync(cfg)


def test_check_names_missing_gpus_and_separate_models() -> None:
    cfg = load_config(None, ["learner.weight_sync=nccl"])
    with pytest.raises(ConfigError, match=r"cluster\.learner\.num_gpus.*cluster\.scorer"):
        check_weight_sync(cfg, embedded=False)  # e.g. a CPU head node driving a GPU cluster
    gpus = [f"cluster.{r}.num_gpus=1" for r in ("learner", "proposer", "solver", "scorer")]
    check_weight_sync(load_config(None, ["learner.weight_sync=nccl", *gpus]), embedded=False)
    cfg = load_config(None, ["learner.weight_sync=nccl", "learner.shared_model=false", *gpus])
    with pytest.raises(ConfigError, match=r"learner\.shared_model=true"):
        check_weight_sync(cfg, embedded=False)


def test_object_store_default_and_bucket_range() -> None:
    cfg = load_config()
    assert cfg.learner.weight_sync == "object_store" and cfg.learner.sync_bucket_mb == 256
    check_weight_sync(cfg)
    with pytest.raises(ConfigError, match="learner.sync_bucket_mb"):
        load_config(None, ["learner.sync_bucket_mb=0"])
    with pytest.raises(ConfigError, match="learner.weight_sync"):
        load_config(None, ["learner.weight_sync=gloo"])


def test_channel_over_gloo_bit_identical_and_monotonic() -> None:
    _run("gloo")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_channel_over_nccl_two_gpus() -> None:
    _run("nccl")
