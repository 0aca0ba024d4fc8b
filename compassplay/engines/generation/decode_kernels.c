/* Fused CPU kernels for one decode step of `StaticDecoder` (see decode_kernels.py).

   Between a block's four matmuls (oneDNN or MKL, called from Python) a decode step runs about
   30 small torch ops: RMS norm, rotary embedding, the KV cache writes, the attention of each
   query head against its cache, SiLU and the residual adds. Each of them is 5-20 us of
   dispatch for a few microseconds of work at 16 rows. These three functions do the same
   arithmetic in three calls per block.

   The storage type `act` of activations, the KV cache and the matmul outputs is bfloat16 by
   default and float32 when built with -DCP_FLOAT32 (two libraries, one source). In bfloat16
   the kernels round where the torch path rounds (queries and keys after the rotary embedding,
   the scores q.k, the softmax weights, the attention output, silu(gate)); in float32 nothing
   is rounded. Either way the kernels and the torch ops differ only in summation order.

   bfloat16 values are passed as uint16_t (the upper half of a float32). Shapes: B rows,
   H hidden size, nh query heads, nkv key/value heads, d head dim, C cache capacity, I the
   MLP's inner size. Every array is contiguous. OpenMP threads come from the runtime torch
   already loaded (libgomp.so.1), so they are torch's own pool and count. */

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { COLS = 64 };  /* cached columns whose scores one pass over K^T sums at once */
enum { DV = 64 };    /* value columns whose weighted sums one pass over V keeps */

#ifdef CP_FLOAT32
typedef float act;
static inline float ld(act h) { return h; }
static inline act st(float f) { return f; }
static inline float rnd(float f) { return f; }
#else
typedef uint16_t act;

static inline float ld(act h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

/* Round to nearest even, NaN to 0x7fc0: c10::BFloat16's conversion. */
static inline act st(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (act)0x7fc0;
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (act)(v.u >> 16);
}

static inline float rnd(float f) { return ld(st(f)); }
#endif

/* VL float32 lanes (a GCC vector: 16 with AVX512, else 8) and a load of VL `act` values
   into them (bfloat16: zero-extended and shifted, exactly as `ld`). */
#if defined(__AVX512F__)
enum { VL = 16 };
#else
enum { VL = 8 };
#endif
typedef float vfl __attribute__((vector_size(VL * sizeof(float))));
#ifdef CP_FLOAT32
static inline vfl ldv(const act *p) {
    vfl v;
    memcpy(&v, p, sizeof v);
    return v;
}
#elif defined(__AVX512F__)
static inline vfl ldv(const act *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return (vfl)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#elif defined(__AVX2__)
static inline vfl ldv(const act *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return (vfl)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#else
static inline vfl ldv(const act *p) {
    vfl v;
    for (int l = 0; l < VL; l++) v[l] = ld(p[l]);
    return v;
}
#endif

/* x in every lane. */
static inline vfl splat(float x) {
#if defined(__AVX512F__)
    return (vfl)_mm512_set1_ps(x);
#elif defined(__AVX2__)
    return (vfl)_mm256_set1_ps(x);
#else
    vfl v;
    for (int l = 0; l < VL; l++) v[l] = x;
    return v;
#endif
}

/* e^x in float32 within 2 ulp (Cody-Waite reduction, Cephes' degree-6 polynomial), written
   so that loops over it vectorize (libm's expf does not); 0 below -87.3 (where e^x is a
   denormal), +inf above 88.7. */
static inline float exp_f(float x) {
    const float big = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + big) - big;
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    const float lo = -87.3365f, hi = 88.7228f;
    const int32_t e = (int32_t)(x < lo ? 0.0f : x > hi ? 0.0f : n);
    const int32_t e1 = e / 2;  /* 2^e in two normal factors: e runs from -126 to 128 */
    union { uint32_t u; float f; } s1, s2;
    s1.u = (uint32_t)(e1 + 127) << 23;
    s2.u = (uint32_t)(e - e1 + 127) << 23;
    const float y = p * s1.f * s2.f;
    return x < lo ? 0.0f : x > hi ? INFINITY : y;
}

/* x [B, H] float32 += delta [B, H] act (skipped when delta is NULL); then
   out [B, H] = act(x * rsqrt(mean(x^2) + eps) * w), w [H] float32. */
void cp_add_rms(float *x, const act *delta, const float *w, act *out, int64_t rows,
                int64_t hidden, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * hidden;
        if (delta) {
            const act *dr = delta + r * hidden;
#pragma omp simd
            for (int64_t j = 0; j < hidden; j++) xr[j] += ld(dr[j]);
        }
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < hidden; j++) ss += xr[j] * xr[j];
        const float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
        act *o = out + r * hidden;
#pragma omp simd
        for (int64_t j = 0; j < hidden; j++) o[j] = st((xr[j] * inv) * w[j]);
    }
}

