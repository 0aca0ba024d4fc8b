"""deploy/submit_job.sh retries Ray's "No available agent" refusal and nothing else.

A head that has just started answers the Jobs API before its job agent registers; Ray then
refuses the submission (CI, 2026-12-07: tests/deploy/test_job_submit.py failed on it). The real
refusal cannot be produced on demand, so `ray` here is a script that answers the way Ray's CLI
does (the message and exit status of ray/dashboard/modules/dashboard_sdk.py `_raise_error`);
the real cluster path is tests/deploy/test_job_submit.py and tests/cluster/test_job_submit.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "submit_job.sh"
REFUSAL = ("RuntimeError: Request failed with status code 500: No available agent to submit "
           "job, please try again later..")


def _fake_ray(tmp_path: Path, refusals: int, final: str, final_rc: int) -> Path:
    """A `ray` that refuses `refusals` times, then prints `final` to stderr and exits final_rc;
    every call appends its arguments to calls.txt."""
    ray = tmp_path / "ray"
    ray.write_text(f"""#!/usr/bin/env bash
echo "$*" | tr '\\n' ' ' >> {tmp_path}/calls.txt; echo >> {tmp_path}/calls.txt
n=$(wc -l < {tmp_path}/calls.txt)
if (( n <= {refusals} )); then echo "{REFUSAL}" >&2; exit 1; fi
echo "job logs on stdout"
echo "{final}" >&2
exit {final_rc}
""")
    ray.chmod(0o755)
    return ray


def _submit(ray: Path, wait_s: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_BIN=str(ray), CONFIG="micro", AGENT_WAIT_S=str(wait_s),
               RAY_ADDRESS="http://127.0.0.1:1")
    return subprocess.run(["bash", str(SCRIPT), "pipeline.steps=2"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_refusals_are_retried_until_the_agent_answers(tmp_path):
    res = _submit(_fake_ray(tmp_path, refusals=2, final="submitted", final_rc=0), wait_s=30)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert res.returncode == 0, res.stderr
    assert len(calls) == 3
    assert all("--config micro pipeline.steps=2" in c for c in calls)
    assert res.stdout == "job logs on stdout\n"  # the job's logs are not swallowed
    assert res.stderr.count("job agent is not up yet") == 2
    assert "submitted" in res.stderr


def test_another_failure_is_not_retried_and_keeps_its_status(tmp_path):
    res = _submit(_fake_ray(tmp_path, refusals=0, final="job FAILED", final_rc=1), wait_s=30)
    assert res.returncode == 1
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 1
    assert "job FAILED" in res.stderr and "retrying" not in res.stderr


def test_an_agent_that_never_comes_ends_with_a_clear_error(tmp_path):
    res = _submit(_fake_ray(tmp_path, refusals=1000, final="", final_rc=0), wait_s=3)
    assert res.returncode == 1
    assert "still has no job agent after 3 s (AGENT_WAIT_S)" in res.stderr
    assert 2 <= len((tmp_path / "calls.txt").read_text().splitlines()) <= 4
