"""A generation the engine failed (prompt rejected, request aborted) marks its task invalid
with the reason, is not trained on, and the step records each role's weight version."""

from __future__ import annotations

from compassplay.config import load_config
from compassplay.engines.generation.base import GenerationEngine, SamplingParams
from compassplay.engines.training.learner import LearnerStats
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from compassplay.records import Generation
from compassplay.step import stages
from compassplay.workers.builders import make_env


class FirstRejected(GenerationEngine):
    """Rejects the first prompt of each call (as the vLLM engine does an over-long one)."""

    weight_version = 3

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = [Generation(prompt_ids=p, completion_ids=[65], logprobs=[-1.0], text="A",
                          weight_version=3) for p in prompts]
        out[0] = Generation(prompt_ids=prompts[0], completion_ids=[], logprobs=[], text="",
                            weight_version=3, finish_reason="rejected", error="too long")
        return out

    def load_weights(self, state, version: int) -> None:  # pragma: no cover - unused
        raise AssertionError


def test_rejected_proposal_is_invalid_with_its_reason_and_not_trained_on():
    cfg = load_config(None, ["task.types=[deduction]", "proposer.batch_size=2"])
    env = make_env(cfg, None)
    props = stages.propose(env, FirstRejected(), build_byte_tokenizer(), cfg, step=0)
    first = props.tasks[0]
    assert not first.valid and first.invalid_reason == "generation: too long"
    assert stages.validate(env, props.tasks)[0].invalid_reason == "generation: too long"
    trajs = stages.make_trajectories(env, props.tasks, [], [], [
        _score(t.task_id) for t in props.tasks])
    assert [t.task_id for t in trajs] == [props.tasks[1].task_id]
    stats = stages.summarize(0, props.tasks, {}, [], [], [], LearnerStats(
        loss=0.0, grad_norm=0.0, lr=0.0, clip_frac=0.0, kl=0.0, n_tokens=0, weight_version=4), {})
    assert stats.proposer_weight_version == 3 and stats.solver_weight_version is None
    assert stats.invalid_reasons.get("generation: too long") == 1


def _score(task_id: str):
    from compassplay.records import Score

    return Score(task_id=task_id, reward=0.0, kind="cosine", eligible=False, solve_rate=0.0)
