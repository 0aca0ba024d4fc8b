"""The version gate: which weights each rollout uses under staleness 0, 1 and 2."""

import pytest

from compassplay.sync.version_gate import VersionGate


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_rollouts_use_the_weights_after_learn_of_step_minus_staleness_minus_one(staleness):
    gate: VersionGate[str] = VersionGate(staleness)
    gate.reset(-1, "w0")
    used, in_flight = {}, []
    for step in range(6):
        assert gate.may_submit(len(in_flight))
        used[step] = gate.for_rollout(step)
        in_flight.append(step)
        gate.report(step, f"w{step + 1}")
        if not gate.may_submit(len(in_flight)):
            in_flight.pop(0)  # the oldest step finishes
    for step, w in used.items():
        assert w == f"w{max(0, step - staleness)}"


def test_gate_bounds_what_it_keeps_and_restarts_from_a_rollback():
    gate: VersionGate[int] = VersionGate(1)
    gate.reset(-1, 0)
    for step in range(10):
        gate.report(step, step + 1)
    assert len(gate._after) <= 3
    gate.reset(4, 99)  # rolled back to the checkpoint after step 4
    assert gate.for_rollout(5) == 99 and gate.for_rollout(6) == 99
    assert not gate.may_submit(2) and gate.may_submit(1)
    with pytest.raises(ValueError, match="staleness"):
        VersionGate(-1)
