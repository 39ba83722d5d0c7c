// Decode attention straight from the paged KV pool (CPU, fp32): one query token per row
// attends over the KV slots its row lists, read in place (no gather into a padded copy).
//
// q      (B, Hq, D)      one query per row; rows q_stride floats apart, each row's (Hq, D) contiguous
// k, v   (S, Hkv, D)     the pool's buffers of one layer
// slots  (B, L) int64    each row's KV slots (row b reads its first lens[b])
// lens   (B,)   int64
// out    (B, Hq, D)      softmax(q k^T * scale) v
// lse    (B, Hq) or null log-sum-exp of each row's scaled scores (to merge with other parts)
// k_new, v_new (T, Hkv, D), rows *_stride floats apart, each row's (Hkv, D) contiguous;
// loc    (T,) int64, or null: first store this forward's new tokens' K/V at their slots (the
//        dense pool's store, folded into the same call: a decode step's store + attention is
//        then one call per layer, not three)
//
// With at least as many rows as threads, a work item is a row: each of its tokens' K/V rows is
// read whole, once, for every head (sequential reads). With fewer (batch 1), a work item is a
// (row, KV head) so both threads work; the query heads of one KV head (GQA group) share each
// K/V read either way. Scores go to a per-thread buffer, then softmax, then the weighted sum of
// V. Measured on 2 cores: 18 GB/s of K/V at 8-32 rows of 500-600 consecutive slots; reading by
// (row, head) there fell to 5-6 GB/s at 16-32 rows (three strided passes over the same lines).
// Slots need not be consecutive (a row's pages lie where the allocator put them), so the
// scores pass prefetches K and V PREFETCH slots ahead: several slots' lines are in flight at
// once instead of one, and the V pass then reads lines already on their way.
// On AVX-512 the softmax runs 16 lanes at a time with its own exp (`exp16`): glibc's scalar
// expf, one call per score, held 8 rows of 500 tokens at 22-24 GB/s; vectorised, 28-32. At
// head_dim 64 the dot products and the V sums are explicit 4-register loops: scores 16 slots at
// a time, each query head's 16 dot products summed by one shuffle tree (`sum16`) rather than 16
// horizontal sums, and the V pass takes the query heads of a KV head together (`weighted_v64`:
// each V line loaded once, 4G accumulator chains side by side). Batch 1 at 1,000 slots:
// 2.9-3.2 -> 2.2-2.6 ms for 30 layers; 8 rows of 512: unchanged (A/B, same run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "simd_exp.h"
#ifdef __AVX512F__
#include <immintrin.h>

// Lane i = the sum of a[i]'s 16 lanes, for i < 16: four rounds of shuffles and adds (45 ops for
// 16 sums, where a horizontal sum each takes 8 and a dependent chain).
static inline __m512 sum16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0 a1 a0 a1] partial sums
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: [a0 a1 a2 a3]
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)  // the four 128-bit lanes of c, summed in pairs
    d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

// Scores of query head q (64 floats) over 16 slots' K rows of one KV head (kh[i], 64 floats).
static inline __m512 scores16(const float* q, const float* const* kh) {
  const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16), q2 = _mm512_loadu_ps(q + 32),
               q3 = _mm512_loadu_ps(q + 48);
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    __m512 x = _mm512_mul_ps(q0, _mm512_loadu_ps(kh[i]));
    x = _mm512_fmadd_ps(q1, _mm512_loadu_ps(kh[i] + 16), x);
    x = _mm512_fmadd_ps(q2, _mm512_loadu_ps(kh[i] + 32), x);
    a[i] = _mm512_fmadd_ps(q3, _mm512_loadu_ps(kh[i] + 48), x);
  }
  return sum16(a);
}

