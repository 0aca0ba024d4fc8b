#include <stdint.h>
#include <immintrin.h>
static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo); lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo); lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}
/* 3 weight rows x 4 x rows, k % 8 == 0 */
static inline void t3x4(const float *w0, const float *w1, const float *w2, const float *x, int64_t k, float *acc) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
           a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k, *x3 = x + 3 * k;
    for (int64_t i = 0; i < k; i += 8) {
        __m256 p = _mm256_loadu_ps(x0 + i), q = _mm256_loadu_ps(x1 + i), r = _mm256_loadu_ps(x2 + i), s = _mm256_loadu_ps(x3 + i);
        __m256 u = _mm256_loadu_ps(w0 + i);
        a00 = _mm256_fmadd_ps(u, p, a00); a01 = _mm256_fmadd_ps(u, q, a01); a02 = _mm256_fmadd_ps(u, r, a02); a03 = _mm256_fmadd_ps(u, s, a03);
        u = _mm256_loadu_ps(w1 + i);
        a10 = _mm256_fmadd_ps(u, p, a10); a11 = _mm256_fmadd_ps(u, q, a11); a12 = _mm256_fmadd_ps(u, r, a12); a13 = _mm256_fmadd_ps(u, s, a13);
        u = _mm256_loadu_ps(w2 + i);
        a20 = _mm256_fmadd_ps(u, p, a20); a21 = _mm256_fmadd_ps(u, q, a21); a22 = _mm256_fmadd_ps(u, r, a22); a23 = _mm256_fmadd_ps(u, s, a23);
    }
    acc[0] = hsum(a00); acc[1] = hsum(a01); acc[2] = hsum(a02); acc[3] = hsum(a03);
    acc[4] = hsum(a10); acc[5] = hsum(a11); acc[6] = hsum(a12); acc[7] = hsum(a13);
    acc[8] = hsum(a20); acc[9] = hsum(a21); acc[10] = hsum(a22); acc[11] = hsum(a23);
}
void sl4(const float *x, const float *w, const float *b, float *y, int64_t m, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j += 3) {
        const float *w0 = w + j * k, *w1 = w + (j + 1) * k, *w2 = w + (j + 2) * k;
        float acc[12];
        for (int64_t r0 = 0; r0 < m; r0 += 4) {
            t3x4(w0, w1, w2, x + r0 * k, k, acc);
            for (int64_t r = 0; r < 4 && r0 + r < m; r++)
                for (int c = 0; c < 3; c++)
                    y[(r0 + r) * n + j + c] = acc[4 * c + r] + (b ? b[j + c] : 0.f);
        }
    }
}
/* 2 weight rows x 6 x rows */
static inline void t2x6(const float *w0, const float *w1, const float *x, int64_t k, float *acc) {
    __m256 z = _mm256_setzero_ps();
    __m256 a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, b0 = z, b1 = z, b2 = z, b3 = z, b4 = z, b5 = z;
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k, *x3 = x + 3 * k, *x4 = x + 4 * k, *x5 = x + 5 * k;
    for (int64_t i = 0; i < k; i += 8) {
        __m256 u = _mm256_loadu_ps(w0 + i), v = _mm256_loadu_ps(w1 + i), t;
        t = _mm256_loadu_ps(x0 + i); a0 = _mm256_fmadd_ps(u, t, a0); b0 = _mm256_fmadd_ps(v, t, b0);
        t = _mm256_loadu_ps(x1 + i); a1 = _mm256_fmadd_ps(u, t, a1); b1 = _mm256_fmadd_ps(v, t, b1);
        t = _mm256_loadu_ps(x2 + i); a2 = _mm256_fmadd_ps(u, t, a2); b2 = _mm256_fmadd_ps(v, t, b2);
        t = _mm256_loadu_ps(x3 + i); a3 = _mm256_fmadd_ps(u, t, a3); b3 = _mm256_fmadd_ps(v, t, b3);
        t = _mm256_loadu_ps(x4 + i); a4 = _mm256_fmadd_ps(u, t, a4); b4 = _mm256_fmadd_ps(v, t, b4);
        t = _mm256_loadu_ps(x5 + i); a5 = _mm256_fmadd_ps(u, t, a5); b5 = _mm256_fmadd_ps(v, t, b5);
    }
    acc[0] = hsum(a0); acc[1] = hsum(a1); acc[2] = hsum(a2); acc[3] = hsum(a3); acc[4] = hsum(a4); acc[5] = hsum(a5);
    acc[6] = hsum(b0); acc[7] = hsum(b1); acc[8] = hsum(b2); acc[9] = hsum(b3); acc[10] = hsum(b4); acc[11] = hsum(b5);
}
void sl5(const float *x, const float *w, const float *b, float *y, int64_t m, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j += 2) {
        const float *w0 = w + j * k, *w1 = w + (j + 1) * k;
        float acc[12];
        for (int64_t r0 = 0; r0 < m; r0 += 6) {
            t2x6(w0, w1, x + r0 * k, k, acc);
            for (int64_t r = 0; r < 6 && r0 + r < m; r++)
                for (int c = 0; c < 2; c++)
                    y[(r0 + r) * n + j + c] = acc[6 * c + r] + (b ? b[j + c] : 0.f);
        }
    }
}
