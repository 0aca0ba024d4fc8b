"""The eval worker: evaluates given weight versions on benchmarks during training.

Holds its own copy of the model, takes weights by version like the other workers (a
`WeightsOffer`), and runs an `Evaluator` (greedy, batched, graded in a sandbox). The Ray
executor wraps it in an `EvalActor` and hands it the learner's snapshot every
`eval.every_steps` steps without waiting; the local executor calls it after the step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from compassplay.config import RunConfig
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.eval.eval_records import EvalMetric
from compassplay.eval.evaluator import Evaluator
from compassplay.step.graph import WeightsOffer
from compassplay.step.timing import Timing, timed
from compassplay.warmup.bootstrap import load_policy
from compassplay.workers.builders import configure_process, role_device, role_gpus
from compassplay.workers.versioned import Versioned, Weights

log = logging.getLogger(__name__)


def eval_due(cfg: RunConfig, step: int) -> bool:
    """Whether the weights after `step` are evaluated (every k-th step: k-1, 2k-1, ...)."""
    k = cfg.eval.every_steps
    return k > 0 and (step + 1) % k == 0


@dataclass
class EvalReport:
    """The evaluation of the weights after `step` (weight `version`): one metrics line per
    benchmark that ran, the reasons of those skipped, and what the evaluation cost."""

    step: int
    version: int
    metrics: list[EvalMetric]
    skipped: dict[str, str] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)


class EvalWorker(Versioned):
    """Evaluates the solver's weights of a given version on `cfg.eval.benchmarks`."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        e = cfg.eval
        configure_process(cfg)
        model, tok = load_policy(cfg)  # base model (+ bootstrap)
        self.gpus = role_gpus(cfg, "eval")
        model = model.eval().to(role_device(cfg, "eval"))
        self.engine = HFGenerationEngine(model, tok)
        self.evaluator = Evaluator(model, tok, e.benchmarks, e.data_dir or None,
                                   batch_size=e.batch_size,
                                   max_new_tokens=e.max_new_tokens or None,
                                   limit=e.limit or None, engine=self.engine)

    def load_weights(self, weights: Weights, version: int) -> None:
        self.engine.load_weights(weights, version)

    def evaluate(self, step: int, weights: WeightsOffer) -> EvalReport:
        """Evaluate the offered weights (loaded when newer than those held) as of `step`."""
        self.accept(weights)
        with timed(self.gpus) as t:
            results = self.evaluator.evaluate()
        version = self.weight_version
        metrics = [EvalMetric.from_result(r, step, version) for r in results
                   if r.accuracy is not None]
        skipped = {r.benchmark: r.skipped for r in results if r.accuracy is None}
        for name, why in skipped.items():
            log.warning("eval after step %d: %s skipped (%s)", step, name, why)
        return EvalReport(step, version, metrics, skipped, t)

    def close(self) -> None:
        self.evaluator.close()
