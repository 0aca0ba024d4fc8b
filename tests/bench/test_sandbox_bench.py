"""The sandbox bench's CPU accounting: per-run CPU and the per-role profile are measurable."""

from __future__ import annotations

import os

from compassplay.bench import sandbox as bench
from compassplay.verifiers.sandbox.isolation import UNSAFE_OPT_OUT
from compassplay.verifiers.sandbox.pool import PythonSandbox


def test_tree_cpu_counts_this_process() -> None:
    assert bench._tree_cpu([os.getpid()]) > 0.0


def test_profile_splits_cpu_by_role() -> None:
    # unisolated (no bwrap needed); the roots are the zygotes themselves
    with PythonSandbox(workers=1, timeout_s=5.0, isolation=UNSAFE_OPT_OUT) as sb:
        rate, cpu_per_run, statuses = bench._pool_rate(sb, 20)
        split = bench.profile(sb, 50)
    assert statuses == {"ok": 20} and rate > 0 and cpu_per_run > 0
    assert split["child_page_faults"] > 0 and split["zygote_wakeups"] > 0
    assert split["zygote_mappings"] > 0 and split["zygote_RssAnon_kb"] > 0
    assert set(split) >= {"host_user_ms", "zygote_sys_ms", "child_user_ms", "child_sys_ms"}