// out[j] (64 floats each, j < G) = sum over the n slots of p[j * L + t] * V row of KV head h:
// the G query heads of one KV head together, so each V line is loaded once and 4G accumulator
// chains run side by side (one head at a time waited on its 4 chains' FMA latency).
template <int G>
static inline void weighted_v64(const float* v, const int64_t* sl, int64_t n, int64_t Hkv, int64_t h, const float* p,
                                int64_t L, float* out) {
  __m512 acc[G][4];
#pragma GCC unroll 4
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const float* vh = v + (sl[t] * Hkv + h) * 64;
    const __m512 v0 = _mm512_loadu_ps(vh), v1 = _mm512_loadu_ps(vh + 16), v2 = _mm512_loadu_ps(vh + 32),
                 v3 = _mm512_loadu_ps(vh + 48);
#pragma GCC unroll 4
    for (int j = 0; j < G; ++j) {
      const __m512 w = _mm512_set1_ps(p[j * L + t]);
      acc[j][0] = _mm512_fmadd_ps(w, v0, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(w, v1, acc[j][1]);
      acc[j][2] = _mm512_fmadd_ps(w, v2, acc[j][2]);
      acc[j][3] = _mm512_fmadd_ps(w, v3, acc[j][3]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + j * 64 + 16 * c, acc[j][c]);
}
#endif

extern "C" int radixkv_paged_decode_abi() { return 3; }

static constexpr int64_t PREFETCH = 8;  // slots ahead

// Starts reading slot s's K and V lines of KV heads h0.. (span bytes each) into the cache.
static inline void prefetch(const float* k, const float* v, int64_t s, int64_t Hkv, int64_t D, int64_t h0,
                            int64_t span) {
  const char* nk = reinterpret_cast<const char*>(k + (s * Hkv + h0) * D);
  const char* nv = reinterpret_cast<const char*>(v + (s * Hkv + h0) * D);
  for (int64_t c = 0; c < span; c += 64) {
    __builtin_prefetch(nk + c);
    __builtin_prefetch(nv + c);
  }
}

// One row's query heads of KV heads [h0, h1) over its n slots sl: q_row, out_row (Hq, D) and
// lse_row (Hq,) of that row; scores (>= Hq * L floats) and acc (>= Hq * D) are the thread's.
static void attend(const float* q_row, const float* k, const float* v, const int64_t* sl, int64_t n,
                   float* out_row, float* lse_row, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, float scale,
                   int64_t h0, int64_t h1, float* scores, float* acc) {
  const int64_t g = Hq / Hkv, j0 = h0 * g, j1 = h1 * g;
  const int64_t span = (h1 - h0) * D * static_cast<int64_t>(sizeof(float));  // bytes of a slot's K (or V) read
  int64_t t = 0;
#ifdef __AVX512F__
  if (D == 64) {  // 16 slots at a time: each query head's 16 scores summed by one shuffle tree
    for (int64_t u = 0; u < n && u < 16 + PREFETCH; ++u) prefetch(k, v, sl[u], Hkv, D, h0, span);
    // The next block's slots are prefetched a few per query head, spread over the block's work:
    // all 16 at once (384 lines) overran the outstanding misses the core keeps and ran slower.
    const int64_t per_head = (16 + (j1 - j0) - 1) / (j1 - j0);
    for (; t + 16 <= n; t += 16) {
      int64_t u = t + 16 + PREFETCH;
      const int64_t u_end = std::min(n, t + 32 + PREFETCH);
      for (int64_t h = h0; h < h1; ++h) {
        const float* kh[16];
        for (int i = 0; i < 16; ++i) kh[i] = k + (sl[t + i] * Hkv + h) * D;
        for (int64_t j = h * g; j < (h + 1) * g; ++j) {
          for (int64_t e = std::min(u_end, u + per_head); u < e; ++u) prefetch(k, v, sl[u], Hkv, D, h0, span);
          _mm512_storeu_ps(scores + (j - j0) * L + t, _mm512_mul_ps(scores16(q_row + j * D, kh), _mm512_set1_ps(scale)));
        }
      }
    }
  }
#endif
  for (; t < n; ++t) {
    const float* kr = k + sl[t] * Hkv * D;
    if (t == 0)  // the first slots' lines at once, then one slot's PREFETCH ahead per slot
      for (int64_t u = 1; u < n && u < PREFETCH; ++u) prefetch(k, v, sl[u], Hkv, D, h0, span);
    if (t + PREFETCH < n) prefetch(k, v, sl[t + PREFETCH], Hkv, D, h0, span);
#ifdef __AVX512F__
    if (D == 64) {
      for (int64_t h = h0; h < h1; ++h) {
        const float* kh = kr + h * D;
        const __m512 k0 = _mm512_loadu_ps(kh), k1 = _mm512_loadu_ps(kh + 16), k2 = _mm512_loadu_ps(kh + 32),
                     k3 = _mm512_loadu_ps(kh + 48);
        for (int64_t j = h * g; j < (h + 1) * g; ++j) {
          const float* qj = q_row + j * D;
          __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qj), k0);
          a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16), k1, a);
          a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 32), k2, a);
          a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 48), k3, a);
          scores[(j - j0) * L + t] = _mm512_reduce_add_ps(a) * scale;
        }
      }
      continue;
    }