/* The scores q.k of a KV group's heads (q [group, d]) against cached columns lo..hi-1 whose
   transposed keys are at kt (component j of column u's key at kt[j C + u]), into
   sc[g C + u]: COLS columns at a time, their sums in registers (COLS / VL vectors) while the
   d rows of K^T stream past. Each column's sum runs over j in order. */
static void scores(const float *q, int64_t group, int64_t d, const act *kt, int64_t cap,
                   int64_t lo, int64_t hi, float *sc) {
    for (int64_t u0 = lo; u0 < hi; u0 += COLS) {
        const int64_t w = hi - u0 < COLS ? hi - u0 : COLS;
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * d;
            float *sg = sc + g * cap + u0;
            if (w == COLS) {
                vfl a[COLS / VL];
                for (int i = 0; i < COLS / VL; i++) a[i] = (vfl){0};
                for (int64_t j = 0; j < d; j++) {
                    const vfl qj = splat(qg[j]);
                    const act *kj = kt + j * cap + u0;
                    for (int i = 0; i < COLS / VL; i++) a[i] += qj * ldv(kj + VL * i);
                }
                memcpy(sg, a, sizeof a);
            } else {
                float a[COLS] = {0.0f};
                for (int64_t j = 0; j < d; j++) {
                    const float qj = qg[j];
                    const act *kj = kt + j * cap + u0;
                    for (int64_t l = 0; l < w; l++) a[l] += qj * ld(kj[l]);
                }
                for (int64_t l = 0; l < w; l++) sg[l] = a[l];
            }
        }
    }
}

/* Where row b's step reads its cached columns: its own cache, except columns lo..hi-1,
   which are row src's columns lo + off..hi - 1 + off (the same keys and values: rows of one
   prompt, or a prompt prefix computed once), and nothing before `first` (pad columns, masked:
   their attention weights are 0). reads [B, 5] int64 = (first, src, lo, hi, off). */
enum { READ_FIRST, READ_SRC, READ_LO, READ_HI, READ_OFF, READ_FIELDS };

/* One decode step's attention for the new column t of every row.
   qkv [B, (nh + 2 nkv) d] act: the fused projection (queries, keys, values).
   cos, sin [C, d] float32 rotary tables (sin signed: its first half negated), pos [B] int64.
   kc [B, nkv, d, C] (keys, transposed) and vc [B, nkv, C, d] act: the block's cache;
   column t is written here. bias [B, C] float32 (0 or -inf: pad columns). reads [B, 5]
   int64: which cached columns each row reads from where (READ_*; the caller keeps the
   columns it names written and equal). scratch [B nkv, (nh / nkv) C] float32.
   out [B, nh d] act. The items run KV head by KV head, so that the rows that read one
   source row's columns follow each other and find them in cache. */
