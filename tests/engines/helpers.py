"""Trajectory builders shared by the engine tests."""

from __future__ import annotations

import pytest
import torch

from compassplay.records import Generation, Trajectory


def make_traj(prompt: list[int], completion: list[int], reward: float, role="solver",
              task_type="deduction", logprobs: list[float] | None = None) -> Trajectory:
    gen = Generation(prompt_ids=prompt, completion_ids=completion,
                     logprobs=logprobs if logprobs is not None else [-1.0] * len(completion),
                     text="")
    return Trajectory(generation=gen, reward=reward, role=role, task_type=task_type)


def assert_reset_replays_first_step(learner, batch: list[Trajectory],
                                    initial: dict[str, torch.Tensor],
                                    roles: tuple[str | None, ...] = (None,)) -> None:
    """Two steps, `learner.reset(initial)`, then: version 0, the initial weights for every
    role in `roles` (None: the learner's default), and a step equal to the first."""
    first = learner.step(batch)
    learner.step(batch)
    learner.reset(initial)
    assert learner.weight_version == 0
    for role in roles:
        now = learner.state_dict_for_sync() if role is None else learner.state_dict_for_sync(role)
        assert all(torch.equal(now[k], initial[k]) for k in now)
    again = learner.step(batch)
    assert again.loss == pytest.approx(first.loss, rel=1e-6) and again.lr == first.lr
    assert again.grad_norm == pytest.approx(first.grad_norm, rel=1e-6)
