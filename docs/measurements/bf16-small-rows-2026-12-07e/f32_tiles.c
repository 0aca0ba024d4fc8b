#include <stdint.h>
#include <string.h>
typedef float v8 __attribute__((vector_size(32)));

/* W [N, K] float32 (N % 8 == 0) -> p [N/8][K][8] */
void pack8(const float *w, float *p, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 8; nb++)
        for (int64_t c = 0; c < k; c++)
            for (int64_t l = 0; l < 8; l++) p[(nb * k + c) * 8 + l] = w[(nb * 8 + l) * k + c];
}

#define TILE(NB, MR)                                                              \
    {                                                                             \
        v8 a[NB][MR];                                                             \
        for (int j = 0; j < NB; j++)                                              \
            for (int r = 0; r < MR; r++) a[j][r] = (v8){0};                       \
        const float *xm = x + m0 * k;                                             \
        for (int64_t c = 0; c < k; c++) {                                         \
            v8 wv[NB];                                                            \
            for (int j = 0; j < NB; j++) memcpy(&wv[j], wb + (j * k + c) * 8, 32); \
            for (int r = 0; r < MR; r++) {                                        \
                const float xs = xm[r * k + c];                                   \
                for (int j = 0; j < NB; j++) a[j][r] += wv[j] * xs;               \
            }                                                                     \
        }                                                                         \
        for (int j = 0; j < NB; j++)                                              \
            for (int r = 0; r < MR; r++) memcpy(y + (m0 + r) * n + (nb + j) * 8, &a[j][r], 32); \
    }

#define KERNEL(NAME, NB, MR)                                                      \
void NAME(const float *x, const float *wp, float *y, int64_t m, int64_t n, int64_t k) { \
    _Pragma("omp parallel for schedule(static)")                                  \
    for (int64_t nb = 0; nb < n / 8; nb += NB) {                                  \
        const float *wb = wp + nb * k * 8;                                        \
        for (int64_t m0 = 0; m0 < m;) {                                           \
            const int64_t left = m - m0;                                          \
            if (left >= MR) { TILE(NB, MR) m0 += MR; }                            \
            else if (left >= 4) { TILE(NB, 4) m0 += 4; }                          \
            else { TILE(NB, 1) m0 += 1; }                                         \
        }                                                                         \
    }                                                                             \
}
KERNEL(f2x6, 2, 6)
KERNEL(f3x4, 3, 4)
KERNEL(f2x4, 2, 4)
KERNEL(f4x3, 4, 3)
