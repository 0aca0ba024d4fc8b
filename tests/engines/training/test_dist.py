"""The learner group's process-group lifecycle (engines/training/dist.py), in real subprocesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from compassplay.engines.training.dist import RankInfo


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_a_gloo_group_is_destroyed_before_the_interpreter_exits():
    # atexit runs handlers last-registered-first: the check registered before init_group
    # runs after the group's own exit handler, and must find the group gone.
    done = _run("""
        import atexit, torch
        from compassplay.engines.training.dist import RankInfo, init_group
        atexit.register(lambda: print("initialized at exit:", torch.distributed.is_initialized()))
        init_group(RankInfo())
        t = torch.ones(4)
        torch.distributed.all_reduce(t, async_op=True).wait()
        print("world", torch.distributed.get_world_size(), "sum", t.tolist())
    """)
    assert done.returncode == 0, done.stderr
    assert "world 1 sum [1.0, 1.0, 1.0, 1.0]" in done.stdout
    assert "initialized at exit: False" in done.stdout


def test_leave_group_without_a_group_is_a_no_op():
    done = _run("""
        from compassplay.engines.training.dist import leave_group
        leave_group(); leave_group(wait_for_peers=False); print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_rank_info_rejects_a_rank_outside_the_world_and_a_group_without_rendezvous():
    with pytest.raises(ValueError, match="rank 2 outside a world of 2"):
        RankInfo(rank=2, world_size=2, master_addr="h", master_port=1)
    with pytest.raises(ValueError, match="master_addr and master_port"):
        RankInfo(rank=0, world_size=2)
