#include <immintrin.h>
#include <stdint.h>
#define TILEN(NB, MR) \
  { __m512 a[NB][MR]; \
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) a[j][r] = _mm512_setzero_ps(); \
    const uint32_t *xr = (const uint32_t *)(x + m0 * k); \
    for (int64_t kp = 0; kp < kh; kp++) { \
        __m512bh w[NB]; \
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) w[j] = (__m512bh)_mm512_loadu_si512(wb + j * kh * 32 + kp * 32); \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) { \
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[r * kh + kp]); \
            _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) a[j][r] = _mm512_dpbf16_ps(a[j][r], xv, w[j]); } \
    } \
    for (int r = 0; r < MR; r++) for (int j = 0; j < NB; j++) \
        _mm256_storeu_si256((__m256i *)(y + (m0 + r) * n + (nb + j) * 16), (__m256i)_mm512_cvtneps_pbh(a[j][r])); \
  }
#define KERNEL(NAME, NB, MR) \
void NAME(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y, int64_t m, int64_t n, int64_t k) { \
    const int64_t kh = k / 2; \
    _Pragma("omp parallel for schedule(static)") \
    for (int64_t nb = 0; nb < n / 16; nb += NB) { \
        const uint16_t *wb = wp + nb * kh * 32; \
        for (int64_t m0 = 0; m0 < m; ) { \
            int64_t left = m - m0; \
            if (left >= MR) { TILEN(NB, MR) m0 += MR; } \
            else if (left >= 4) { TILEN(NB, 4) m0 += 4; } \
            else { TILEN(NB, 1) m0 += 1; } \
        } \
    } }
KERNEL(k2x8, 2, 8)
KERNEL(k3x8, 3, 8)
KERNEL(k4x6, 4, 6)
KERNEL(k2x12, 2, 12)
KERNEL(k4x4, 4, 4)
