#!/usr/bin/env bash
# make_venv.sh PYTHON VENV: create the virtualenv VENV (with pip) for `make setup`, or stop with
# a message that says what to install. Never leaves a half-made VENV for later commands to trip
# over: one without a working pip (an earlier failure) is removed and made again.
set -euo pipefail
PY="$1"
VENV="$2"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  exit 0
fi
if [ -e "$VENV" ]; then
  echo "make_venv: $VENV is incomplete (no working pip): removing it and starting again"
  rm -rf "$VENV"
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "error: $PY not found: install Python >= 3.10 (Debian/Ubuntu: apt-get install python3)" >&2
  exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "error: CompassPlay needs Python >= 3.10; $PY is $("$PY" --version 2>&1)." \
       "Run make PYTHON=python3.11 (or another >= 3.10)" >&2
  exit 1
fi
# Debian/Ubuntu split `venv`/`ensurepip` into the python3.X-venv package
if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  pkg="python$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
  installed=0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "make_venv: '$PY -m venv' is unavailable; installing $pkg with apt-get"
    if { apt-get update -q || true; apt-get install -y -q "$pkg"; } >/dev/null 2>&1 \
       && "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      installed=1
    fi
  fi
  if [ "$installed" = 0 ]; then
    echo "error: '$PY -m venv' is unavailable (no ensurepip). Install it, then run make" \
         "again: sudo apt-get install $pkg   (or python3-venv)" >&2
    exit 1
  fi
fi
if ! "$PY" -m venv "$VENV"; then
  rm -rf "$VENV"
  echo "error: '$PY -m venv $VENV' failed (see above); nothing was left behind" >&2
  exit 1
fi
