"""The format bootstrap: examples rendered as the run renders them, trained once, cached."""

import hashlib
import json
import random

import torch
from safetensors.torch import load_file

from compassplay.config import load_config
from compassplay.envs.code import CodeEnvironment
from compassplay.models.loading import load_model
from compassplay.warmup import bootstrap


def _cfg(tmp_path, *extra):
    return load_config("micro", ["task.types=[deduction,abduction,induction]",
                                 "task.seed_file=simple", "proposer.prefill=true",
                                 "proposer.template=true", "solver.prefill=true",
                                 "solver.template=true", "bootstrap.enabled=true",
                                 "bootstrap.batch_size=16", f"model.cache_dir={tmp_path}",
                                 *extra])


def test_examples_are_the_runs_prompts_and_well_formed_replies(tmp_path):
    cfg = _cfg(tmp_path)
    _, tok = load_model(cfg.model)
    exs = bootstrap.examples(cfg, tok, random.Random(0))
    env = CodeEnvironment(cfg.task, None, seed=0)
    n_io = sum(t.task_type != "induction" for t in env.buffer)
    n_ind = sum(t.task_type == "induction" for t in env.buffer)
    assert sum(e.kind == "propose" for e in exs) == 2 * n_io + n_ind
    assert sum(e.kind == "solve" for e in exs) == 2 * n_io + n_ind
    for e in exs:
        assert e.target[-1] == tok.eos_token_id
        text = tok.decode(e.prompt + e.target, skip_special_tokens=True)
        assert "```" in text
    # a proposer reply parses back into a task, through the environment's own parser
    first = next(e for e in exs if e.kind == "propose")
    reply = tok.decode(first.target[:-1])
    task = env.parse_proposal("deduction", "```python\ndef f(" + reply, [], "x")
    assert task.invalid_reason == "" and task.program.startswith("def f(")


def test_bootstrap_trains_once_then_loads_from_the_cache(tmp_path, caplog):
    cfg = _cfg(tmp_path, "bootstrap.epochs=1", "bootstrap.lr=1e-3")
    base, _ = load_model(cfg.model, seed=cfg.run.seed)
    model, _ = bootstrap.load_policy(cfg)
    entries = [p for p in tmp_path.iterdir() if p.name.startswith("bootstrap-")
               and p.is_dir()]
    assert len(entries) == 1 and (entries[0] / bootstrap.WEIGHTS).exists()
    changed = [n for (n, p), q in zip(model.named_parameters(), base.parameters(), strict=True)
               if not torch.equal(p, q)]
    assert changed
    again, _ = bootstrap.load_policy(cfg)  # from the cache: same weights, no training
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
    # another recipe is another entry
    bootstrap.prepare_bootstrap(_cfg(tmp_path, "bootstrap.epochs=2", "bootstrap.lr=1e-3"))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("bootstrap-")
                and p.is_dir()]) == 2
    assert bootstrap.prepare_bootstrap(load_config("micro", [])) is None


def test_a_vllm_role_loads_the_bootstrapped_weights_into_its_engine(tmp_path, monkeypatch):
    """vLLM starts from the base model; the role loads the bootstrap's state in place (version
    0), so a vLLM run generates from the same weights as its learner."""
    from safetensors.torch import load_file

    from compassplay.engines.generation.vllm import VLLMGenerationEngine
    from compassplay.workers import generator_workers
    from compassplay.workers.generator_workers import SolverWorker
    from tests.engines.fake_vllm import FakeLLM, fake_sampling_params

    tiny = _cfg(tmp_path)
    base, tok = load_model(tiny.model, seed=tiny.run.seed)
    base.save_pretrained(tmp_path / "model")  # a folder, as vLLM loads a model
    tok.save_pretrained(tmp_path / "model")
    cfg = _cfg(tmp_path, "bootstrap.epochs=1", "bootstrap.lr=1e-3", "solver.engine=vllm",
               "model.source=local", f"model.name_or_path={tmp_path / 'model'}")
    llm = FakeLLM({k: v.clone() for k, v in base.state_dict().items()})
    # no vLLM here: the engine holds the base weights as vLLM would after loading the folder
    monkeypatch.setattr(generator_workers, "make_generator", lambda cfg, sec, model, tok, dev, **kw:
                        VLLMGenerationEngine("unused", tokenizer=tok, llm=llm,
                                             sampling_params_cls=fake_sampling_params,
                                             device="cpu"))
    role = SolverWorker(cfg)
    entry = bootstrap.prepare_bootstrap(cfg)
    boot = load_file(str(entry / bootstrap.WEIGHTS))
    held = llm.workers[0].model.params
    assert role.engine.weight_version == 0
    assert all(torch.equal(held[k], boot[k]) for k in held)
    assert any(not torch.equal(held[k], v) for k, v in base.state_dict().items())


def test_bootstrap_under_autocast_is_its_own_entry_and_says_so(tmp_path):
    """bootstrap.autocast=bfloat16 trains under torch.autocast (a different result from the
    float32 warm-up, its own cache entry, recorded in recipe.json); "none" keeps the key the
    entries built before the field existed had."""
    plain = _cfg(tmp_path, "bootstrap.lr=1e-3", "bootstrap.max_examples=8")
    cast = _cfg(tmp_path, "bootstrap.lr=1e-3", "bootstrap.max_examples=8",
                "bootstrap.autocast=bfloat16")
    _, tok = load_model(plain.model)
    exs = bootstrap.examples(plain, tok, random.Random(0))
    key = bootstrap.cache_key(plain, exs)
    boot = plain.bootstrap.model_dump()
    del boot["autocast"]  # the key of an entry built before bootstrap.autocast existed
    m = plain.model
    h = hashlib.sha256(json.dumps([m.source, m.name_or_path, m.dtype, bootstrap.RECIPE_VERSION,
                                   boot], sort_keys=True).encode())
    for e in exs:
        h.update(json.dumps([e.kind, e.prompt, e.target]).encode())
    assert key == h.hexdigest()[:16]
    assert bootstrap.cache_key(cast, exs) != key
    a = bootstrap.prepare_bootstrap(plain)
    b = bootstrap.prepare_bootstrap(cast)
    assert a != b
    assert json.loads((a / "recipe.json").read_text())["autocast"] == "none"
    assert json.loads((b / "recipe.json").read_text())["autocast"] == "bfloat16"
    wa, wb = (load_file(str(p / bootstrap.WEIGHTS)) for p in (a, b))
    assert wa.keys() == wb.keys()
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
    assert all(wb[k].dtype == wa[k].dtype for k in wa)  # float32 weights either way


def test_train_runs_the_loss_under_autocast(monkeypatch, tmp_path):
    """The loss's forward passes see torch.autocast enabled in the dtype asked for."""
    cfg = _cfg(tmp_path, "bootstrap.max_examples=4", "bootstrap.batch_size=4")
    model, tok = load_model(cfg.model)
    exs = bootstrap.examples(cfg, tok, random.Random(0))[:4]
    seen = []
    real = bootstrap.completion_loss

    def spy(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(bootstrap, "completion_loss", spy)
    bootstrap.train(model, exs, tok.pad_token_id, cfg.bootstrap, 0, torch.bfloat16)
    bootstrap.train(model, exs, tok.pad_token_id, cfg.bootstrap, 0, None)
    assert seen == [(True, torch.bfloat16), (False, seen[1][1])]
