"""Format bootstrap: a short supervised warm-up of the policy on the shipped seed programs.

A 135M model asked to propose and solve coding tasks in the run's exact format rarely writes
a usable task and almost never answers right (see `compassplay bench tasks --smollm2`). Before
self-play, `bootstrap.enabled` fine-tunes it on (prompt, reply) pairs rendered from the seed
set exactly as the run renders them (`step.prompting`: chat template, prefilled opening):

* proposer, deduction/abduction: the prompt shows `proposer.num_references` seeds as a run
  does; the reply is another seed's program and input, in the template's block layout;
* proposer, induction: the prompt shows an induction seed's program; the reply is its inputs
  and message;
* solver, every type: the prompt is a seed task; the reply is its gold answer.

Seeds only (never benchmark items). Loss on reply tokens only; the prompt runs without
gradient as a KV cache (`warmup.sft.completion_loss`). The result is cached once under the
model cache directory, keyed by the base model, the rendered examples and the recipe, and
built by the first process that needs it (`models.cache.prepare_cached`, concurrency-safe);
every role then loads the same weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from compassplay.config import BootstrapSection, RunConfig
from compassplay.engines.dtype_choice import resolve_autocast
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code import code_prompts as prompts
from compassplay.models.cache import prepare_cached
from compassplay.models.loading import load_model, model_cache_dir
from compassplay.records import Task
from compassplay.step.prompting import prefix_of, prompt_ids
from compassplay.warmup.sft import SFTExample, completion_loss

log = logging.getLogger(__name__)

WEIGHTS = "bootstrap.safetensors"
RECIPE_VERSION = 1  # bump when the example rendering or the training loop changes


def _reply(prefix: str, full: str) -> str:
    """The part of a well-formed reply after the prefilled `prefix`."""
    if not full.startswith(prefix):
        raise ValueError(f"reply {full[:40]!r} does not start with the prefill {prefix!r}")
    return full[len(prefix):]



def examples(cfg: RunConfig, tokenizer, rng: random.Random) -> list[SFTExample]:
    """The (prompt, reply) pairs of the recipe, token ids as the run builds them."""
    r = cfg.reward  # SOAR's held-out seeds stay out of the warm-up too
    env = CodeEnvironment(cfg.task, None, seed=cfg.run.seed,
                          num_references=cfg.proposer.num_references,
                          heldout=r.soar_heldout_items
                          if r.needs.heldout_loss and r.soar_heldout == "seeds" else 0)
    seeds = list(env.buffer)
    io = [t for t in seeds if t.task_type != "induction" and t.program.startswith("def f(")]
    ind = [t for t in seeds if t.task_type == "induction"
           and len(t.inputs) >= env.induction_inputs]
    out: list[SFTExample] = []
    eos = [tokenizer.eos_token_id]

    def add(kind: str, role: str, task_type: str, text: str, full: str) -> None:
        prefix = prefix_of(env, cfg, role, task_type)
        target = tokenizer.encode(_reply(prefix, full), add_special_tokens=False) + eos
        out.append(SFTExample(kind, prompt_ids(tokenizer, text, prefix), target))

    for task_type in cfg.task.types:
        if task_type == "induction":
            for t in ind:
                text = prompts.proposer_induction_prompt(t.program, env.induction_inputs,
                                                         cfg.task.answer_format)
                blocks = [prompts.fence("input", x) for x in t.inputs[:env.induction_inputs]]
                add("propose", "proposer", task_type, text,
                    "\n".join(blocks + [prompts.fence("message", t.message or "Find the rule.")]))
            continue
        for t in io:  # a different seed than the ones shown: write something new
            refs = rng.sample([s for s in io if s.task_id != t.task_id],
                              min(env.num_references, len(io) - 1))
            text = prompts.proposer_io_prompt(task_type, refs, env.banned,
                                              cfg.task.answer_format)
            add("propose", "proposer", task_type, text,
                prompts.fence("python", t.program) + "\n" + prompts.fence("input", t.inputs[0]))
    for task_type in cfg.task.types:
        pool = ind if task_type == "induction" else io
        for t in pool:
            task = t.model_copy(update={"task_type": task_type})
            if task_type == "induction":
                task = _induction_task(task, env)
            kind = {"deduction": "output", "abduction": "input", "induction": "python"}[task_type]
            add("solve", "solver", task_type, env.solver_prompt(task),
                prompts.fence(kind, env.gold_answer_text(task)))
    if cfg.bootstrap.max_examples and len(out) > cfg.bootstrap.max_examples:
        out = rng.sample(out, cfg.bootstrap.max_examples)
    return out


def _induction_task(t: Task, env: CodeEnvironment) -> Task:
    """An induction seed as the solver sees it (its inputs and outputs, message)."""
    n = env.induction_inputs
    return t.model_copy(update={"inputs": t.inputs[:n], "outputs": t.outputs[:n]})


def cache_key(cfg: RunConfig, exs: list[SFTExample]) -> str:
    """Base model + rendered examples + recipe -> a short hex key."""
    h = hashlib.sha256()
    m = cfg.model
    boot = cfg.bootstrap.model_dump()
    if boot["autocast"] == "none":  # the entries built before the field existed stay valid
        del boot["autocast"]
    h.update(json.dumps([m.source, m.name_or_path, m.dtype, RECIPE_VERSION, boot],
                        sort_keys=True).encode())
    for e in exs:
        h.update(json.dumps([e.kind, e.prompt, e.target]).encode())
    return h.hexdigest()[:16]


def train(model: torch.nn.Module, exs: list[SFTExample], pad_id: int, boot: BootstrapSection,
          seed: int, autocast: torch.dtype | None = None) -> list[float]:
    """AdamW over `boot.epochs` shuffled epochs of `boot.batch_size`; mean loss per epoch.
    `autocast`: the loss's forward passes under `torch.autocast` in that dtype (None: off)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=boot.lr, betas=(0.9, 0.98),
                            weight_decay=0.0)
    model.train()
    device = next(model.parameters()).device
    losses = []
    t0 = time.time()
    for epoch in range(boot.epochs):
        order = exs[:]
        rng.shuffle(order)
        order.sort(key=lambda e: e.kind)  # batches of one kind (similar prompt lengths)
        batches = [order[i:i + boot.batch_size] for i in range(0, len(order), boot.batch_size)]
        rng.shuffle(batches)
        total = 0.0
        for k, batch in enumerate(batches):
            with torch.autocast(device.type, dtype=autocast or torch.bfloat16,
                                enabled=autocast is not None):
                loss = completion_loss(model, batch, pad_id)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            total += float(loss.detach())
            if (k + 1) % 10 == 0:
                log.info("bootstrap epoch %d/%d: batch %d/%d, loss %.3f (%.0f s)", epoch + 1,
                         boot.epochs, k + 1, len(batches), total / (k + 1), time.time() - t0)
        losses.append(total / max(len(batches), 1))
    model.eval()
    return losses


