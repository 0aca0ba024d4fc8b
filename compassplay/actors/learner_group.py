"""The learner as a group of N rank actors that form one torch.distributed group.

`LearnerGroup` stands where one learner actor handle stood (`ActorSet.learner`): the driver
calls `group.<method>.remote(...)` / `.options(num_returns=2)` as on an actor. Collective
methods (`FAN_OUT`: learn and every stage call, snapshot, broadcast, restore) go to every
rank in rank order; the returned ref is rank 0's result, available once every rank has
finished (a failure on any rank fails it), except a snapshot's state, which is rank 0's own
ref (no copy). Other methods (steps_done, sync_address, init_sync, ...) go to rank 0 only.
With one rank the calls are that actor's, unchanged.

Start-up: the ranks are created together (one placement group); rank 0 picks the
rendezvous (its node's IP, a free port) and every rank's `start(addr, port)` gets it as an
ObjectRef, so creating the group does not wait for placement. Ranks of a group do not
restart on their own (a torch.distributed group cannot take a new member): after a failure
the driver asks `any_dead()` and builds a new group that restores the latest checkpoint.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import RayActorError

FAN_OUT = frozenset({"run_stage", "snapshot", "broadcast", "restore"})


@ray.remote(num_cpus=0, max_retries=0)
def _first(result: Any, *others: Any) -> Any:
    """Rank 0's result, once every rank's result exists (Ray resolves all arguments)."""
    return result


class _Method:
    def __init__(self, group: LearnerGroup, name: str, num_returns: int = 1) -> None:
        self.group, self._method_name, self.num_returns = group, name, num_returns

    def options(self, num_returns: int = 1, **_: Any) -> _Method:
        return _Method(self.group, self._method_name, num_returns)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        ranks = self.group.ranks
        if self._method_name not in FAN_OUT:
            ranks = ranks[:1]
        refs = []
        for actor in ranks:
            m = getattr(actor, self._method_name)
            if self.num_returns != 1:
                m = m.options(num_returns=self.num_returns)
            refs.append(m.remote(*args, **kwargs))
        if len(refs) == 1:
            return refs[0]
        if self.num_returns == 1:
            return _first.remote(*refs)
        # (version, state): the version waits for every rank; the state stays rank 0's ref
        first = refs[0]
        return (_first.remote(first[0], *(r[0] for r in refs[1:])), *first[1:])


class LearnerGroup:
    """N learner rank actors called as one (see the module docstring)."""

    def __init__(self, ranks: list[Any]) -> None:
        if not ranks:
            raise ValueError("a learner group needs at least one rank")
        self.ranks = ranks

    @property
    def size(self) -> int:
        return len(self.ranks)

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def named(self, prefix: str) -> dict[str, Any]:
        """Role name -> rank actor ('learner' alone, else 'learner-0', 'learner-1', ...)."""
        if self.size == 1:
            return {prefix: self.ranks[0]}
        return {f"{prefix}-{i}": a for i, a in enumerate(self.ranks)}

    def any_dead(self, timeout_s: float = 5.0) -> bool:
        """Whether a rank actor has died (a rank busy past `timeout_s` counts as alive)."""
        refs = [a.incarnation.remote() for a in self.ranks]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                return True
        return False

    def kill(self) -> None:
        for a in self.ranks:
            ray.kill(a, no_restart=True)
