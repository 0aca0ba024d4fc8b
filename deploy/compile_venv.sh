#!/usr/bin/env bash
# compile_venv.sh VENV: byte-compile the packages installed in VENV, on every core.
# `make setup`/`make run` install with `pip install --no-compile` and call this after their
# install steps (the core's in the Makefile, vLLM's in install_vllm.sh): pip byte-compiles each wheel's files one at a time after unpacking it (about
# half of the core install's CPU time here, 2026-12-07), compileall -j 0 spreads the same
# work over all cores. The files are compiled now rather than at first import because a
# process with PYTHONDONTWRITEBYTECODE set would otherwise compile them on every start (every
# Ray actor, every test subprocess). Files already compiled are skipped (their .pyc is
# current); files that do not compile (a package's test data, Python 2 leftovers) are skipped
# silently, as pip skips them.
set -euo pipefail
VENV="$1"
PY="$VENV/bin/python"
start=$(date +%s.%N)
mapfile -t dirs < <("$PY" -c 'import sysconfig; print("\n".join(sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})))')
"$PY" -m compileall -q -q -j 0 "${dirs[@]}" || true
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "compile_venv: byte-compiled ${dirs[*]} in ${secs}s"