def prepare_bootstrap(cfg: RunConfig, model: torch.nn.Module | None = None,
                      tok=None) -> Path | None:
    """The cached bootstrap entry for `cfg` (built now if missing); None when disabled.
    `model`/`tok`: the freshly loaded base model, if the caller has it (it is trained in
    place when the entry has to be built)."""
    if not cfg.bootstrap.enabled:
        return None
    if cfg.task.domain != "code":
        raise ValueError("bootstrap.enabled: the format bootstrap renders coding seeds; set "
                         "bootstrap.enabled=false for task.domain=lean")
    if tok is None:
        model, tok = load_model(cfg.model, seed=cfg.run.seed)
    exs = examples(cfg, tok, random.Random(cfg.bootstrap.seed))
    name = f"bootstrap-{cache_key(cfg, exs)}"

    def build(out: Path) -> None:
        nonlocal model
        if model is None:
            model = load_model(cfg.model, seed=cfg.run.seed)[0]
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        torch.manual_seed(cfg.bootstrap.seed)
        t0 = time.time()
        try:
            autocast = resolve_autocast(cfg.bootstrap.autocast, model,
                                        field="bootstrap.autocast")
            log.info("format bootstrap: %d examples (%d reply tokens), %d epochs%s; cached once",
                     len(exs), sum(len(e.target) for e in exs), cfg.bootstrap.epochs,
                     f", under torch.autocast({str(autocast).removeprefix('torch.')})"
                     if autocast else "")
            losses = train(model, exs, tok.pad_token_id, cfg.bootstrap, cfg.bootstrap.seed,
                           autocast)
        finally:
            torch.set_num_threads(threads)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(_untie(state), str(out / WEIGHTS))
        (out / "recipe.json").write_text(json.dumps({
            "examples": len(exs), "epoch_loss": losses, "seconds": round(time.time() - t0, 1),
            "autocast": str(autocast).removeprefix("torch.") if autocast else "none",
            "bootstrap": cfg.bootstrap.model_dump(), "model": cfg.model.source}, indent=2))

    return prepare_cached(model_cache_dir(cfg.model), name, build, what="format bootstrap")


def _untie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage (tied embeddings): give each name its own copy."""
    seen: dict[int, str] = {}
    out = {}
    for k, v in state.items():
        ptr = v.data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.setdefault(ptr, k)
    return out


def bootstrap_weights(cfg: RunConfig, tok) -> dict[str, torch.Tensor] | None:
    """The bootstrapped state dict (HF names; built now if missing), None when disabled: what
    a vLLM role loads into its engine in place, since vLLM starts from the base model."""
    entry = prepare_bootstrap(cfg, None, tok)
    return None if entry is None else load_file(str(entry / WEIGHTS))


def load_policy(cfg: RunConfig) -> tuple[torch.nn.Module, object]:
    """`load_model(cfg.model)`, with the bootstrap's weights when `bootstrap.enabled`."""
    model, tok = load_model(cfg.model, seed=cfg.run.seed)
    entry = prepare_bootstrap(cfg, model, tok)
    if entry is not None:
        missing, unexpected = model.load_state_dict(load_file(str(entry / WEIGHTS)),
                                                    strict=False)
        if missing or unexpected:
            raise KeyError(f"{entry}: bootstrap weights do not match the model: "
                           f"missing={missing[:5]} unexpected={unexpected[:5]}")
    return model, tok
