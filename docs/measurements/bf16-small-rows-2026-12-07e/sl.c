#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* pack W [N, K] bf16 (N % 16 == 0, K % 2 == 0) into [N/16][K/2][16][2] */
void pack_w(const uint16_t *w, uint16_t *p, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 16; nb++)
        for (int64_t kp = 0; kp < k / 2; kp++)
            for (int64_t l = 0; l < 16; l++) {
                const uint16_t *src = w + (nb * 16 + l) * k + 2 * kp;
                uint16_t *dst = p + ((nb * (k / 2) + kp) * 16 + l) * 2;
                dst[0] = src[0]; dst[1] = src[1];
            }
}

static inline uint16_t st(float f) {
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

#define TILE(MR) \
  { __m512 acc[MR]; \
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps(); \
    const uint32_t *xr = (const uint32_t *)(x + m0 * k); \
    for (int64_t kp = 0; kp < kh; kp++) { \
        __m512bh wv = (__m512bh)_mm512_loadu_si512(wb + kp * 32); \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) \
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32((int)xr[r * kh + kp]), wv); \
    } \
    for (int r = 0; r < MR; r++) { \
        __m512 v = bias ? _mm512_add_ps(acc[r], bias16) : acc[r]; \
        _mm256_storeu_si256((__m256i *)(y + (m0 + r) * n + nb * 16), (__m256i)_mm512_cvtneps_pbh(v)); \
    } }

void small_linear_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y,
                       int64_t m, int64_t n, int64_t k) {
    const int64_t kh = k / 2;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 16; nb++) {
        const uint16_t *wb = wp + nb * kh * 32;
        __m512 bias16 = _mm512_setzero_ps();
        const int bias = b != 0;
        if (bias) {
            __m256i bb = _mm256_loadu_si256((const __m256i *)(b + nb * 16));
            bias16 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bb), 16));
        }
        for (int64_t m0 = 0; m0 < m; ) {
            int64_t left = m - m0;
            if (left >= 16) { TILE(16) m0 += 16; }
            else if (left >= 8) { TILE(8) m0 += 8; }
            else if (left >= 4) { TILE(4) m0 += 4; }
            else if (left >= 2) { TILE(2) m0 += 2; }
            else { TILE(1) m0 += 1; }
        }
    }
}

#define TILE2(MR) \
  { __m512 a0[MR], a1[MR]; \
    for (int r = 0; r < MR; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
    const uint32_t *xr = (const uint32_t *)(x + m0 * k); \
    for (int64_t kp = 0; kp < kh; kp++) { \
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wb + kp * 32); \
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(wb + kh * 32 + kp * 32); \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) { \
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[r * kh + kp]); \
            a0[r] = _mm512_dpbf16_ps(a0[r], xv, w0); a1[r] = _mm512_dpbf16_ps(a1[r], xv, w1); } \
    } \
    for (int r = 0; r < MR; r++) { \
        _mm256_storeu_si256((__m256i *)(y + (m0 + r) * n + nb * 16), (__m256i)_mm512_cvtneps_pbh(a0[r])); \
        _mm256_storeu_si256((__m256i *)(y + (m0 + r) * n + nb * 16 + 16), (__m256i)_mm512_cvtneps_pbh(a1[r])); \
    } }

void small_linear_bf16_2(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y,
                       int64_t m, int64_t n, int64_t k) {
    const int64_t kh = k / 2;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 16; nb += 2) {
        const uint16_t *wb = wp + nb * kh * 32;
        for (int64_t m0 = 0; m0 < m; ) {
            int64_t left = m - m0;
            if (left >= 12) { TILE2(12) m0 += 12; }
            else if (left >= 8) { TILE2(8) m0 += 8; }
            else if (left >= 4) { TILE2(4) m0 += 4; }
            else if (left >= 2) { TILE2(2) m0 += 2; }
            else { TILE2(1) m0 += 1; }
        }
    }
}
