"""The scorer worker: builds a step's candidates, and computes one shard's gradient-alignment
partials (or SOAR utilities) for them; `step.scoring.merge_shards` combines the shards."""

from __future__ import annotations

import logging

import torch

from compassplay.config import ConfigError, RunConfig
from compassplay.engines.dtype_choice import resolve_autocast
from compassplay.records import Candidate
from compassplay.rewards.alignment import Partials
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.local_reference import group_references, local_partials
from compassplay.rewards.oracle import naive_partials, reference_grads
from compassplay.rewards.soar import make_groups, soar_gains
from compassplay.step import stages
from compassplay.step.graph import StageCall, WeightsOffer
from compassplay.step.heldout import make_heldout
from compassplay.step.messages import AttemptBatch, Candidates, GradeBatch, ScoredShard, Validated
from compassplay.step.prompting import candidate_examples
from compassplay.step.scoring import candidate_solutions
from compassplay.step.timing import Timing, timed
from compassplay.warmup.bootstrap import load_policy
from compassplay.workers.builders import (
    configure_process,
    make_env,
    make_reference,
    role_device,
    role_gpus,
    scorer_params,
)
from compassplay.workers.versioned import Versioned, Weights, split_metric

SCORER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
log = logging.getLogger(__name__)


def shard_names(names: list[str], shard: int, num_shards: int) -> list[str]:
    """Parameter names of `shard` out of `num_shards` (round-robin over the model's order)."""
    return names[shard::num_shards]


