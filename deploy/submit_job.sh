#!/usr/bin/env bash
# Submit a CompassPlay run to a Ray cluster as a Ray job.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 CONFIG=paper_coding_7b \
#     deploy/submit_job.sh [KEY=VALUE ...]
#
#   RAY_ADDRESS  the cluster's dashboard / Jobs API (default http://127.0.0.1:8265; for
#                `ray up` clusters run `ray dashboard ray_cluster.yaml` first; for KubeRay
#                `kubectl port-forward svc/compassplay-head-svc 8265:8265`)
#   CONFIG       run config (default paper_coding_7b)
#   JOB_ID       optional submission id (default: Ray generates raysubmit_...)
#   NO_WAIT=1    return after submission instead of tailing the logs
#                (then: ray job logs -f JOB_ID / ray job status JOB_ID / ray job stop JOB_ID)
#   RAY_BIN      the `ray` executable (default: ray on PATH)
#   AGENT_WAIT_S seconds to keep retrying while the cluster answers "No available agent to
#                submit job" (default 120): a head that has just started serves the Jobs API
#                before its job agent registers, and Ray refuses the submission until it does
#   STOP_WAIT_S  seconds `ray job stop` waits for the run's clean stop before it SIGKILLs the
#                driver (default 60; Ray's own default is 3 s, too short to drop the in-flight
#                step and end the actors: RAY_JOB_STOP_WAIT_TIME_S in the job's runtime env)
#   COMPASSPLAY_DATA_DIR  data folder on the cluster's nodes (the 7B configs' AZR seed sets)
#   extra args   dotted overrides passed to `compassplay run`, e.g. pipeline.steps=10
#                run.output_dir=/mnt/runs (use shared storage on multi-node clusters)
#
# Run from the repository root: the current directory is uploaded as the job's working dir
# (.gitignore is honoured; .venv, runs/ and .git are excluded explicitly too) and the driver
# runs `compassplay run` on the head node with RAY_ADDRESS pointing at the cluster.
# Clusters with token authentication (RAY_AUTH_MODE=token) need the token in RAY_AUTH_TOKEN or
# ~/.ray/auth_token on this machine as well.
set -euo pipefail

cd "$(dirname "$0")/.."

RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
CONFIG="${CONFIG:-paper_coding_7b}"
RAY_BIN="${RAY_BIN:-ray}"

if [[ ! -f "$CONFIG" && ! -f "compassplay/configs/$CONFIG.yaml" ]]; then
  echo "error: config not found: $CONFIG (a YAML path, or a name in compassplay/configs/)" >&2
  exit 2
fi

# COMPASSPLAY_DATA_DIR (a folder every node sees, e.g. the AZR seed sets the 7B configs name)
# is passed to the job's actors when set here
DATA_ENV=""
if [[ -n "${COMPASSPLAY_DATA_DIR:-}" ]]; then
  DATA_ENV=", \"COMPASSPLAY_DATA_DIR\": \"${COMPASSPLAY_DATA_DIR}\""
fi
RUNTIME_ENV='{"excludes": [".venv", "runs", ".git", ".pytest_cache", ".ruff_cache"],
  "env_vars": {"PYTHONUNBUFFERED": "1", "RAY_JOB_STOP_WAIT_TIME_S": "'"${STOP_WAIT_S:-60}"'"'"${DATA_ENV}"'}}'

flags=()
if [[ "${NO_WAIT:-0}" == "1" ]]; then
  flags+=(--no-wait)
fi
if [[ -n "${JOB_ID:-}" ]]; then
  flags+=(--submission-id "$JOB_ID")
fi

submit() {
  "$RAY_BIN" job submit \
    --address "$RAY_ADDRESS" \
    --working-dir . \
    --runtime-env-json "$RUNTIME_ENV" \
    ${flags[@]+"${flags[@]}"} \
    -- compassplay run --config "$CONFIG" "$@"
}

# Retry only Ray's "No available agent" refusal (nothing was submitted then); stderr is both
# shown and kept to recognise it, stdout (the job's tailed logs) passes straight through.
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
agent_wait="${AGENT_WAIT_S:-120}"
deadline=$(( SECONDS + agent_wait ))
while true; do
  rc=0
  { submit "$@" 2>&1 1>&3 3>&- | tee "$errors" >&2; } 3>&1 || rc=$?
  if [[ $rc -eq 0 ]] || ! grep -q "No available agent" "$errors"; then
    exit "$rc"
  fi
  if (( SECONDS >= deadline )); then
    echo "error: the cluster at $RAY_ADDRESS still has no job agent after ${agent_wait} s" \
         "(AGENT_WAIT_S); is its dashboard agent running? see its dashboard_agent.log" >&2
    exit "$rc"
  fi
  echo "submit_job.sh: the cluster's job agent is not up yet; retrying in 2 s" >&2
  sleep 2
done
