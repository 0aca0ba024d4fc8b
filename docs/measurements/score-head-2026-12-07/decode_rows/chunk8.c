#include <stdint.h>
static inline void dot4(const float *restrict wr, const float *restrict x, int64_t k, float *acc) {
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k, *x3 = x + 3 * k;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t i = 0; i < k; i++) { const float wv = wr[i]; a0 += wv * x0[i]; a1 += wv * x1[i]; a2 += wv * x2[i]; a3 += wv * x3[i]; }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3;
}
static inline void dot8(const float *restrict wr, const float *restrict x, int64_t k, float *acc) {
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k, *x3 = x + 3 * k, *x4 = x + 4 * k, *x5 = x + 5 * k, *x6 = x + 6 * k, *x7 = x + 7 * k;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, a4, a5, a6, a7)
    for (int64_t i = 0; i < k; i++) { const float wv = wr[i]; a0 += wv * x0[i]; a1 += wv * x1[i]; a2 += wv * x2[i]; a3 += wv * x3[i];
        a4 += wv * x4[i]; a5 += wv * x5[i]; a6 += wv * x6[i]; a7 += wv * x7[i]; }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5; acc[6] = a6; acc[7] = a7;
}
/* rows padded: xpad has ceil8 rows (caller pads) */
void sl(const float *x, const float *w, const float *b, float *y, int64_t m, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const float *wr = w + j * k;
        const float bj = b ? b[j] : 0.0f;
        float acc[8];
        for (int64_t r0 = 0; r0 < m; r0 += 8) {
            int64_t mr = m - r0 < 8 ? m - r0 : 8;
            if (mr <= 4) dot4(wr, x + r0 * k, k, acc); else dot8(wr, x + r0 * k, k, acc);
            for (int64_t r = 0; r < mr; r++) y[(r0 + r) * n + j] = acc[r] + bj;
        }
    }
}
