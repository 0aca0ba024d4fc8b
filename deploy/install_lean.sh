#!/usr/bin/env bash
# Installs what the LeanVerifier actors run (compassplay/verifiers/lean/repl_pool.py): elan, the
# Lean 4 toolchain, leanprover-community/repl and a built Mathlib, all at one Lean tag.
# Idempotent; used by the lean_verifier node type of ray_cluster.yaml and the lean-verifier
# init container of deploy/kuberay/raycluster.yaml. Afterwards a run sets
#   verifiers.lean.command=[lake,env,repl] verifiers.lean.project_dir=$LEAN_HOME/mathlib4
# (lake picks the toolchain from mathlib4's lean-toolchain file; elan downloads it once).
#
#   LEAN_TAG   repl and mathlib4 tag, the same for both (default v4.19.0)
#   LEAN_HOME  where repl/ and mathlib4/ go (default ~/lean)
#   ELAN_HOME  elan's toolchains and proxies (default ~/.elan)
#   BIN_DIR    gets repl, lake, lean, elan links; must be on the actors' PATH (/usr/local/bin)
set -euo pipefail

LEAN_TAG="${LEAN_TAG:-v4.19.0}"
LEAN_HOME="${LEAN_HOME:-$HOME/lean}"
export ELAN_HOME="${ELAN_HOME:-$HOME/.elan}"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"
export PATH="$ELAN_HOME/bin:$PATH"

if ! command -v elan >/dev/null 2>&1; then
  curl -sSfL https://elan.lean-lang.org/elan-init.sh \
    | sh -s -- -y --no-modify-path --default-toolchain none
fi

mkdir -p "$LEAN_HOME"
for repo in repl mathlib4; do
  if [ ! -d "$LEAN_HOME/$repo" ]; then
    git clone --depth 1 --branch "$LEAN_TAG" \
      "https://github.com/leanprover-community/$repo" "$LEAN_HOME/$repo"
  fi
done

# The REPL binary, then Mathlib from the prebuilt .olean cache (minutes, not hours).
(cd "$LEAN_HOME/repl" && lake build)
(cd "$LEAN_HOME/mathlib4" && lake exe cache get && lake build)

SUDO=""
mkdir -p "$BIN_DIR" 2>/dev/null || true
[ -w "$BIN_DIR" ] || SUDO="sudo"
$SUDO mkdir -p "$BIN_DIR"
$SUDO ln -sf "$LEAN_HOME/repl/.lake/build/bin/repl" "$BIN_DIR/repl"
for tool in elan lake lean; do
  $SUDO ln -sf "$ELAN_HOME/bin/$tool" "$BIN_DIR/$tool"
done

# Smoke test: one request, one blank-line-terminated JSON reply with an env id.
cd "$LEAN_HOME/mathlib4"
printf '{"cmd": "theorem smoke : 1 + 1 = 2 := by decide"}\n\n' | lake env repl | grep -q '"env"'
echo "Lean $LEAN_TAG with Mathlib and the REPL is ready in $LEAN_HOME"
