from compassplay.records import (
    Attempt,
    Candidate,
    Generation,
    Score,
    StepStats,
    Task,
    Trajectory,
    Verdict,
)

GEN = Generation(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.25, -1.5e-7],
                 text="```output\n'é✓'\n```", weight_version=3, finish_reason="length")


def roundtrip(rec):
    again = type(rec).model_validate_json(rec.model_dump_json())
    assert again == rec
    assert again.model_dump() == rec.model_dump()
    return again


def test_all_records_round_trip_losslessly():
    task = Task(task_id="t1", task_type="induction", program="def f(x):\n    return x",
                inputs=["1", "'a'"], outputs=["1", "'a'"], message="identity",
                seed_ids=["s1"], proposal=GEN, valid=True)
    roundtrip(task)
    roundtrip(Attempt(task_id="t1", index=2, answer="1", generation=GEN))
    roundtrip(Verdict(task_id="t1", index=2, correct=True, status="ok"))
    roundtrip(Candidate(task_id="t1", task_type="deduction", solve_rate=0.25,
                        prompt_ids=[1, 2], target_ids=[3], novelty_tokens=[1], seed_tokens=[2]))
    roundtrip(Score(task_id="t1", reward=0.123456789012345, kind="cosine", eligible=True,
                    solve_rate=0.5, cosine=0.123456789012345, inner=-2.5, grad_norm=3.0))
    roundtrip(StepStats(step=1, weight_version=1, proposals=4, valid=2, eligible=1,
                        solve_rate_mean=0.5, reward_mean=0.1, reward_std=0.0,
                        reward_distinct=1, loss=0.3, grad_norm=1.0, solver_accuracy=0.5,
                        parse_failures={"parse:no_code": 2}, stage_seconds={"propose": 1.5},
                        by_task_type={"deduction": {"valid": 1.0}}))
    roundtrip(Trajectory(generation=GEN, reward=-0.5, role="solver", task_type="abduction"))


def test_float_precision_preserved():
    s = Score(task_id="x", reward=1 / 3, kind="cosine", eligible=True, solve_rate=2 / 3)
    again = roundtrip(s)
    assert again.reward == 1 / 3


def test_unknown_fields_rejected():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Verdict.model_validate({"task_id": "t", "index": 0, "correct": True, "bogus": 1})