#endif
    for (int64_t j = j0; j < j1; ++j) {
      const float* qj = q_row + j * D;
      const float* kh = kr + (j / g) * D;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qj[d] * kh[d];
      scores[(j - j0) * L + t] = s * scale;
    }
  }
  for (int64_t j = j0; j < j1; ++j) {
    float* sj = scores + (j - j0) * L;
    float m, sum;
    softmax_row(sj, n, &m, &sum);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t t = 0; t < n; ++t) sj[t] *= inv;
    if (lse_row != nullptr) lse_row[j] = n > 0 ? m + std::log(sum) : -INFINITY;
  }
#ifdef __AVX512F__
  if (D == 64) {
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t j = h * g; j < (h + 1) * g; j += 4) {  // up to 4 query heads of KV head h at once
        const float* p = scores + (j - j0) * L;
        float* o = out_row + j * D;
        switch ((h + 1) * g - j) {
          case 1: weighted_v64<1>(v, sl, n, Hkv, h, p, L, o); break;
          case 2: weighted_v64<2>(v, sl, n, Hkv, h, p, L, o); break;
          case 3: weighted_v64<3>(v, sl, n, Hkv, h, p, L, o); break;
          default: weighted_v64<4>(v, sl, n, Hkv, h, p, L, o); break;
        }
      }
    return;
  }
#endif
  for (int64_t i = 0; i < (j1 - j0) * D; ++i) acc[i] = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    const float* vr = v + sl[t] * Hkv * D;
    for (int64_t j = j0; j < j1; ++j) {
      const float p = scores[(j - j0) * L + t];
      float* aj = acc + (j - j0) * D;
      const float* vh = vr + (j / g) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) aj[d] += p * vh[d];
    }
  }
  for (int64_t i = 0; i < (j1 - j0) * D; ++i) out_row[j0 * D + i] = acc[i];
}

// Returns 0; or, storing and computing nothing, minus the number of new tokens whose slot lies
// outside the pool's S slots; or, computing nothing (the store done), the number of rows whose
// length or slots fall outside the pool's S slots / the L columns: a bad plan never reads or
// writes past the buffers.
extern "C" int64_t radixkv_paged_decode(const float* q, float* k, float* v, const int64_t* slots,
                                        const int64_t* lens, float* out, float* lse, int64_t B, int64_t Hq,
                                        int64_t Hkv, int64_t D, int64_t L, int64_t S, float scale,
                                        const float* k_new, const float* v_new, const int64_t* loc, int64_t T,
                                        int64_t q_stride, int64_t k_new_stride, int64_t v_new_stride) {
  int64_t bad = 0;
  for (int64_t i = 0; i < T; ++i) bad += loc[i] < 0 || loc[i] >= S;
  if (bad) return -bad;
  for (int64_t i = 0; i < T; ++i) {  // store first: each row attends to its own new token
    std::memcpy(k + loc[i] * Hkv * D, k_new + i * k_new_stride, static_cast<size_t>(Hkv * D) * sizeof(float));
    std::memcpy(v + loc[i] * Hkv * D, v_new + i * v_new_stride, static_cast<size_t>(Hkv * D) * sizeof(float));
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[b];
    bool ok = n >= 0 && n <= L;
    for (int64_t t = 0; ok && t < n; ++t) ok = slots[b * L + t] >= 0 && slots[b * L + t] < S;
    bad += !ok;
  }
  if (bad) return bad;
  const int64_t per_item = B >= omp_get_max_threads() ? Hkv : 1;  // KV heads of one work item
  const int64_t items = B * (Hkv / per_item);
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(Hq * (L > 0 ? L : 1)));
    std::vector<float> acc(static_cast<size_t>(Hq * D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / (Hkv / per_item), h0 = item % (Hkv / per_item) * per_item;
      attend(q + b * q_stride, k, v, slots + b * L, lens[b], out + b * Hq * D, lse ? lse + b * Hq : nullptr, Hq, Hkv,
             D, L, scale, h0, h0 + per_item, scores.data(), acc.data());
    }
  }
  return 0;
}
