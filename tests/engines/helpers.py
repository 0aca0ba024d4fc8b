"""Trajectory builders shared by the engine tests."""

from __future__ import annotations

from compassplay.records import Generation, Trajectory


def make_traj(prompt: list[int], completion: list[int], reward: float, role="solver",
              task_type="deduction", logprobs: list[float] | None = None) -> Trajectory:
    gen = Generation(prompt_ids=prompt, completion_ids=completion,
                     logprobs=logprobs if logprobs is not None else [-1.0] * len(completion),
                     text="")
    return Trajectory(generation=gen, reward=reward, role=role, task_type=task_type)
