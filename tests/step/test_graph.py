"""The step graph against its workers: every stage of `STEP` names its method's parameters,
in order, and takes only what an earlier stage gives."""

from __future__ import annotations

import inspect

import pytest

from compassplay.step.graph import STEP, WEIGHTS, Stage, check_graph, submit_step
from compassplay.workers.generator_workers import ProposerWorker, SolverWorker
from compassplay.workers.learner_worker import LearnerWorker
from compassplay.workers.scorer_worker import ScorerWorker
from compassplay.workers.verifier_worker import VerifierWorker

WORKERS = {"proposer": ProposerWorker, "solver": SolverWorker, "verifier": VerifierWorker,
           "scorer": ScorerWorker, "learner": LearnerWorker}


def drift(stage: Stage) -> str:
    """'' when `stage.inputs` are its worker method's parameters after (self, call), by name
    and in order; else what differs."""
    method = getattr(WORKERS[stage.role], stage.name, None)
    if method is None:
        return f"{WORKERS[stage.role].__name__} has no method {stage.name}"
    params = list(inspect.signature(method).parameters)
    if params[:2] != ["self", "call"]:
        return f"{stage.name}{params}: the first parameters are not (self, call)"
    if tuple(params[2:]) != stage.inputs:
        return f"{stage.name}: graph {list(stage.inputs)} != method {params[2:]}"
    return ""


@pytest.mark.parametrize("stage", STEP, ids=[st.name for st in STEP])
def test_stage_inputs_are_its_method_parameters(stage):
    assert drift(stage) == ""


def test_drift_is_seen():
    """A renamed or reordered input, or a missing method, is reported."""
    solve = next(st for st in STEP if st.name == "solve")
    assert "!=" in drift(Stage("solve", "solver", "attempts", ("validated", WEIGHTS)))
    assert "!=" in drift(Stage("solve", "solver", "attempts", (WEIGHTS, "parts")))
    assert "no method" in drift(Stage("nothing", "solver", "x"))
    assert drift(solve) == ""


def test_graph_wires_earlier_outputs_only():
    check_graph()
    with pytest.raises(ValueError, match="no earlier stage"):
        check_graph((Stage("a", "solver", "x", ("y",)),))
    with pytest.raises(ValueError, match="taken"):
        check_graph((Stage("a", "solver", "x"), Stage("b", "solver", "x")))


class Recorder:
    """A Dispatch that records calls; each stage's output is its name (a part each)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list]] = []

    def count(self, role):
        return 2

    def call(self, role, index, call, args):
        self.calls.append((call.stage, index, list(args)))
        return f"{call.stage}{index}" if call.stage in ("validate", "grade", "score") \
            else call.stage


def test_validation_is_merged_once_and_passed_on():
    """Only update_buffer and collect take the verifiers' slices; later stages take
    collect's output."""
    rec = Recorder()
    submit_step(0, rec, {"solver": (0, ["s"]), "proposer": (0, ["p"])}, checkpoint=False)
    takes_slices = {name for name, _, args in rec.calls if "validate0" in args}
    assert takes_slices == {"update_buffer", "collect"}
    takes_merged = {name for name, _, args in rec.calls if "collect" in args}
    assert takes_merged == {"solve", "grade", "candidates", "learn"}
    assert [n for n, _, _ in rec.calls].count("collect") == 1
