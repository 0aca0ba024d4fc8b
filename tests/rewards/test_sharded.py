import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.sharded import ShardedGradientScorer, partition

from .conftest import rand_example, tiny_model

SPECS = {"all": "all", "proj": {"kind": "projection", "dim": 48, "seed": 3}}


def _data():
    gen = torch.Generator().manual_seed(99)
    ref = [rand_example(gen, 3, t) for t in (4, 9, 2)]
    cands = [rand_example(gen, 2, t) for t in (1, 7, 30, 12, 5)]
    return ref, cands


def _worker(rank, world, port, mode, spec_key, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = tiny_model("qwen2", True)
        ref, cands = _data()
        scorer = ShardedGradientScorer(model, SPECS[spec_key], mode=mode)
        scorer.set_reference(ref)
        scores = scorer.score(cands)
        owned = getattr(scorer, "owned", None)
        q.put((rank, [(s.cosine, s.inner, s.grad_norm) for s in scores], owned))
        dist.destroy_process_group()
    except Exception:
        q.put((rank, traceback.format_exc(), None))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(mode, spec_key, world=2):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, mode, spec_key, q))
             for r in range(world)]
    for p in procs:
        p.start()
    out = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    for rank, res, _ in out:
        assert not isinstance(res, str), f"rank {rank} failed:\n{res}"
    return sorted(out)


@pytest.mark.slow
@pytest.mark.parametrize("mode,spec_key", [("param", "all"), ("param", "proj"),
                                           ("data", "all")])
def test_two_process_gloo_matches_single_process(mode, spec_key):
    model = tiny_model("qwen2", True)
    ref, cands = _data()
    single = GradientScorer(model, SPECS[spec_key])
    single.set_reference(ref)
    want = single.score(cands)
    out = _run(mode, spec_key)
    for _, scores, _ in out:
        for (cos, inner, norm), w in zip(scores, want, strict=True):
            assert abs(cos - w.cosine) <= 1e-5
            assert inner == pytest.approx(w.inner, rel=1e-5, abs=1e-9)
            assert norm == pytest.approx(w.grad_norm, rel=1e-5)
    if mode == "param":
        owned = [set(o) for _, _, o in out]
        assert owned[0] and owned[1] and not owned[0] & owned[1]
        assert owned[0] | owned[1] == set(single.params)


def test_partition_is_balanced_and_complete():
    sizes = {"a": 10, "b": 7, "c": 5, "d": 3, "e": 1}
    shards = partition(sizes, 2)
    assert sorted(sum(shards, [])) == sorted(sizes)
    loads = [sum(sizes[n] for n in s) for s in shards]
    assert abs(loads[0] - loads[1]) <= 1
