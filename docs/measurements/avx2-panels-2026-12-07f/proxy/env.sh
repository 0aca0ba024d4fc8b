# An AVX2-only CPU on this Zen 4 (source it): oneDNN, MKL and ATen limited to AVX2, and the
# decode kernels built for Zen 3 (-march=native -> -march=znver3, through ./cc).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CC="$here/cc" ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    ATEN_CPU_CAPABILITY=avx2
