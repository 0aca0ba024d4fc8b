"""The weights `StaticDecoder` multiplies: per block the module's tensors with q/k/v and
gate/up fused into one matrix each, in the decoder's matmul dtype; norms in float32."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Block:
    """One transformer block's weights in the decoder's dtype (detached views or copies)."""

    ln1: torch.Tensor   # [H] float32
    wqkv: torch.Tensor  # [(nh + 2 nkv) d, H]
    bqkv: torch.Tensor | None  # [(nh + 2 nkv) d] (Qwen2) or None
    wo: torch.Tensor    # [H, nh d]
    ln2: torch.Tensor   # [H] float32
    wgu: torch.Tensor   # [2 I, H]: gate rows then up rows
    wd: torch.Tensor    # [H, I]


def fused_weights(model: torch.nn.Module, dtype: torch.dtype
                  ) -> tuple[list[Block], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks, embedding [V, H] as stored (looked up, never multiplied), final norm [H]
    float32, head [V, H] in `dtype`) of a Llama/Qwen2 causal LM."""
    inner = model.model

    def w(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dtype)

    blocks = []
    for layer in inner.layers:
        at, mlp = layer.self_attn, layer.mlp
        bias = at.q_proj.bias
        blocks.append(Block(
            ln1=layer.input_layernorm.weight.detach().float(),
            wqkv=w(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])),
            bqkv=None if bias is None else w(torch.cat([bias, at.k_proj.bias, at.v_proj.bias])),
            wo=w(at.o_proj.weight),
            ln2=layer.post_attention_layernorm.weight.detach().float(),
            wgu=w(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
            wd=w(mlp.down_proj.weight)))
    return (blocks, inner.embed_tokens.weight.detach(), inner.norm.weight.detach().float(),
            w(model.get_output_embeddings().weight))
