"""Each run starts from a state no earlier run could have touched (issue 25): a new scratch
directory per run, and a worker whose state cannot be restored is replaced before the next run,
which then runs unaffected. Both modes (see conftest)."""

from __future__ import annotations

import os

import pytest

from compassplay.verifiers.sandbox.pool import PythonSandbox
from tests.verifiers.sandbox_helpers import MODES, require_isolation

POISON = ("import os\nos.setxattr('.', 'user.leak', b'1')\nos.utime('.', (1, 1))\n"
          "open('.hidden', 'w').close()\nos.unlink('.hidden')\nprint(os.listxattr('.'))")
CHECK = ("import os\nst = os.stat('.')\n"
         "print(os.listxattr('.'), st.st_mtime > 1e9, st.st_atime > 1e9, oct(st.st_mode & 0o777))")


def test_scratch_attributes_and_timestamps_do_not_reach_the_next_run(
        sandbox: PythonSandbox) -> None:
    for _ in range(sandbox.workers):  # one poisoned run on every worker
        r = sandbox.run(POISON)
        assert (r.status, r.stdout) == ("ok", "['user.leak']\n"), r
    for r in [sandbox.run(CHECK) for _ in range(2 * sandbox.workers)]:
        assert (r.status, r.stdout) == ("ok", "[] True True 0o700\n"), r


# Thousands of directories: more to remove than a zero wipe budget allows.
WIDE_TREE = "import os\nfor i in range(2000):\n    os.mkdir(f'd{i}')\nprint('made')"
PROBE = "import os\nprint(os.listdir('/tmp'), os.listdir('.'), os.listdir('/dev/shm'))"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_unrestorable_worker_retires_and_queued_runs_are_unaffected(mode: str) -> None:
    require_isolation(MODES[mode])
    with PythonSandbox(workers=1, timeout_s=5.0, memory_mb=256, isolation=MODES[mode],
                       pipeline_depth=8, wipe_budget_s=0.0) as sb:
        first = sb.worker_pids()
        rs = sb.run_many([WIDE_TREE] + [PROBE] * 7)  # all eight in flight on the one worker
        assert (rs[0].status, rs[0].stdout) == ("ok", "made\n"), rs[0]
        for r in rs[1:]:
            assert (r.status, r.stdout) == ("ok", "['work'] [] []\n"), r
        assert sb.stats.snapshot()["worker_restarts"] == 1
        assert sb.worker_pids() != first and sb.live_workers() == 1
        for pid in first:
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read()


def test_wipe_budget_must_be_a_duration() -> None:
    with pytest.raises(ValueError, match="wipe_budget_s"):
        PythonSandbox(wipe_budget_s=-1.0)