void cp_rope_attend(const act *qkv, const float *cos_t, const float *sin_t,
                    const int64_t *pos, act *kc, act *vc, const float *bias,
                    const int64_t *reads, float *scratch, act *out, int64_t rows, int64_t nh,
                    int64_t nkv, int64_t d, int64_t cap, int64_t t, float scale) {
    const int64_t group = nh / nkv, n = t + 1, width = (nh + 2 * nkv) * d, half = d / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t h = 0; h < nkv; h++) {
        for (int64_t b = 0; b < rows; b++) {
            const act *row = qkv + b * width;
            const float *c = cos_t + pos[b] * d, *s = sin_t + pos[b] * d;
            act *K = kc + (b * nkv + h) * d * cap;
            act *V = vc + (b * nkv + h) * cap * d;
            float *sc = scratch + (b * nkv + h) * group * cap;
            const act *kin = row + (nh + h) * d, *vin = row + (nh + nkv + h) * d;
            for (int64_t j = 0; j < d; j++) {
                const float rot = ld(kin[j < half ? j + half : j - half]);
                K[j * cap + t] = st(ld(kin[j]) * c[j] + rot * s[j]);
                V[t * d + j] = vin[j];
            }
            float q[group * d];
            for (int64_t g = 0; g < group; g++) {
                const act *qin = row + (h * group + g) * d;
                for (int64_t j = 0; j < d; j++) {
                    const float rot = ld(qin[j < half ? j + half : j - half]);
                    q[g * d + j] = rnd(ld(qin[j]) * c[j] + rot * s[j]);
                }
            }
            /* three runs of columns: own first..lo-1, the source's lo..hi-1, own hi..t */
            const int64_t *rd = reads + b * READ_FIELDS;
            const int64_t first = rd[READ_FIRST] < n ? rd[READ_FIRST] : n;
            const int64_t lo = rd[READ_LO] < first ? first : rd[READ_LO] < n ? rd[READ_LO] : n;
            const int64_t hi = rd[READ_HI] < lo ? lo : rd[READ_HI] < n ? rd[READ_HI] : n;
            const int64_t src = rd[READ_SRC], off = rd[READ_OFF];
            const act *kt[3] = {K, kc + (src * nkv + h) * d * cap + off, K};
            const act *vt[3] = {V, vc + (src * nkv + h) * cap * d + off * d, V};
            const int64_t run_lo[3] = {first, lo, hi}, run_hi[3] = {lo, hi, n};
            for (int64_t g = 0; g < group; g++)
                for (int64_t u = 0; u < first; u++) sc[g * cap + u] = -INFINITY;
            for (int r = 0; r < 3; r++)
                scores(q, group, d, kt[r], cap, run_lo[r], run_hi[r], sc);
            const float *mask = bias + b * cap;
            for (int64_t g = 0; g < group; g++) {  /* softmax in float32, weights to act */
                float *sg = sc + g * cap, top = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : top)
                for (int64_t u = 0; u < n; u++) {
                    sg[u] = fmaf(rnd(sg[u]), scale, mask[u]);
                    top = sg[u] > top ? sg[u] : top;
                }
#pragma omp simd reduction(+ : sum)
                for (int64_t u = 0; u < n; u++) {
                    sg[u] = exp_f(sg[u] - top);
                    sum += sg[u];
                }
                const float inv = 1.0f / sum;
#pragma omp simd
                for (int64_t u = 0; u < n; u++) sg[u] = rnd(sg[u] * inv);
            }
            /* weights x values: DV value columns of one head at a time summed in registers
               (DV / VL vectors) over the cached columns in order; the rest of d (when d is
               not a multiple of DV) a column at a time */
            const int64_t dv = d - d % DV;
            for (int64_t g = 0; g < group; g++) {
                const float *pg = sc + g * cap;
                act *o = out + b * nh * d + (h * group + g) * d;
                for (int64_t j0 = 0; j0 < dv; j0 += DV) {
                    vfl a[DV / VL];
                    for (int i = 0; i < DV / VL; i++) a[i] = (vfl){0};
                    for (int r = 0; r < 3; r++)
                        for (int64_t u = run_lo[r]; u < run_hi[r]; u++) {
                            const float p = pg[u];
                            if (p == 0.0f) continue;
                            const vfl pv = splat(p);
                            const act *vu = vt[r] + u * d + j0;
                            for (int i = 0; i < DV / VL; i++) a[i] += pv * ldv(vu + VL * i);
                        }
                    const float *af = (const float *)a;
                    for (int64_t j = 0; j < DV; j++) o[j0 + j] = st(af[j]);
                }
                for (int64_t j = dv; j < d; j++) {
                    float a = 0.0f;
                    for (int r = 0; r < 3; r++)
                        for (int64_t u = run_lo[r]; u < run_hi[r]; u++) {
                            const float p = pg[u];
                            if (p != 0.0f) a += p * ld(vt[r][u * d + j]);
                        }
                    o[j] = st(a);
                }
            }
        }
    }
}

/* out [B, I] = act(act(silu(gate)) * up), gu [B, 2 I] act (gate columns, then up). */
void cp_silu_mul(const act *gu, act *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= 16384)
    for (int64_t b = 0; b < rows; b++) {
        const act *gate = gu + b * 2 * inter, *up = gate + inter;
        act *o = out + b * inter;
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) {
            const float g = ld(gate[j]);
            o[j] = st(rnd(g / (1.0f + exp_f(-g))) * ld(up[j]));
        }
    }
}

/* y [n] = exp_f(x [n]) (tests check its accuracy against float64). */
void cp_exp(const float *x, float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = exp_f(x[i]);
}

