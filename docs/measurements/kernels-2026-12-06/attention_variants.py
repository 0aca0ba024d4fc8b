"""A decode step's attention over 30 blocks, bfloat16 keys/values, in the ways torch offers.

    python attention_variants.py 16 192 128    # bench generate's 16 x 64 + 128, late in the call
    python attention_variants.py 12 512 470    # the default job's proposer (12 rows, ~470 columns)

Arguments: rows B, cache capacity C, columns attended t. SmolLM2-135M's heads (3 key/value
heads, 3 queries each, d = 64). Prints the 10th percentile and the median of 20 repetitions
(ms per 30 blocks). Variants:
  A  the decoder's: keys cached transposed [B, nkv, d, C], q K^T and p V by matmul on the
     column slices, float32 scores and softmax (what `StaticDecoder._forward` runs)
  B  the same as explicit 3-D bmm on [B*nkv, ...] views
  C  scaled_dot_product_attention, bfloat16, with the additive mask
  D  A over the whole capacity (no slice, so no strided copy; masked columns)
  E  A with float32 caches, keys transposed;  F  float32, keys [C, d]
  G  scaled_dot_product_attention in float32;  H  SDPA bfloat16 without a mask
"""

import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
B, C, t = (int(a) for a in sys.argv[1:4])
nkv, g, d, L = 3, 3, 64, 30
dt = torch.bfloat16
KT = torch.randn(L, B, nkv, d, C).to(dt)
K = torch.randn(L, B, nkv, C, d).to(dt)
V = torch.randn(L, B, nkv, C, d).to(dt)
KTf, Kf, Vf = KT.float(), K.float(), V.float()
q = torch.randn(B, nkv, g, d)
mask = torch.zeros(B, 1, 1, C)
scale = d**-0.5


def A(i):
    s = torch.add(mask[..., :t], torch.matmul(q.to(dt), KT[i][..., :t]), alpha=scale)
    return torch.matmul(torch.softmax(s, -1).to(dt), V[i][:, :, :t])


def Bv(i):
    s = torch.bmm(q.to(dt).reshape(B * nkv, g, d), KT[i].reshape(B * nkv, d, C)[..., :t])
    p = torch.softmax(s.float() * scale, -1).to(dt)
    return torch.bmm(p, V[i].reshape(B * nkv, C, d)[:, :t])


def Cv(i):
    return F.scaled_dot_product_attention(
        q.to(dt).reshape(B, nkv * g, 1, d),
        K[i][:, :, :t],
        V[i][:, :, :t],
        attn_mask=mask[..., :t].to(dt),
        enable_gqa=True,
    )


def D(i):
    s = torch.add(mask, torch.matmul(q.to(dt), KT[i]), alpha=scale)
    return torch.matmul(torch.softmax(s, -1).to(dt), V[i])


def E(i):
    s = torch.add(mask[..., :t], torch.matmul(q, KTf[i][..., :t]), alpha=scale)
    return torch.matmul(torch.softmax(s, -1), Vf[i][:, :, :t])


def Fv(i):
    s = torch.add(mask[..., :t], torch.matmul(q, Kf[i][:, :, :t].transpose(-1, -2)), alpha=scale)
    return torch.matmul(torch.softmax(s, -1), Vf[i][:, :, :t])


def G(i):
    return F.scaled_dot_product_attention(
        q.reshape(B, nkv * g, 1, d),
        Kf[i][:, :, :t],
        Vf[i][:, :, :t],
        attn_mask=mask[..., :t],
        enable_gqa=True,
    )


def H(i):
    return F.scaled_dot_product_attention(
        q.to(dt).reshape(B, nkv * g, 1, d), K[i][:, :, :t], V[i][:, :, :t], enable_gqa=True
    )


def run(f, n=20):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        for i in range(L):
            f(i)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 10] * 1e3, ts[len(ts) // 2] * 1e3


for name, f in [
    ("A decoder", A),
    ("B bmm 3-D", Bv),
    ("C sdpa bf16", Cv),
    ("D whole capacity", D),
    ("E f32 K^T", E),
    ("F f32 K", Fv),
    ("G sdpa f32", G),
    ("H sdpa bf16 no mask", H),
    ("A decoder", A),
]:
    print(f"{name:20s} p10 / median ms per 30 blocks: %.2f / %.2f" % run(f))
