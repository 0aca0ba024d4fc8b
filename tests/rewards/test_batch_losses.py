"""batch_losses drops the prompt positions' logits and changes no loss and no gradient."""

from __future__ import annotations

import torch

from compassplay.rewards.batch import Example, batch_losses, make_batch, scoring_mode
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
