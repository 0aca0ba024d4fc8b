"""Stand-ins for tests and the micro benchmark: a seeded tiny LM and on-policy trajectories.

(`compassplay.models.load_model` is the production path; these need no files or network.)
"""

from __future__ import annotations

import torch

from compassplay.records import Generation, Trajectory


def tiny_causal_lm(vocab_size: int = 260, seed: int = 0, hidden_size: int = 64,
                   num_layers: int = 2, tie: bool = True) -> torch.nn.Module:
    """A seeded random Qwen2 causal LM in float32 (eager attention, no dropout), with the
    byte tokenizer's special ids (eos 258, pad 259)."""
    from transformers import AutoModelForCausalLM

    from compassplay.config import TinyModelConfig
    from compassplay.models.loading import tiny_config

    t = TinyModelConfig(hidden_size=hidden_size, num_layers=num_layers,
                        intermediate_size=2 * hidden_size, max_positions=512, tie_embeddings=tie)
    cfg = tiny_config(t, vocab_size, pad_id=259, eos_id=258)
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).float()


def synthetic_trajectories(model: torch.nn.Module, n: int = 6, seed: int = 0,
                           roles: tuple[str, ...] = ("solver",)) -> list[Trajectory]:
    """Trajectories with behaviour log-probs recomputed from `model` (exactly on-policy);
    reward = fraction of completion bytes >= 65 ('A')."""
    from compassplay.engines.training.logprobs import pack, token_logprobs

    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        p = torch.randint(0, 256, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        c = torch.randint(60, 70, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g)
        gen = Generation(prompt_ids=p.tolist(), completion_ids=c.tolist(),
                         logprobs=[0.0] * len(c), text="")
        trajs.append(Trajectory(generation=gen, reward=float((c >= 65).float().mean()),
                                role=roles[i % len(roles)], task_type="deduction"))
    with torch.no_grad():
        b = pack([t.generation for t in trajs])
        lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
    out = []
    for i, t in enumerate(trajs):
        sel = lp[i][b["mask"][i] > 0].tolist()
        gen = t.generation.model_copy(update={"logprobs": sel})
        out.append(t.model_copy(update={"generation": gen}))
    return out
