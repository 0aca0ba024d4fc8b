import subprocess
import sys
from pathlib import Path

import pytest

from compassplay.config import ConfigError, RunConfig, dump_config, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_configs_load():
    micro = load_config(ROOT / "compassplay/configs/micro.yaml")
    default = load_config(ROOT / "compassplay/configs/default.yaml")
    assert micro.model.source == "tiny"
    assert default.model.source == "smollm2-gguf"


def test_dotted_overrides_are_typed():
    cfg = load_config(ROOT / "compassplay/configs/micro.yaml",
                      ["pipeline.steps=7", "reward.kind=difficulty", "task.types=[deduction]",
                       "learner.lr=3e-4"])
    assert cfg.pipeline.steps == 7
    assert cfg.reward.kind == "difficulty"
    assert cfg.task.types == ["deduction"]
    assert cfg.learner.lr == pytest.approx(3e-4)


def test_unknown_key_names_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(bad)
    assert str(bad) in str(exc.value)
    assert "pipeline.stepz" in str(exc.value)
    assert "unknown key" in str(exc.value)


def test_wrong_type_and_range_name_field(tmp_path):
    with pytest.raises(ConfigError, match=r"solver\.n_samples"):
        load_config(None, ["solver.n_samples=many"])
    with pytest.raises(ConfigError, match=r"proposer\.top_p"):
        load_config(None, ["proposer.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"reward\.kind"):
        load_config(None, ["reward.kind=bogus"])


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["pipeline.steps"])
    with pytest.raises(ConfigError, match=r"run\.name: Input should be a valid string"):
        load_config(None, ["run.name.x=1"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["run.seed=1", "run.seed.x=2"])


def test_dump_round_trips():
    cfg = load_config(ROOT / "compassplay/configs/default.yaml", ["pipeline.steps=3"])
    again = RunConfig.model_validate(__import__("yaml").safe_load(dump_config(cfg)))
    assert again == cfg


def test_cli_config_error_exit_code_2_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  lr: fast\n")
    proc = subprocess.run([sys.executable, "-m", "compassplay.cli", "config", "show",
                           "--config", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "learner.lr" in proc.stderr and str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_config_show_prints_resolved_yaml():
    proc = subprocess.run([sys.executable, "-m", "compassplay.cli", "config", "show",
                           "--config", "configs/micro.yaml", "pipeline.steps=5"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "steps: 5" in proc.stdout


@pytest.mark.parametrize("name", ["micro", "micro_warm", "default"])
def test_laptop_configs_fit_a_two_cpu_cluster(name):
    """`ray start --head` on a 2-core laptop offers 2 CPUs: every actor of a laptop config
    (with evaluation on, too) must fit, or the run waits for resources that never come."""
    from compassplay.plan.resources import requests

    for extra in ([], ["eval.every_steps=1"]):
        cfg = load_config(name, extra)
        asked = sum(r.get("CPU", 0.0) for r in requests(cfg).values())
        assert asked <= 2.0, (name, extra, requests(cfg))
        assert all(r.get("GPU", 0.0) == 0 for r in requests(cfg).values())


# The paper's coding comparison (issue 14 item 7): one config per compared proposer reward, each
# the cosine config with only the reward (and the run name) changed.
PAPER_SCALE = {"paper_coding_7b": "cosine", "baseline_difficulty_7b": "difficulty",
               "baseline_soar_7b": "soar", "baseline_novelty_7b": "novelty",
               "ablation_cos_novelty_7b": "cos_novelty"}


@pytest.mark.parametrize("name,kind", sorted(PAPER_SCALE.items()))
def test_paper_scale_configs_differ_from_the_cosine_run_only_in_the_reward(name, kind):
    cfg = load_config(name).model_dump(mode="json")
    ref = load_config("paper_coding_7b").model_dump(mode="json")
    assert cfg["reward"]["kind"] == kind and cfg["run"]["name"] == name
    assert cfg["model"]["name_or_path"] == "Qwen/Qwen2.5-Coder-7B"
    # AZR's settings: 64 proposals per task type, K=6 references, 8 solver rollouts.
    assert (cfg["proposer"]["batch_size"], cfg["proposer"]["num_references"],
            cfg["solver"]["n_samples"]) == (64, 6, 8)
    if kind == "soar":  # SOAR's trained copy needs 141 GiB scorer GPUs (plan/memory.py):
        # the GPU size the memory plan checks against is the only other difference
        assert cfg["cluster"].pop("gpu_memory_gib") == 141
        assert ref["cluster"].pop("gpu_memory_gib") == 80
    for section in ref:
        if section not in ("run", "reward"):
            assert cfg[section] == ref[section], section
    reward_diff = {k for k in ref["reward"] if cfg["reward"][k] != ref["reward"][k]}
    assert reward_diff <= {"kind"} | {k for k in ref["reward"] if k.startswith("soar_")}


# The paper's Lean comparison: cos x novelty and its ablation arms, each the cos x novelty config
# with only the reward (and the run name) changed.
LEAN_PAPER_SCALE = {"paper_lean_7b": "cos_novelty", "ablation_lean_cos_7b": "cosine",
                    "baseline_lean_novelty_7b": "novelty",
                    "baseline_lean_difficulty_7b": "difficulty"}


@pytest.mark.parametrize("name,kind", sorted(LEAN_PAPER_SCALE.items()))
def test_lean_paper_configs_follow_sgs_and_differ_only_in_the_reward(name, kind):
    cfg = load_config(name)
    ref = load_config("paper_lean_7b").model_dump(mode="json")
    got = cfg.model_dump(mode="json")
    assert cfg.reward.kind == kind and cfg.run.name == name
    for section in ref:
        if section not in ("run", "reward"):
            assert got[section] == ref[section], section
    assert {k for k in ref["reward"] if got["reward"][k] != ref["reward"][k]} <= {"kind"}
    assert cfg.model.name_or_path == "deepseek-ai/DeepSeek-Prover-V2-7B"
    assert cfg.proposer.engine == cfg.solver.engine == "vllm"
    assert cfg.task.domain == "lean" and cfg.reward.reference == "local"
    lean = cfg.task.lean
    # SGS's iteration (every unsolved target, 8 proofs each); proved seeds only (g_ref is the
    # seed's verified proof); no instruction against copies (novelty is the reward's job)
    assert lean.targets_per_iteration == "all" and cfg.solver.n_samples == 8
    assert not lean.propose_before_proof and not lean.forbid_copies and lean.include_proof
    assert lean.target_file == "paper_lean_targets.jsonl"
    assert cfg.verifiers.lean.backend == "fleet" and cfg.verifiers.lean.scaling.max_actors > 1
    assert cfg.pipeline.steps == 150


def test_base_config_is_merged_section_by_section(tmp_path):
    (tmp_path / "parent.yaml").write_text("base: micro\npipeline: {steps: 9}\n"
                                          "reward: {kind: inner, eta: 0.5}\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\nreward: {kind: novelty}\n")
    cfg = load_config(tmp_path / "child.yaml")
    micro = load_config("micro")
    assert cfg.pipeline.steps == 9                    # from the parent
    assert cfg.reward.kind == "novelty" and cfg.reward.eta == 0.5   # merged key by key
    assert cfg.model == micro.model                   # from the shipped grandparent
    assert load_config(tmp_path / "child.yaml", ["pipeline.steps=3"]).pipeline.steps == 3


def test_bad_base_names_the_file(tmp_path):
    loop_a, loop_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    loop_a.write_text("base: b.yaml\n")
    loop_b.write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"a.yaml: base: .*b.yaml: base: .*loop"):
        load_config(loop_a)
    missing = tmp_path / "m.yaml"
    missing.write_text("base: no_such_config\n")
    with pytest.raises(ConfigError, match=r"m.yaml: base: config file not found: no_such_config"):
        load_config(missing)
    wrong = tmp_path / "w.yaml"
    wrong.write_text("base: [micro]\n")
    with pytest.raises(ConfigError, match=r"w.yaml: base: must name a config"):
        load_config(wrong)
