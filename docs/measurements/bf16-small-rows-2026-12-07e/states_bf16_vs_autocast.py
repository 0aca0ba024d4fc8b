"""How far a bfloat16 decoder's kept states (entering block 24 of SmolLM2-135M, the lowest
block `learner.trainable: last:6` trains) are from the learner's own, in float32 and under
bfloat16 autocast, and what they do to the log-probs of the top 6 blocks under autocast:
8 prompts cut from a source file, 48 sampled tokens each, 2 threads.

    PYTHONPATH=. python docs/measurements/bf16-small-rows-2026-12-07e/states_bf16_vs_autocast.py
"""

import json
from pathlib import Path

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.frozen_states import states_key
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.models import load_model
from compassplay.rewards.frozen_prefix import forward_entering, layers_from

K = 24
OUT = Path(__file__).with_name("states_bf16_vs_autocast.json")


def completion_logprobs(logits: torch.Tensor, seq: torch.Tensor, prompt: int) -> torch.Tensor:
    """Log-probs [C] of the completion's tokens from logits [1, n - 1, V]."""
    lp = torch.log_softmax(logits.float(), -1)[0, prompt - 1:]
    return lp.gather(-1, seq[0, prompt:, None])[:, 0]


def main() -> None:
    torch.set_num_threads(2)
    model, tok = load_model(MODELS["smollm2"], seed=0)
    model.eval()
    eng = HFGenerationEngine(model, tok, decode_dtype="bfloat16", decode_kernels="c",
                             capture_layer=K)
    ids = tok(Path("compassplay/step/stages.py").read_text())["input_ids"]
    prompts = [ids[i * 97: i * 97 + 60 + 9 * i] for i in range(8)]
    gens = eng.generate(prompts, SamplingParams(max_new_tokens=48, temperature=1.0, seed=0))
    states = eng.take_states()
    out = []
    for p, g in zip(prompts, gens, strict=True):
        seq = torch.tensor([p + g.completion_ids])
        handed = states[states_key(p, g.completion_ids)]  # [n - 1, H]
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        with torch.no_grad():
            own32 = forward_entering(model, K, input_ids=seq[:, :-1])[0]
            full32 = completion_logprobs(model(seq[:, :-1]).logits, seq, len(p))
            with autocast:
                own16 = forward_entering(model, K, input_ids=seq[:, :-1])[0].float()
                full16 = completion_logprobs(model(seq[:, :-1]).logits, seq, len(p))
                with layers_from(model, K):
                    from_handed = completion_logprobs(
                        model(inputs_embeds=handed[None]).logits, seq, len(p))
        scale = float(own32.abs().max())
        row = {"tokens": seq.shape[1], "completion": len(g.completion_ids),
               "handed_vs_own32_rel": float((handed - own32).abs().max()) / scale,
               "autocast_vs_own32_rel": float((own16 - own32).abs().max()) / scale,
               "handed_vs_autocast_rel": float((handed - own16).abs().max()) / scale}
        for name, a, b in (("handed_vs_autocast", from_handed, full16),
                           ("autocast_vs_float32", full16, full32),
                           ("handed_vs_float32", from_handed, full32)):
            row[f"lp_{name}_max"] = float((a - b).abs().max())
            row[f"lp_{name}_mean"] = float((a - b).abs().mean())
        out.append(row)
        print({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()})
    OUT.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
