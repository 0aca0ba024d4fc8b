"""Templated replies for small models: the code environment's templates, the shipped short
seed set, and the propose/solve stages with templates on a tiny random model."""

import pytest

from compassplay.config import ConfigError, TaskSection, load_config
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.seeds import load_seeds
from compassplay.models import load_model
from compassplay.step import stages


def test_templates_open_each_block_of_a_well_formed_reply(env):
    io = env.response_template("proposer", "deduction", 100)
    assert [s.then for s in io] == ["\n```input\n", ""]
    assert io[0].max_tokens == 100 and io[1].max_tokens <= 40
    ind = env.response_template("proposer", "induction", 100)
    assert len(ind) == env.induction_inputs + 1
    assert [s.then for s in ind].count("\n```input\n") == env.induction_inputs - 1
    assert ind[-2].then == "\n```message\n" and ind[-1].then == ""
    assert env.response_template("solver", "abduction", 30)[0].max_tokens == 30
    # a reply that follows the template parses: prefix + blocks with the forced fences
    text = env.response_prefix("proposer", "deduction") + "x):\n    return x + 1\n```" \
        + io[0].then + "3\n```"
    task = env.parse_proposal("deduction", text, [], "t")
    assert task.invalid_reason == "" and task.inputs == ["3"]


def test_think_answer_has_no_template(runner):
    env = CodeEnvironment(TaskSection(answer_format="think_answer"), runner, seed=0)
    assert env.response_template("proposer", "deduction", 64) == ()


def test_shipped_simple_seed_set_is_valid_and_short(runner):
    tasks, skipped = load_seeds("simple", TaskSection().banned_modules)
    assert len(tasks) == 36 and not skipped
    assert sum(t.task_type == "induction" for t in tasks) == 6
    env = CodeEnvironment(TaskSection(seed_file="simple"), runner, seed=0)
    fresh = [t.model_copy(update={"valid": False, "outputs": []}) for t in tasks]
    checked = env.validate(fresh)
    assert all(c.valid for c in checked), [c.invalid_reason for c in checked if not c.valid]
    assert [c.outputs[0] for c in checked] == [t.outputs[0] for t in tasks]
    assert max(t.program.count("\n") for t in tasks) <= 4
    with pytest.raises(FileNotFoundError, match="task.seed_file"):
        load_seeds("no/such/file.jsonl", [])


def test_template_config_needs_prefill_on_either_engine():
    with pytest.raises(ConfigError, match="prefill"):
        load_config(None, ["proposer.template=true", "proposer.prefill=false"])
    cfg = load_config(None, ["solver.template=true", "solver.prefill=true",
                             "solver.engine=vllm"])  # vLLM's structured outputs
    assert cfg.solver.template and cfg.solver.engine == "vllm"


def test_templated_stages_parse_every_reply_of_a_random_model(runner):
    """The micro model (random weights) never writes a fence; templated, every proposal and
    attempt has its blocks, so no failure is a parse failure of a missing block."""
    over = ["task.types=[deduction,induction]", "proposer.batch_size=2",
            "proposer.prefill=true", "proposer.template=true", "proposer.max_new_tokens=200",
            "proposer.segment_max_tokens=12", "solver.prefill=true", "solver.template=true",
            "solver.max_new_tokens=16", "solver.n_samples=2"]
    cfg = load_config("micro", over)
    model, tok = load_model(cfg.model, seed=0)
    engine = HFGenerationEngine(model, tok)
    env = CodeEnvironment(cfg.task, runner, seed=0)
    out = stages.propose(env, engine, tok, cfg, step=0)
    assert len(out.tasks) == 4
    for t in out.tasks:
        assert not t.invalid_reason.startswith("parse:no_"), t.invalid_reason
        assert not t.invalid_reason.startswith("parse:unclosed"), t.invalid_reason
        assert t.proposal.finish_reason == "stop"
    atts = stages.solve(env, engine, tok, cfg, out.seed_tasks, step=0)
    assert atts and all(a.generation.finish_reason == "stop" for a in atts)
    assert not any(a.parse_error.startswith(("no_", "unclosed")) for a in atts)