#ifdef CP_FLOAT32
enum { SMALL_ROWS = 32 };  /* rows the float32 `cp_small_linear` serves */
#elif defined(__AVX512BF16__)
enum { SMALL_ROWS = 32 };  /* rows the bfloat16 `cp_small_linear` serves */
#else
enum { SMALL_ROWS = 0 };  /* a bfloat16 library without AVX512-BF16: no small-row matmul */
#endif

/* The most rows `cp_small_linear` takes (0: this library has none). */
int64_t cp_small_rows(void) { return SMALL_ROWS; }

#ifdef CP_FLOAT32
/* The float32 small-row matmul works on panels of PANEL weight rows (two vectors of VW
   floats: 16-float vectors and up to 12 rows of x per tile with AVX512's 32 registers, else
   8-float vectors and up to 6 rows, 12 of 16 registers holding sums). */
#ifdef __AVX512F__
enum { VW = 16, TILE_ROWS = 12 };
#else
enum { VW = 8, TILE_ROWS = 6 };
#endif
enum { PANEL = 2 * VW };
typedef float vf __attribute__((vector_size(VW * sizeof(float))));

static inline vf load_vf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The number of weight rows in a panel (`cp_pack_panels`: N must be a multiple of it). */
int64_t cp_panel_rows(void) { return PANEL; }

/* W [N, K] float32 (N % PANEL == 0) -> p [N / PANEL][K][PANEL]: each panel's PANEL weights
   of one input column side by side (two vector loads). */
void cp_pack_panels(const float *w, float *p, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / PANEL; nb++)
        for (int64_t c = 0; c < k; c++)
            for (int64_t l = 0; l < PANEL; l++)
                p[(nb * k + c) * PANEL + l] = w[(nb * PANEL + l) * k + c];
}

/* Rows m0..m0+MR-1 of y against panel nb: 2 x MR vector sums in registers, each column's
   two weight vectors loaded once for the MR rows. The first tile of a panel prefetches the
   next panel (pf, NULL for none), so that its stream from memory overlaps this panel's
   arithmetic. */
#define PANEL_TILE(MR)                                                                    \
    {                                                                                     \
        vf a0[MR], a1[MR];                                                                \
        for (int r = 0; r < MR; r++) a0[r] = a1[r] = (vf){0};                             \
        const float *xm = x + m0 * k;                                                     \
        for (int64_t c = 0; c < k; c++) {                                                 \
            const vf w0 = load_vf(wb + c * PANEL), w1 = load_vf(wb + c * PANEL + VW);     \
            if (pf) {                                                                     \
                __builtin_prefetch(pf + c * PANEL, 0, 3);                                 \
                if (VW == 16) __builtin_prefetch(pf + c * PANEL + VW, 0, 3);              \
            }                                                                             \
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                       \
                const float xs = xm[r * k + c];                                           \
                a0[r] += w0 * xs;                                                         \
                a1[r] += w1 * xs;                                                         \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < MR; r++) {                                                    \
            float *yr = y + (m0 + r) * n + nb * PANEL;                                    \
            const vf s0 = a0[r] + bias0, s1 = a1[r] + bias1;                              \
            memcpy(yr, &s0, sizeof s0);                                                   \
            memcpy(yr + VW, &s1, sizeof s1);                                              \
        }                                                                                 \
        pf = NULL;                                                                        \
        m0 += MR;                                                                         \
    }

/* y [M, N] = x [M, K] W^T (+ b [N] when not NULL), 1 <= M <= SMALL_ROWS, W given as
   p = `cp_pack_panels(W)`. A decode step of a few rows: each thread takes whole panels and
   every row of x against each, in tiles of TILE_ROWS (then 8, 4, 2, 1) rows. Float32 sums
   over K in order, another order than oneDNN's or MKL's (no rounding). */
void cp_small_linear(const float *x, const float *p, const float *b, float *y, int64_t m,
                     int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / PANEL; nb++) {
        const float *wb = p + nb * k * PANEL;
        const float *pf = nb + 1 < n / PANEL ? wb + k * PANEL : NULL;
        const vf bias0 = b ? load_vf(b + nb * PANEL) : (vf){0};
        const vf bias1 = b ? load_vf(b + nb * PANEL + VW) : (vf){0};
        for (int64_t m0 = 0; m0 < m;) {
            const int64_t left = m - m0;
            if (left >= TILE_ROWS)
                PANEL_TILE(TILE_ROWS)
            else if (TILE_ROWS > 8 && left >= 8)
                PANEL_TILE(8)
            else if (left >= 4)
                PANEL_TILE(4)
            else if (left >= 2)
                PANEL_TILE(2)
            else
                PANEL_TILE(1)
        }
    }
}
#endif

