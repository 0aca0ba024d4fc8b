"""LeanEnvironment with the stand-in REPL: prompts, parsing, validation, grading, buffer."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from compassplay.config import ConfigError, load_config
from compassplay.envs.lean import LeanEnvironment
from compassplay.envs.lean import lean_prompts as prompts
from compassplay.envs.lean.statements import alpha_normal, parse_statement
from compassplay.envs.lean.targets import TargetFileError, load_targets
from compassplay.records import Attempt, Task
from compassplay.verifiers.lean.repl_pool import LeanPool

ROOT = Path(__file__).resolve().parents[3]
FAKE = [sys.executable, str(ROOT / "tests" / "verifiers" / "fake_lean_repl.py")]
TARGETS = Path(__file__).with_name("targets.jsonl")
MINIF2F = Path("/work/shared/data/minif2f.jsonl")


def lean_cfg(**extra):
    over = ["task.domain=lean", f"task.lean.target_file={TARGETS}"]
    return load_config(None, over + [f"{k}={v}" for k, v in extra.items()])


@pytest.fixture(scope="module")
def pool():
    with LeanPool(FAKE, processes=2, timeout_s=5.0, header_timeout_s=10) as p:
        yield p


@pytest.fixture()
def env(pool):
    return LeanEnvironment(lean_cfg(), pool)


def test_config_domain_switch():
    cfg = lean_cfg()
    assert cfg.task.types == ["lean_prove"]
    with pytest.raises(ConfigError, match="task.domain"):
        load_config(None, ["task.domain=lean", "task.types=[deduction]"])
    with pytest.raises(ConfigError, match="validate_timeout_s"):
        load_config(None, ["task.lean.validate_timeout_s=0"])


def test_targets_loader_errors(tmp_path):
    tasks, header = load_targets(TARGETS)
    assert [t.task_id for t in tasks] == ["target:add_zero", "target:two_two", "target:hard_one"]
    assert tasks[0].statement == "theorem add_zero' (n : ℕ) : n + 0 = n" and header
    assert [t.task_id for t in load_targets(TARGETS, "test")[0]] == ["target:hard_one"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TARGETS.read_text().splitlines()[0] + "\n{\"name\": \"x\"}\n")
    with pytest.raises(TargetFileError, match=r"bad.jsonl:2: .*formal_statement"):
        load_targets(bad)
    bad.write_text("not json\n")
    with pytest.raises(TargetFileError, match=r"bad.jsonl:1: not valid JSON"):
        load_targets(bad)
    with pytest.raises(TargetFileError, match="not found"):
        load_targets(tmp_path / "missing.jsonl")


def _sgs_entry(key: str, theorem: str, opens: str = "Real Nat") -> dict:
    return {"id": key, "header": f"import Mathlib\nopen {opens}\n\n", "theorem": theorem,
            "tag": "statement", "source": "d_3k", "proofs": []}


def test_sgs_target_file_loads_with_its_unusable_statements_left_out(tmp_path, caplog):
    """SGS's D_3k_prover_dataset.json layout (3,323 statements there: 50 have their ':= by'
    inside a line comment or cut off, 498 a `let`/`have` in the type):
    ids become names, a `let` in a statement's type does not end it (but leaves it out: one-line
    statements lose the line break that ends the `let`), and the most common header serves
    every target."""
    import json

    entries = [
        _sgs_entry("a1", "theorem lets  :\n  let k  : ℕ  := 2 -- two\n  k + k = 4 := by"),
        _sgs_entry("b2", "theorem plain (n  : ℕ)  : n + 0 = n := by"),
        _sgs_entry("c3", "theorem hidden (n  : ℕ)  :\n  n = n -- reflexivity := by"),
        _sgs_entry("d4", "theorem cplx (z  : ℂ)  : z = z := by", opens="Real Nat Complex"),
    ]
    path = tmp_path / "D_3k_prover_dataset.json"
    path.write_text(json.dumps({"iterations": [], "target_statements": {
        e["id"]: e for e in entries}}, indent=2))
    with caplog.at_level("WARNING"):
        tasks, header = load_targets(path)
    assert [t.task_id for t in tasks] == ["target:b2", "target:d4"]
    assert tasks[0].statement == "theorem plain (n : ℕ) : n + 0 = n"
    assert header == "import Mathlib\nopen Real Nat\n\n"
    assert "1 statements left out (no ':='" in caplog.text and "c3" in caplog.text
    assert "1 statements left out (a let" in caplog.text and "a1" in caplog.text
    assert "1 of 2 targets declare another header" in caplog.text
    from compassplay.verifiers.lean.responses import declaration_header
    assert declaration_header("theorem t : let k : ℕ := 2\n  k = 2 := by\n  let z := 3\n  rfl"
                              )[1] == "theorem t : let k : ℕ := 2 k = 2"  # (before: "... : let k : ℕ")
    path.write_text(json.dumps({"statements": []}))
    with pytest.raises(TargetFileError, match="needs an object 'target_statements'"):
        load_targets(path)


def test_target_file_by_name_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("COMPASSPLAY_DATA_DIR", raising=False)
    with pytest.raises(TargetFileError, match=r"not found .*COMPASSPLAY_DATA_DIR \(unset\)"):
        load_targets("mine.jsonl")
    (tmp_path / "mine.jsonl").write_text(TARGETS.read_text())
    monkeypatch.setenv("COMPASSPLAY_DATA_DIR", str(tmp_path))
    assert len(load_targets("mine.jsonl")[0]) == 3
    with pytest.raises(TargetFileError, match=f"other.jsonl: .*={tmp_path}"):
        load_targets("other.jsonl")


def test_prompts_and_parse(env, pool):
    early = LeanEnvironment(lean_cfg(**{"task.lean.propose_before_proof": True}), pool)
    text, seeds = early.proposer_prompt("lean_prove", random.Random(0))
    assert seeds[0].startswith("target:") and "sorry" in text  # no proved seed yet
    ok = env.parse_proposal("lean_prove", "```lean\nlemma foo (m : ℕ) : m * 1 = m := by sorry\n```",
                            ["target:add_zero"], "s0-lean_prove-1")
    assert ok.statement == "theorem conj_s0_lean_prove_1 (m : ℕ) : m * 1 = m"
    assert ok.seed_statement.startswith("theorem add_zero'") and not ok.invalid_reason
    for reply, reason in [("no code here", "parse:no_lean_block"), ("```lean\n```", "parse:empty_block"),
                          ("```lean\ndef x := 1\n```", "parse:no_theorem"),
                          ("```lean\ntheorem t : 1 = 1\n```", "parse:no_assign"),
                          ("```lean\ntheorem t : True axiom f : False theorem u : 1 = 1 := by sorry```",
                           "parse:banned_axiom")]:
        t = env.parse_proposal("lean_prove", reply, ["target:add_zero"], "p")
        assert t.invalid_reason == reason and not t.valid
    assert "do not change the statement" in env.solver_prompt(ok)


def test_the_final_block_is_the_answer(env):
    """A prover writes its plan (with code snippets) first and the whole proof last; the
    proposer may restate the seed before its conjecture: the last declaring block counts."""
    plan = ("Plan: first show the base case.\n```lean4\nhave h : 0 + 0 = 0 := by simp\n```\n"
            "Then the proof:\n")
    seed = "```lean\ntheorem add_zero' (n : ℕ) : n + 0 = n := by sorry\n```\nA new one:\n"
    t = env.parse_proposal("lean_prove", seed + "```lean\nlemma foo (m : ℕ) : m * 1 = m := by "
                           "sorry\n```", ["target:add_zero"], "p1")
    assert t.statement == "theorem conj_p1 (m : ℕ) : m * 1 = m" and not t.invalid_reason
    task = t.model_copy(update={"valid": True})
    att = env.parse_attempt(task, plan + "```lean4\n" + task.statement + " := by simp\n```", 0)
    assert att.answer == task.statement + " := by simp" and not att.parse_error
    tactics = env.parse_attempt(task, "```lean\nby omega\n```\n```lean\nby simp\n```\n```\n```", 1)
    assert tactics.answer == task.statement + " := by simp"  # no declaring block: last non-empty


def test_proposer_prompt_does_not_forbid_copies(pool):
    """Paper: the copy shortcut is left to the reward (the novelty factor closes it); the ask
    not to copy is an opt-in (task.lean.forbid_copies)."""
    shown = {}
    for forbid in (False, True):
        env = LeanEnvironment(lean_cfg(**{"task.lean.forbid_copies": forbid}), pool)
        env.buffer.record("target:two_two", "theorem two_two : (2 : ℕ) + 2 = 4 := by decide")
        text, seeds = env.proposer_prompt("lean_prove", random.Random(0))
        assert seeds == ["target:two_two"] and "by decide" in text and "it has proved" in text
        shown[forbid] = text
    for word in ("copy", "renam", "new ", "novel", "different"):
        assert word not in shown[False].lower(), word
    assert "not be a copy or a renaming" in shown[True]
    assert shown[True].replace(prompts.NO_COPIES, "") == shown[False]


def test_validate_and_grade(env):
    mk = lambda i, body: env.parse_proposal("lean_prove", f"```lean\n{body} := by sorry\n```",  # noqa: E731
                                            ["target:two_two"], f"c{i}")
    tasks = env.validate([mk(0, "theorem a (n : ℕ) : n + 1 = 1 + n"),
                          mk(1, "theorem b : UNKNOWN_thing = 1"),
                          mk(2, "theorem c : FAKE_CRASH = 1")])
    assert [t.valid for t in tasks] == [True, False, False]
    assert [t.invalid_reason for t in tasks[1:]] == ["lean:error", "lean:crash"]
    good = tasks[0]
    atts = [env.parse_attempt(good, "```lean\n" + good.statement + " := by omega\n```", 0),
            env.parse_attempt(good, "```lean\nby simp\n```", 1),
            env.parse_attempt(good, "```lean\n" + good.statement + " := by exact foo\n```", 2),
            env.parse_attempt(good, "```lean\ntheorem " + good.statement.split()[1]
                              + " (n : ℕ) : n = n := by rfl\n```", 3),
            env.parse_attempt(good, "nothing", 4),
            env.parse_attempt(good, "```lean\naxiom cheat : False\n" + good.statement
                              + " := by rfl\n```", 5)]
    assert atts[5].parse_error == "banned_axiom"
    verdicts = env.grade([(good, a) for a in atts])
    assert [v.correct for v in verdicts] == [True, True, False, False, False, False]
    assert [v.status for v in verdicts] == ["ok", "ok", "ok", "statement_changed", "parse_error",
                                            "parse_error"]
    sol = env.verified_solution(good, atts, verdicts)
    assert sol.startswith("```lean\n") and "omega" in sol
    assert env.verified_solution(good, atts[2:], verdicts[2:]) is None


def test_chunked_checks_give_the_same_verdicts(env, pool):
    one = LeanEnvironment(lean_cfg(**{"task.lean.check_chunk": 1}), pool)
    mk = lambda e, i, body: e.parse_proposal("lean_prove",  # noqa: E731
                                             f"```lean\n{body} := by sorry\n```",
                                             ["target:two_two"], f"c{i}")
    bodies = ["theorem a (n : ℕ) : n + 1 = 1 + n", "theorem b : UNKNOWN_x = 1",
              "theorem c : (1 : ℕ) = 1"]
    tasks = {e: e.validate([mk(e, i, b) for i, b in enumerate(bodies)]) for e in (env, one)}
    assert [t.valid for t in tasks[one]] == [t.valid for t in tasks[env]] == [True, False, True]
    pairs = {e: [(t, e.parse_attempt(t, f"```lean\nby {p}\n```", k))
                 for t in tasks[e] for k, p in enumerate(["omega", "exact foo"])]
             for e in (env, one)}
    got = {e: [(v.correct, v.status) for v in e.grade(pairs[e])] for e in (env, one)}
    assert got[one] == got[env] and [c for c, _ in got[env]] == [True, False] * 1 + [
        False, False] + [True, False]


def test_buffer_coverage_and_state_round_trip(env, pool):
    rng = random.Random(1)
    unsolved = env.sample_buffer(1, rng)  # every unsolved target (k is the coding setting)
    assert len(unsolved) == 3 and all(t.source == "seed" for t in unsolved)
    target = env.seed_of("target:two_two")
    att = Attempt(task_id=target.task_id, index=0, answer=target.statement + " := by decide")
    [v] = env.grade([(target, att)])
    assert v.correct
    out = env.record_results([target], [att], [v])
    assert out == {"new_proofs": 1.0, "coverage": pytest.approx(1 / 3), "targets_proved": 1.0,
                   "targets_attempted": 1.0}
    assert len(env.sample_buffer(1, rng)) == 2
    text, seeds = env.proposer_prompt("lean_prove", rng)
    assert seeds == ["target:two_two"] and "decide" in text
    conj = env.parse_proposal("lean_prove", "```lean\ntheorem z : (3 : ℕ) + 3 = 6 := by sorry\n```",
                              seeds, "c")
    assert conj.seed_solution.endswith("by decide")
    prompt, ref = env.local_reference(conj)
    assert "two_two" in prompt and "decide" in ref
    fresh = LeanEnvironment(lean_cfg(), pool)
    fresh.load_state_dict(env.state_dict())
    assert fresh.buffer.proofs == env.buffer.proofs and fresh.buffer.coverage() == env.buffer.coverage()


def test_alpha_normal_and_step_metrics(env):
    a = "theorem t (x y : ℤ) (h₀ : 0 < y) : ∀ z : ℕ, z + x = y"
    b = "theorem u (a b : ℤ) (hb : 0 < b) : ∀ w : ℕ, w + a = b"
    assert alpha_normal(a) == alpha_normal(b)
    assert alpha_normal(a) != alpha_normal("theorem u (a b : ℤ) (hb : 0 < a) : ∀ w : ℕ, w + a = b")
    seed = env.seed_of("target:hard_one").statement
    ren = Task(task_id="r", task_type="lean_prove", valid=True, seed_statement=seed,
               statement="theorem conj_r (a b : ℤ) (ha : 0 < b) (hb : b < a) : a * b ≠ 0")
    new = Task(task_id="n", task_type="lean_prove", valid=True, seed_statement=seed,
               statement="theorem conj_n (p : ℕ) (hp : Nat.Prime p) : 2 ≤ p")
    copy = Task(task_id="c", task_type="lean_prove", valid=True, seed_statement=seed,
                statement=seed.replace("hard_one", "conj_c"))
    out_of_band = copy.model_copy(update={"task_id": "o"})
    m = env.step_metrics([ren, new, copy, out_of_band], {"r": 0.5, "n": 0.25, "c": 0.75,
                                                         "o": 1.0}, [])
    assert m == {"copy_rate": pytest.approx(1 / 3), "rename_rate": pytest.approx(2 / 3)}
    # copies are counted on the tokens given (the run's novelty tokens): with one token for
    # any text every in-band conjecture is a copy; renames do not depend on tokens
    one = env.step_metrics([ren, new, copy], {"r": 0.5, "n": 0.25, "c": 0.75}, [],
                           lambda text: ["t"])
    assert one == {"copy_rate": 1.0, "rename_rate": pytest.approx(2 / 3)}


@pytest.mark.skipif(not MINIF2F.is_file(), reason="needs /work/shared/data/minif2f.jsonl")
def test_real_minif2f_loads():
    tasks, header = load_targets(MINIF2F)
    assert len(tasks) == 488 and "import Mathlib" in header
    assert all(parse_statement(t.statement + " := by")[1] == "" for t in tasks)
