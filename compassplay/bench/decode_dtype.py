"""How far bfloat16 decoding moves the sampling distribution from float32's (bench generate).

Both static decoders run on the same token path, teacher-forced: the prompts, then the float32
decoder's greedy continuation. At every decoded position the two next-token distributions are
compared: the share of positions whose most likely token agrees, KL(float32 || bfloat16) in
nats (mean and max), the largest |difference| of a log-probability of the float32 choice, and
the largest |difference| of a logit. A sampled run sees the same distribution shift at each
token it draws (the two decoders' samples part ways once a draw falls on the other side).
"""

from __future__ import annotations

import json
from importlib import resources

import torch

from compassplay.engines.generation.static_decoder import StaticDecoder


def code_prompts(tokenizer, rows: int, tokens: int) -> list[list[int]]:
    """`rows` prompts of `tokens` tokens cut from the shipped seed programs (real code text,
    where a random-token prompt gives near-flat distributions whose top choice flips on any
    rounding). Row r starts r programs later."""
    text = resources.files("compassplay.data").joinpath("seed_programs.jsonl").read_text()
    programs = [json.loads(line)["snippet"] for line in text.splitlines() if line.strip()]
    out = []
    for r in range(rows):
        body = "\n\n".join(programs[r:] + programs[:r])
        ids = tokenizer.encode(body, add_special_tokens=False)
        while len(ids) < tokens:
            ids = ids + ids
        out.append(ids[:tokens])
    return out


def compare_decode_dtypes(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int,
                          dtype: torch.dtype = torch.bfloat16, kernels: str = "torch",
                          ref_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Teacher-forced comparison of `StaticDecoder(model)` in `ref_dtype` (float32; torch
    ops) and one in `dtype` (its decode steps on `kernels`: torch ops or `decode_kernels`) on
    equal-length `prompts` over `new_tokens` greedy tokens of the first (see the module doc)."""
    ids = torch.tensor(prompts)
    pad = torch.zeros(len(prompts), dtype=torch.long)
    ref = StaticDecoder(model, dtype=ref_dtype)
    low = StaticDecoder(model, dtype=dtype, kernels=kernels)
    agree, kls, dlp, dlogit = [], [], 0.0, 0.0
    with torch.no_grad():
        a = ref.start(ids, pad, ids.shape[1] + new_tokens)
        b = low.start(ids, pad, ids.shape[1] + new_tokens)
        for i in range(new_tokens):
            la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
            tok = a.argmax(-1)
            agree += (b.argmax(-1) == tok).tolist()
            kls += (la.exp() * (la - lb)).sum(-1).tolist()
            chosen = (la.gather(-1, tok[:, None]) - lb.gather(-1, tok[:, None])).abs()
            dlp = max(dlp, float(chosen.max()))
            dlogit = max(dlogit, float((a - b).abs().max()))
            if i + 1 < new_tokens:
                a, b = ref.step(tok), low.step(tok)
    return {"positions": len(agree), "top1_agreement": sum(agree) / len(agree),
            "kl_mean_nats": sum(kls) / len(kls), "kl_max_nats": max(kls),
            "max_abs_logprob_diff_of_choice": dlp, "max_abs_logit_diff": dlogit}
