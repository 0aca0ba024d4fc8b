from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from compassplay.config import LearnerSection
from compassplay.engines import SamplingParams, StaleWeightsError, make_learner
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.training.dist import free_port
from tests.tiny_models import synthetic_trajectories, tiny_causal_lm

P = SamplingParams(max_new_tokens=4, seed=0)


def test_engine_versions_only_go_forward(tokenizer):
    """The object-store path: an engine loads a newer state dict and refuses an older one."""
    learner_model, gen_model = tiny_causal_lm(seed=0), tiny_causal_lm(seed=0)
    learner = make_learner(LearnerSection(lr=1e-2), learner_model)
    engine = HFGenerationEngine(gen_model, tokenizer)
    before = engine.generate([[1, 2, 3]], P)[0]
    learner.step(synthetic_trajectories(learner_model, n=4))
    v1 = {k: t.clone() for k, t in learner.state_dict_for_sync().items()}
    engine.load_weights(v1, learner.weight_version)
    after = engine.generate([[1, 2, 3]], P)[0]
    assert after.weight_version == 1 and before.weight_version == 0
    assert after.logprobs != before.logprobs
    learner.step(synthetic_trajectories(learner_model, n=4))
    engine.load_weights(learner.state_dict_for_sync(), learner.weight_version)
    with pytest.raises(StaleWeightsError):
        engine.load_weights(v1, 1)
    assert engine.weight_version == 2


@pytest.mark.parametrize("decoder", ["static", "hf"])
def test_generate_never_mixes_versions(tokenizer, decoder):
    model = tiny_causal_lm(seed=0)
    engine = HFGenerationEngine(model, tokenizer, decoder=decoder)
    new_state = tiny_causal_lm(seed=5).state_dict()
    started, proceed = threading.Event(), threading.Event()
    calls = []
    # a module each decoder calls inside generate: the static decoder computes its rotary
    # tables once per call (call 1), the module's own forward runs once per token (call 2)
    hooked, pause_at = (model.model.rotary_emb, 1) if decoder == "static" else (model, 2)

    def hook(module, args, kwargs):
        calls.append(1)
        if len(calls) == pause_at:  # inside the first generate
            started.set()
            assert proceed.wait(30)

    handle = hooked.register_forward_pre_hook(hook, with_kwargs=True)
    out: dict[str, list] = {}
    gen = threading.Thread(target=lambda: out.setdefault("a", engine.generate([[1], [2]], P)))
    gen.start()
    assert started.wait(30)
    loader = threading.Thread(target=engine.load_weights, args=(new_state, 1))
    loader.start()
    loader.join(0.3)
    assert loader.is_alive() and engine.weight_version == 0  # blocked by the running generate
    proceed.set()
    gen.join(30)
    loader.join(30)
    handle.remove()
    assert [g.weight_version for g in out["a"]] == [0, 0]
    assert engine.weight_version == 1
    assert all(g.weight_version == 1 for g in engine.generate([[1], [2]], P))


WORKER = """
import os, sys, torch
from compassplay.sync.buckets import NCCLBroadcastSync
rank = int(os.environ["RANK"])
torch.distributed.init_process_group("gloo", rank=rank, world_size=2)

class Comm:  # the default process group as a Broadcaster
    def broadcast(self, tensor, src):
        torch.distributed.broadcast(tensor, src)
    def broadcast_object(self, obj, src):
        box = [obj]
        torch.distributed.broadcast_object_list(box, src)
        return box[0]

sync = NCCLBroadcastSync(Comm(), src=0, bucket_bytes=1000, device="cpu")
torch.manual_seed(0)
state = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.bfloat16),
         "c": torch.randn(400), "d": torch.tensor([True, False, True])}
if rank == 0:
    sync.send(state, 7)
    ok = True
else:
    got, version = sync.receive()
    ok = version == 7 and list(got) == list(state) and all(
        got[k].dtype == state[k].dtype and torch.equal(got[k], state[k]) for k in state)
torch.distributed.destroy_process_group()
sys.exit(0 if ok else 3)
"""


@pytest.mark.slow
def test_bucketed_broadcast_over_gloo():
    """The NCCL code path, run over gloo between two CPU processes (mixed dtypes, >1 bucket)."""
    port = str(free_port("127.0.0.1"))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], env={
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
        "RANK": str(r)}) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
