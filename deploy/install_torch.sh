#!/usr/bin/env bash
# install_torch.sh PIP [CONSTRAINTS]: the torch step of `make setup`.
# With an NVIDIA GPU (nvidia-smi on PATH) nothing is done here: the package install that follows
# pulls the CUDA build from the default index. Without one, torch==$TORCH_VERSION is installed
# from the PyTorch CPU wheel index first (no multi-GB CUDA build or nvidia-* packages), or from
# the default index when that one cannot be reached: a probe of at most $PROBE_TIMEOUT_S seconds
# decides (an unreachable --index-url alone does not make pip fail, it only finds nothing).
# Environment: TORCH_VERSION (2.13.0), TORCH_CPU_INDEX (https://download.pytorch.org/whl/cpu),
# PROBE_TIMEOUT_S (3).
set -euo pipefail
PIP="$1"
CONSTRAINTS="${2:-}"
VERSION="${TORCH_VERSION:-2.13.0}"
INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
PROBE_TIMEOUT_S="${PROBE_TIMEOUT_S:-3}"
PY="$(dirname "$PIP")/python"
[ -x "$PY" ] || PY=python3

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "install_torch: NVIDIA GPU found: torch comes from the default index (CUDA build)"
  exit 0
fi
args=(install -q "torch==$VERSION")
[ -n "$CONSTRAINTS" ] && args+=(-c "$CONSTRAINTS")
start=$(date +%s.%N)
if "$PY" - "$INDEX/torch/" "$PROBE_TIMEOUT_S" <<'PY' >/dev/null 2>&1
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()
PY
then
  echo "install_torch: no NVIDIA GPU: torch==$VERSION (CPU build) from $INDEX"
  if "$PIP" "${args[@]}" --index-url "$INDEX" --timeout 10 --retries 1; then
    exit 0
  fi
  echo "install_torch: the CPU wheel index failed during the install: using the default index"
else
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "install_torch: no NVIDIA GPU; $INDEX unreachable (${secs}s): torch==$VERSION from" \
       "the default index"
fi
"$PIP" "${args[@]}"
