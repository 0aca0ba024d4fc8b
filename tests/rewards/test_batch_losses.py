"""batch_losses drops the prompt positions' logits and changes no loss and no gradient."""

from __future__ import annotations

import pytest
import torch

from compassplay.rewards.batch import (
    Example,
    batch_losses,
    make_batch,
    packs_head,
    scoring_mode,
)
from tests.rewards.conftest import tiny_model

# longest prompt first: the batch's first loss-bearing column is the shortest prompt's last token
EXAMPLES = [Example([1, 2, 3, 4, 5, 6, 7], [8, 9]), Example([10, 11, 12, 13], [14, 15, 16]),
            Example([20, 21, 22, 23, 24, 25], [26])]


def _losses_and_grads(model, all_logits: bool, widths: list[int]):
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, args, out: widths.append(args[0].shape[1]))
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with scoring_mode(model):
            batch = make_batch(EXAMPLES, [0, 1, 2], torch.device("cpu"))
            losses = batch_losses(model, batch, all_logits=all_logits)
            grads = torch.autograd.grad(losses @ torch.tensor([1.0, -2.0, 0.5]), params)
    finally:
        hook.remove()
    return losses.detach(), grads


def test_dropping_prompt_logits_keeps_losses_and_gradients():
    model = tiny_model("llama", tied=True)
    trimmed_widths, full_widths = [], []
    trimmed, g_trim = _losses_and_grads(model, False, trimmed_widths)
    full, g_full = _losses_and_grads(model, True, full_widths)
    # width 9 (7 + 2); the first target is predicted from position 3 (4-token prompt)
    assert full_widths == [9] and trimmed_widths == [9 - 3]
    torch.testing.assert_close(trimmed, full, rtol=1e-6, atol=1e-7)
    for a, b in zip(g_trim, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert bool((full > 0).all())


def test_a_model_without_logits_to_keep_gets_every_position():
    class Plain(torch.nn.Module):  # forward(input_ids, position_ids, use_cache) only
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(40, 8)
            self.head = torch.nn.Linear(8, 40)

        def forward(self, input_ids, position_ids=None, use_cache=False):
            return (self.head(self.emb(input_ids)),)

    torch.manual_seed(0)
    model = Plain()
    batch = make_batch(EXAMPLES, [0, 1, 2], torch.device("cpu"))
    losses = batch_losses(model, batch)
    logits = model(batch.ids)[0]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), batch.labels.reshape(-1),
                                           ignore_index=-100, reduction="none").view(3, -1)
    torch.testing.assert_close(losses, (ce * batch.weights).sum(1))


def _frozen_head_losses(model, examples, all_logits: bool, head_rows: list[int],
                        inputs_embeds: torch.Tensor | None = None):
    """Losses and the gradients of the parameters below the head, the head frozen (as
    `grads_only_for` leaves it when the scored parameters are blocks)."""
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(
        lambda m, args, out: head_rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    frozen = [p for p in head.parameters()]
    for p in frozen:
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with scoring_mode(model):
            batch = make_batch(examples, list(range(len(examples))), torch.device("cpu"))
            assert packs_head(model)
            losses = batch_losses(model, batch, all_logits=all_logits,
                                  inputs_embeds=inputs_embeds)
            grads = torch.autograd.grad(losses @ torch.linspace(1.0, -2.0, len(examples)),
                                        params)
    finally:
        hook.remove()
        for p in frozen:
            p.requires_grad_(True)
    return losses.detach(), grads


@pytest.mark.parametrize("kind,tied", [("llama", True), ("qwen2", False), ("gpt2", True)])
def test_a_frozen_head_runs_on_the_target_positions_only(kind, tied):
    model = tiny_model(kind, tied=tied)
    packed_rows, full_rows = [], []
    packed, g_packed = _frozen_head_losses(model, EXAMPLES, False, packed_rows)
    full, g_full = _frozen_head_losses(model, EXAMPLES, True, full_rows)
    # 2 + 3 + 1 target tokens, against 3 rows x 9 columns
    assert packed_rows == [6] and full_rows == [27]
    torch.testing.assert_close(packed, full, rtol=1e-6, atol=1e-7)
    assert len(g_packed) > 4
    for a, b in zip(g_packed, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_packed_losses_from_inputs_embeds_and_row_weights():
    model = tiny_model("llama", tied=True, seed=3)
    batch = make_batch(EXAMPLES, [0, 1, 2], torch.device("cpu"), row_weights=[0.25, 0.5, 0.25])
    embeds = model.get_input_embeddings()(batch.ids).detach()
    for p in model.get_output_embeddings().parameters():
        p.requires_grad_(False)
    try:
        with scoring_mode(model):
            packed = batch_losses(model, batch, inputs_embeds=embeds)
            full = batch_losses(model, batch, all_logits=True, inputs_embeds=embeds)
    finally:
        model.requires_grad_(True)
    torch.testing.assert_close(packed, full, rtol=1e-6, atol=1e-7)
    assert not torch.equal(packed, batch_losses(model, make_batch(EXAMPLES, [0, 1, 2],
                                                                  torch.device("cpu"))))


def test_a_trainable_head_keeps_its_rows_by_example_unless_grad_is_off():
    model = tiny_model("qwen2", tied=False)
    assert not packs_head(model)  # its per-sample products need [N, T, V]
    batch = make_batch(EXAMPLES, [0, 1, 2], torch.device("cpu"))
    rows: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    with scoring_mode(model), torch.no_grad():  # as mean_example_loss runs
        assert packs_head(model)
        packed = batch_losses(model, batch)
        full = batch_losses(model, batch, all_logits=True)
    hook.remove()
    assert rows == [6, 27]
    torch.testing.assert_close(packed, full, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        assert not packs_head(torch.nn.Linear(2, 2))