class ScorerWorker(Versioned):
    """Builds candidates and computes alignment partials for one shard.

    mode "replica": a full copy of the weights, scores candidates shard::num_shards.
    mode "param_shard": scores every candidate over the parameter names of this shard.
    The reference gradient is recomputed whenever the weight version changes.
    """

    def __init__(self, cfg: RunConfig, shard: int = 0, num_shards: int = 1) -> None:
        self.cfg = cfg
        self.shard, self.num_shards = shard, num_shards
        self.gpus = role_gpus(cfg, "scorer")
        configure_process(cfg)
        model, self.tok = load_policy(cfg)  # base model (+ bootstrap)
        # scorer.dtype on the actor's device (partials accumulate in float64)
        model = model.to(role_device(cfg, "scorer"), SCORER_DTYPES[cfg.scorer.dtype])
        params = scorer_params(cfg.scorer.params, model)
        if cfg.scorer.shard_mode == "param_shard" and num_shards > 1:
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            params = shard_names(names, shard, num_shards)
        self.local = cfg.reward.reference == "local"
        if self.local and isinstance(params, dict):
            raise ConfigError("reward.reference=local scores exactly: scorer.params must be "
                              "'all' or name globs, not a projection")
        self.local_params = params
        ref_autocast = resolve_autocast(cfg.scorer.reference_autocast, model,
                                        field="scorer.reference_autocast")
        if ref_autocast is not None:
            log.info("scorer: the reference gradient's passes under torch.autocast(%s) "
                     "(scorer.reference_autocast=%s); candidates' passes in %s",
                     str(ref_autocast).removeprefix("torch."), cfg.scorer.reference_autocast,
                     str(next(model.parameters()).dtype).removeprefix("torch."))
        self.scorer = GradientScorer(model, params=params, pad_id=self.tok.pad_token_id,
                                     max_batch_tokens=cfg.scorer.max_batch_tokens,
                                     cpu_pass_tokens=cfg.scorer.cpu_pass_tokens,
                                     reference_autocast=ref_autocast)
        self.env = make_env(cfg, None)
        self.reference = [] if self.local else make_reference(cfg, self.tok)
        self._naive_ref: tuple[int, dict] | None = None
        self._heldout: list | None = None  # SOAR's held-out problems, built on first use

    def load_weights(self, weights: Weights, version: int) -> None:
        """New weights; under reward.kind=precond_cosine the learner's snapshot also holds the
        optimizer's metric at those weights (`learner_worker.with_metric`): the scorer takes
        it (its own parameters' slice) before the reference is recomputed at this version."""
        state, metric = split_metric(weights)
        self.scorer.load_weights(state, version)
        if self.cfg.reward.needs.metric:
            if metric is None:
                raise RuntimeError(f"reward.kind=precond_cosine: the weights of version "
                                   f"{version} came without the learner's metric")
            self.scorer.set_metric(metric)

    def candidates(self, call: StageCall, validated: Validated, attempts: AttemptBatch,
                   grades: list[GradeBatch]) -> Candidates:
        """The step's eligible candidates, built once (on scorer 0) for every shard."""
        with timed(self.gpus) as t:
            solved = validated.solved
            graded = GradeBatch.merge(grades, solved)
            cands = stages.build_candidates(self.env, self.tok, self.cfg, solved,
                                            attempts.attempts, graded.verdicts, graded.rates)
        return Candidates(cands, t)

    def score(self, call: StageCall, weights: WeightsOffer, candidates: Candidates) -> ScoredShard:
        """This shard's partials for the candidates, at the offered weights. Shard 0's timing
        includes building the candidates (scorer 0 did that), so merged shards count it once."""
        self.accept(weights)
        with timed(self.gpus) as t:
            shard = self._score(candidates.cands)
        shard.timing = Timing.merge([candidates.timing, t]) if call.part == 0 else t
        return shard

    def _score(self, cands: list[Candidate]) -> ScoredShard:
        """The pass the reward kind needs (`config.reward_kinds`: none, gradients or SOAR's
        held-out loss) on this shard's candidates."""
        run = {"none": self._nothing, "gradients": self._alignment,
               "heldout_loss": self._heldout_gains}[self.cfg.reward.needs.scorer_pass]
        return run(cands)

    def _nothing(self, cands: list[Candidate]) -> ScoredShard:
        """Kinds without a model pass (difficulty, novelty): an empty shard."""
        return ScoredShard(cands, [], [], [], 0.0, Timing())

    def _heldout_gains(self, cands: list[Candidate]) -> ScoredShard:
        """SOAR's utilities and cost on this shard's candidate groups (`_soar`)."""
        utility, cost = self._soar(cands)
        return ScoredShard(cands, [], [], [], 0.0, Timing(), utility=utility, soar=cost)

    def _alignment(self, cands: list[Candidate]) -> ScoredShard:
        """Gradient-alignment partials of this shard's candidates (replica: every
        num_shards-th candidate; param_shard: all of them over this shard's parameters),
        against the global reference gradient or each candidate's local one."""
        index = list(range(len(cands)))
        if self.cfg.scorer.shard_mode == "replica":
            index = index[self.shard::self.num_shards]
        if not index:
            return self._nothing(cands)
        if self.local:
            return self._local(cands, index)
        ref = self.scorer.reference
        if ref is None or ref.weight_version != self.scorer.weight_version:
            self.scorer.set_reference(self.reference)
            ref = self.scorer.reference
        examples = candidate_solutions([cands[i] for i in index])  # all verified solutions
        if self.cfg.scorer.mode == "naive":
            part = self._naive_partials(examples)
        else:
            part = self.scorer.partials(examples)
        return ScoredShard(
            cands, index, part.inner.tolist(), part.sq.tolist(), float(ref.sq), Timing(),
            proj=None if part.proj is None else part.proj.tolist(),
            ref_proj=None if ref.proj is None else ref.proj.tolist())

    def _local(self, cands: list[Candidate], index: list[int]) -> ScoredShard:
        """Partials against each candidate's own seed reference (reward.reference=local), on
        each candidate's first verified solution (`local_partials` takes one example each)."""
        mine = [cands[i] for i in index]
        if any(c.ref_prompt_ids is None or c.ref_target_ids is None for c in mine):
            raise RuntimeError("reward.reference=local: a candidate has no local reference "
                               "(the environment provides none for its task)")
        refs, ref_of = group_references([(c.ref_prompt_ids, c.ref_target_ids) for c in mine])
        inner, sq, ref_sq = local_partials(
            self.scorer.model, candidate_examples(mine), refs, ref_of, self.local_params,
            pad_id=self.tok.pad_token_id, max_batch_tokens=self.cfg.scorer.max_batch_tokens)
        return ScoredShard(cands, index, inner.tolist(), sq.tolist(), 0.0, Timing(),
                           local_ref_sq=ref_sq.tolist())

    def _naive_partials(self, examples: list) -> Partials:
        """The plain autograd oracle: one backward per candidate (scorer.mode=naive)."""
        sc = self.scorer
        if self._naive_ref is None or self._naive_ref[0] != sc.weight_version:
            ref = reference_grads(sc.model, sc.params, self.reference)
            if sc.metric is not None:  # precond_cosine: inner products against M g_ref
                ref = {n: g * sc.metric[n] for n, g in ref.items()}
            self._naive_ref = (sc.weight_version, ref)
        return Partials(*naive_partials(sc.model, sc.params, self._naive_ref[1], examples,
                                        sc.sketch, sc.metric))

    def _soar(self, cands: list[Candidate]) -> tuple[dict[str, float], dict[str, float]]:
        """SOAR (reward.kind=soar) on this shard's candidate groups: per group, a copy of the
        solver trained on the group's verified solutions (all of each candidate's, weighted
        1/k: the mean of the candidates' losses), evaluated on the held-out problems; every
        candidate of the group gets the gain. Also returns the cost (`soar_*` fields)."""
        r = self.cfg.reward
        groups = make_groups(len(cands), r.soar_groups, r.soar_group_size)
        groups = groups[self.shard::self.num_shards]
        if not groups:
            return {}, {}
        if self._heldout is None:
            self._heldout = make_heldout(self.cfg, self.env, self.tok)
        res = soar_gains(
            self.scorer.model, [candidate_solutions([cands[i] for i in g]) for g in groups],
            self._heldout, metric=r.soar_metric, inner_steps=r.soar_inner_steps, lr=r.soar_lr,
            optimizer=r.soar_optimizer, pad_id=self.tok.pad_token_id, reference=self.reference,
            max_new_tokens=r.soar_max_new_tokens, eos_id=self.tok.eos_token_id,
            max_batch_tokens=self.cfg.scorer.max_batch_tokens)
        utility = {cands[i].task_id: v for g, v in zip(groups, res.gains, strict=True)
                   for i in g}
        cost = {"soar_seconds": res.seconds, "soar_train_tokens": float(res.train_tokens),
                "soar_eval_tokens": float(res.eval_tokens), "soar_groups": float(len(groups))}
        return utility, cost
