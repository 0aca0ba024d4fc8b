from __future__ import annotations

import math

import pytest
import torch

from compassplay.engines.training.policy_loss import k3_kl, ppo_loss

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])


def test_on_policy_loss_is_minus_token_mean_advantage():
    logp = torch.log(torch.rand(2, 3).clamp(0.1)).requires_grad_()
    t = ppo_loss(logp, logp.detach(), ADV, MASK, clip_eps=0.2)
    assert t.loss.item() == pytest.approx(-(1 + 1 - 2 - 2 - 2) / 5)
    assert t.clipped_tokens == 0 and t.n_tokens == 5
    t.loss.backward()  # on-policy gradient = -A/N * d logp
    assert torch.allclose(logp.grad, -ADV * MASK / 5)


def test_clipping_hand_values():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0]])
    t = ppo_loss(logp, old, adv, torch.ones(1, 2), clip_eps=0.2)
    # token 0: min(1.5, 1.2) = 1.2 ; token 1: min(0.5, 0.8) = 0.5
    assert t.loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert t.clipped_tokens == 2
    t = ppo_loss(logp, old, -adv, torch.ones(1, 2), clip_eps=0.2)
    # negative advantage: min(-1.5, -1.2) = -1.5 ; min(-0.5, -0.8) = -0.8
    assert t.loss.item() == pytest.approx((1.5 + 0.8) / 2)


def test_normalizer_and_kl():
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.9]]))
    t = ppo_loss(logp, logp, ADV[:1], MASK[:1], 0.2, ref_logp=logp, kl_coef=1.0, normalizer=4)
    assert t.kl_sum == 0.0 and t.loss.item() == pytest.approx(-2 / 4)
    ref = torch.log(torch.tensor([[0.4, 0.5, 0.9]]))
    kl = k3_kl(logp, ref)
    assert kl[0, 0].item() == pytest.approx(2 - math.log(2) - 1) and kl[0, 1].item() == 0
    t2 = ppo_loss(logp, logp, ADV[:1], MASK[:1], 0.2, ref_logp=ref, kl_coef=0.5)
    assert t2.loss.item() == pytest.approx(-1 + 0.5 * kl[0, 0].item() / 2)
