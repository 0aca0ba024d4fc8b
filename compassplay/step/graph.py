"""The data flow of one self-play step, defined once and run by both executors.

    propose(weights) -> validate (every verifier, a slice each) -> update_buffer (proposer)
    -> collect (solver: the slices merged, once a step) -> solve(weights)
    -> grade (every verifier) [-> record_proofs (proposer, lean runs)]
    [-> env_state (proposer, checkpoint steps)] -> candidates (scorer 0)
    -> score(weights) (every scorer shard) -> learn (learner)

record_proofs (task.domain=lean only) adds the targets proved this step to the proposer's
seed buffer; in the Ray pipeline the proposer then takes step k+1's proposals only after step
k is graded (the seeds of step k+1 include step k's proofs), whatever the staleness.

`STEP` lists the stages: which worker role runs each, what its output is called, which
earlier outputs it takes (its method's parameters, by name and in order), and whether it runs
on every worker of its role (a fan-out, returning one part per worker).
`submit_step` walks it with a `Dispatch`: the local executor's calls workers in process and
returns values, the Ray executor's calls actors and returns ObjectRefs, so the graph is the
same in both. A worker method receives a `StageCall` (the step, its part of a fan-out) and its
inputs in order: a fan-out input as the list of its parts, the weights as a `WeightsOffer`.

Weights: a rollout or scoring stage is offered the weights the `VersionGate` allows for the
step, as (version, [state]); the scorers take the "scorer" snapshot where the executor made
one (reward.kind=precond_cosine: the solver's weights plus the learner's optimizer metric of
the same version, `LearnerWorker.snapshot("scorer")`), else the solver's. The version travels as a top-level argument (Ray resolves it, a
small int) and the state in a list (Ray leaves it a reference), so a worker fetches the state
only when the version is newer than the one it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Role = Literal["proposer", "solver", "verifier", "scorer", "learner"]
WEIGHTS = "weights"  # the input name of a weights offer


@dataclass(frozen=True)
class Stage:
    """One node of the step: `role` runs method `name` with parameters `inputs`.

    Each input is a parameter of the method, named after the value it takes: WEIGHTS (the
    offer), or the `out` of an earlier stage. The method's signature is
    `name(self, call, *inputs)` with exactly these names in this order
    (tests/step/test_graph.py checks every stage against its worker's method)."""

    name: str
    role: Role
    out: str  # what the stage's output is called where a later stage takes it
    inputs: tuple[str, ...] = ()
    fan_out: bool = False  # one call per worker of `role`, each on its part
    weights_of: str = ""  # with WEIGHTS among the inputs: whose weights (proposer/solver/
    # scorer: the solver's, with reward.kind=precond_cosine's metric; the solver's if absent)
    checkpoint_only: bool = False  # submitted only on checkpoint steps (else its output: None)
    domain: str = ""  # submitted only for this task.domain ('' = always; else output None)


STEP: tuple[Stage, ...] = (
    Stage("propose", "proposer", "proposals", (WEIGHTS,), weights_of="proposer"),
    Stage("validate", "verifier", "slices", ("proposals",), fan_out=True),
    Stage("update_buffer", "proposer", "added", ("slices",)),
    Stage("collect", "solver", "validated", ("slices",)),
    Stage("solve", "solver", "attempts", (WEIGHTS, "validated"), weights_of="solver"),
    Stage("grade", "verifier", "grades", ("validated", "attempts"), fan_out=True),
    Stage("record_proofs", "proposer", "recorded", ("validated", "attempts", "grades"),
          domain="lean"),
    Stage("env_state", "proposer", "env_state", ("added", "recorded"), checkpoint_only=True),
    Stage("candidates", "scorer", "candidates", ("validated", "attempts", "grades")),
    Stage("score", "scorer", "shards", (WEIGHTS, "candidates"), fan_out=True,
          weights_of="scorer"),
    Stage("learn", "learner", "result", ("proposals", "env_state", "validated", "attempts",
                                         "grades", "shards", "recorded")),
)


def check_graph(stages: tuple[Stage, ...] = STEP) -> None:
    """Raise ValueError unless every input names WEIGHTS or an earlier stage's `out`, and
    stage names and outputs are unique."""
    seen: set[str] = set()
    for st in stages:
        missing = [n for n in st.inputs if n != WEIGHTS and n not in seen]
        if missing:
            raise ValueError(f"stage {st.name!r} takes {missing}: no earlier stage gives them")
        if st.out in seen or st.out == WEIGHTS:
            raise ValueError(f"stage {st.name!r}: output name {st.out!r} is taken")
        seen.add(st.out)
    if len({st.name for st in stages}) != len(stages):
        raise ValueError("stage names repeat")


Kind = Literal["one", "parts", "weights"]


@dataclass(frozen=True)
class StageCall:
    """How a worker is called for a stage: the step, its part of a fan-out, and how the flat
    positional arguments group back into the stage's inputs (`kinds[i]`, `sizes[i]`)."""

    stage: str
    step: int
    part: int = 0
    parts: int = 1
    kinds: tuple[Kind, ...] = ()
    sizes: tuple[int, ...] = ()


@dataclass
class WeightsOffer:
    """Weights a stage may use: `version`, and a way to fetch the state dict if it is newer.

    `fetch()` returns None when the state did not travel with the call (NCCL weight sync:
    it arrives by broadcast)."""

    version: int
    fetch: Callable[[], dict | None]


class Dispatch(Protocol):
    """Where stages run: the executor's way of calling a worker."""

    def count(self, role: Role) -> int:
        """How many workers of `role` there are."""

    def call(self, role: Role, index: int, call: StageCall, args: list[Any]) -> Any:
        """Run `call.stage` on worker `index` of `role` with the flat `args`; a handle."""


Snapshot = tuple[Any, list]  # (version handle, [state handle]) of one role's weights


def submit_step(step: int, dispatch: Dispatch, weights: dict[str, Snapshot],
                checkpoint: bool, domain: str = "code",
                stop_after: str | None = None) -> dict[str, Any]:
    """Submit every stage of `step` in order; returns the handle(s) of each stage's output
    (a list for fan-out stages). `weights[role]` is what the version gate allows; stages of
    another `task.domain` are skipped (their output is None). `stop_after`: the last stage
    to submit (e.g. "candidates": a rollout that scores and learns nothing)."""
    if stop_after is not None and stop_after not in {st.name for st in STEP}:
        raise ValueError(f"stop_after={stop_after!r} is not a stage of the step")
    out: dict[str, Any] = {}  # by stage name
    value: dict[str, Any] = {}  # by output name
    for st in STEP:
        if out and stop_after in out:
            break
        if (st.checkpoint_only and not checkpoint) or (st.domain and st.domain != domain):
            out[st.name] = value[st.out] = None
            continue
        args: list[Any] = []
        kinds: list[Kind] = []
        sizes: list[int] = []
        for name in st.inputs:
            if name == WEIGHTS:
                version, box = weights.get(st.weights_of) or weights["solver"]
                args += [version, box]
                kinds.append("weights")
                sizes.append(2)
            elif isinstance(value[name], list):
                args += value[name]
                kinds.append("parts")
                sizes.append(len(value[name]))
            else:
                args.append(value[name])
                kinds.append("one")
                sizes.append(1)
        n = dispatch.count(st.role) if st.fan_out else 1
        handles = [dispatch.call(st.role, i, StageCall(st.name, step, i, n, tuple(kinds),
                                                       tuple(sizes)), args)
                   for i in range(n)]
        out[st.name] = value[st.out] = handles if st.fan_out else handles[0]
    return out


def regroup(call: StageCall, args: tuple | list, fetch: Callable[[Any], Any]) -> list[Any]:
    """The stage's inputs from the flat `args`: a value, a list of parts, or a WeightsOffer
    whose state is `fetch(box[0])` (the identity in process, `ray.get` in an actor)."""
    out: list[Any] = []
    i = 0
    for kind, size in zip(call.kinds, call.sizes, strict=True):
        chunk = list(args[i:i + size])
        i += size
        if kind == "one":
            out.append(chunk[0])
        elif kind == "parts":
            out.append(chunk)
        else:
            version, box = chunk
            out.append(WeightsOffer(int(version),
                                    (lambda b=box: fetch(b[0]) if b else None)))
    return out


def run_stage(worker: Any, call: StageCall, args: tuple | list,
              fetch: Callable[[Any], Any] = lambda x: x) -> Any:
    """Run one stage on a worker object: `worker.<stage>(call, *inputs)`."""
    return getattr(worker, call.stage)(call, *regroup(call, args, fetch))
