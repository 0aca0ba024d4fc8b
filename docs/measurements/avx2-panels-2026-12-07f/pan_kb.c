#include <stdint.h>
#include <string.h>
typedef float v8 __attribute__((vector_size(32)));
void pack16(const float *w, float *p, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 16; nb++)
        for (int64_t c = 0; c < k; c++)
            for (int64_t l = 0; l < 16; l++) p[(nb * k + c) * 16 + l] = w[(nb * 16 + l) * k + c];
}
static inline v8 ldv(const float *p) { v8 v; memcpy(&v, p, 32); return v; }
static inline void stv(float *p, v8 v) { memcpy(p, &v, 32); }
#define TILE(MR)                                                                   \
    {                                                                              \
        v8 a0[MR], a1[MR];                                                         \
        for (int r = 0; r < MR; r++) a0[r] = a1[r] = (v8){0};                      \
        const float *xm = x + m0 * k;                                              \
        for (int64_t c = c0; c < c1; c++) {                                        \
            const v8 w0 = ldv(wb + c * 16), w1 = ldv(wb + c * 16 + 8);             \
            if (pf) __builtin_prefetch(pf + c * 16, 0, 3);                         \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {                 \
                const float xs = xm[r * k + c];                                    \
                a0[r] += w0 * xs;                                                  \
                a1[r] += w1 * xs;                                                  \
            }                                                                      \
        }                                                                          \
        for (int r = 0; r < MR; r++) {                                             \
            float *yr = y + (m0 + r) * n + nb * 16;                                \
            if (c0) { a0[r] += ldv(yr); a1[r] += ldv(yr + 8); }                    \
            stv(yr, a0[r]); stv(yr + 8, a1[r]);                                    \
        }                                                                          \
        pf = 0; m0 += MR;                                                          \
    }
#define KERNEL(NAME, KC, BIG, SMALL)                                              \
void NAME(const float *x, const float *wp, float *y, int64_t m, int64_t n, int64_t k) { \
    _Pragma("omp parallel for schedule(static)")                                  \
    for (int64_t nb = 0; nb < n / 16; nb++) {                                     \
        const float *wb = wp + nb * k * 16;                                       \
        for (int64_t c0 = 0; c0 < k; c0 += KC) {                                  \
            const int64_t c1 = c0 + KC < k ? c0 + KC : k;                         \
            const float *pf = nb + 1 < n / 16 ? wb + k * 16 : 0;                  \
            for (int64_t m0 = 0; m0 < m;) {                                       \
                const int64_t left = m - m0;                                      \
                if (left >= BIG) TILE(BIG)                                        \
                else if (left >= SMALL) TILE(SMALL)                               \
                else if (left >= 2) TILE(2)                                       \
                else TILE(1)                                                      \
            }                                                                     \
        }                                                                         \
    }                                                                             \
}
KERNEL(kb_all, 1 << 30, 6, 4)
KERNEL(kb128, 128, 6, 4)
KERNEL(kb256, 256, 6, 4)
KERNEL(kb256_54, 256, 5, 4)
KERNEL(kb384, 384, 6, 4)