#if !defined(CP_FLOAT32) && defined(__AVX512BF16__)
/* W [N, K] bfloat16 (N % 16 == 0, K even) -> p in the layout `cp_small_linear` reads:
   [N / 16][K / 2][16][2], each 16-row block's column pairs side by side (one AVX512-BF16
   dot-product operand per column pair). */
void cp_pack_pairs(const act *w, act *p, int64_t n, int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < n / 16; nb++)
        for (int64_t kp = 0; kp < k / 2; kp++)
            for (int64_t l = 0; l < 16; l++) {
                const act *src = w + (nb * 16 + l) * k + 2 * kp;
                act *dst = p + ((nb * (k / 2) + kp) * 16 + l) * 2;
                dst[0] = src[0];
                dst[1] = src[1];
            }
}

/* Rows m0..m0+MR-1 of y against NB 16-column blocks from nb on: NB x MR float32
   accumulators (at most 24 of the 32 registers), each column pair of W loaded once and each
   pair of x broadcast once for the NB blocks. */
#define PAIRS_TILE(NB, MR)                                                                \
    {                                                                                     \
        __m512 a[NB][MR];                                                                 \
        for (int j = 0; j < NB; j++)                                                      \
            for (int r = 0; r < MR; r++) a[j][r] = _mm512_setzero_ps();                   \
        const act *xm = x + m0 * k;                                                       \
        for (int64_t kp = 0; kp < kh; kp++) {                                             \
            __m512bh wv[NB];                                                              \
            for (int j = 0; j < NB; j++)                                                  \
                wv[j] = (__m512bh)_mm512_loadu_si512(wb + (j * kh + kp) * 32);            \
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                       \
                int32_t pair;                                                             \
                memcpy(&pair, xm + r * k + 2 * kp, sizeof pair);                          \
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);                    \
                for (int j = 0; j < NB; j++) a[j][r] = _mm512_dpbf16_ps(a[j][r], xv, wv[j]); \
            }                                                                             \
        }                                                                                 \
        for (int j = 0; j < NB; j++) {                                                    \
            __m512 bias = _mm512_setzero_ps();                                            \
            if (b) {                                                                      \
                const __m256i bb = _mm256_loadu_si256((const __m256i *)(b + (nb + j) * 16)); \
                bias = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bb), 16)); \
            }                                                                             \
            for (int r = 0; r < MR; r++)                                                  \
                _mm256_storeu_si256((__m256i *)(y + (m0 + r) * n + (nb + j) * 16),        \
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(a[j][r], bias))); \
        }                                                                                 \
    }

#define PAIRS_ROWS(NB)                                                                    \
    for (int64_t m0 = 0; m0 < m;) {                                                       \
        const int64_t left = m - m0;                                                      \
        if (left >= 12) { PAIRS_TILE(NB, 12) m0 += 12; }                                  \
        else if (left >= 8) { PAIRS_TILE(NB, 8) m0 += 8; }                                \
        else if (left >= 4) { PAIRS_TILE(NB, 4) m0 += 4; }                                \
        else { PAIRS_TILE(NB, 1) m0 += 1; }                                               \
    }

/* y [M, N] = act(x [M, K] W^T + b), x and b [N] (NULL: none) bfloat16, W packed by
   `cp_pack_pairs`, 1 <= M <= SMALL_ROWS: a decode step of a few rows. Float32 sums of the
   AVX512-BF16 dot products (each adds two products of bfloat16 pairs), the bias added in
   float32, one rounding to bfloat16: oneDNN's arithmetic in another order. Each thread
   reads its 32-column slices of W once and serves every row from them (at 12-16 rows on a
   2-core Zen 4: 13-15 ms for SmolLM2's 30 blocks and head against oneDNN's 18-21). */
void cp_small_linear(const act *x, const act *wp, const act *b, act *y, int64_t m, int64_t n,
                     int64_t k) {
    const int64_t kh = k / 2, blocks = n / 16;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < blocks - blocks % 2; nb += 2) {
        const act *wb = wp + nb * kh * 32;
        PAIRS_ROWS(2)
    }
    if (blocks % 2) {  /* the last 16 columns of an odd block count */
        const int64_t nb = blocks - 1;
        const act *wb = wp + nb * kh * 32;
        PAIRS_ROWS(1)
    }
}
#endif
