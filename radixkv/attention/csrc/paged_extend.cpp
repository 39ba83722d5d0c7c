// Extend attention straight from the paged KV pool (CPU, fp32, head_dim 64, AVX-512): each
// request's new tokens attend causally over its own slots -- its cached prefix and the new
// tokens themselves, already stored -- in one call for the whole batch.
//
// q      (T, Hq, 64)    rows q_stride floats apart, each row's (Hq, 64) contiguous
// k, v   (S, Hkv, 64)   the pool's buffers of one layer
// slots  (B, L) int64   request b's KV slots, its first kv_len[b] used; its q_len[b] new tokens
//                       are the last of them, at rows q_start[b].. of q and out
// out    (T, Hq, 64)    only the requests' rows are written
//
// Why: torch's flash kernel, called per request for the prefix and again for the causal part
// and merged by log-sum-exp, ran the multi-turn workload's follow-ups (7 requests x 66 new
// tokens over 600 cached) at ~120 GFLOP/s, with ~40 us of Python per request and layer around
// it. Here each (request, KV head)'s keys are transposed and its values gathered once; then
// tasks of 16 new tokens of one query head run register tiles of 8 tokens: scores against 16
// keys at a time (keys on the lanes: no horizontal sums), a softmax per token, and the weighted
// values in two halves of the head dim. Later tokens see more keys, so their tasks come first.
// Standalone, per layer: 205-360 GFLOP/s; 8-token tiles against 4-token ones, which re-read
// every K and V line twice as often from L2/L3: 2,144 causal tokens 28.6 -> 14.8 ms.
//
// Returns 0; or -1 (not AVX-512 or head_dim != 64: computing nothing); or, computing nothing,
// the number of requests whose lengths or slots fall outside the pool or the L columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <omp.h>

#include "simd_exp.h"

extern "C" int64_t radixkv_paged_extend_abi() { return 1; }

extern "C" int64_t radixkv_paged_extend_vector_bits() {
#ifdef __AVX512F__
  return 512;
#else
  return 256;  // the kernel computes nothing here
#endif
}

#ifdef __AVX512F__
static constexpr int RT = 8;  // new tokens of one query head per register tile

// Masked scores of one 16-key block for row r: keys at or past `lim` (its causal end) get -inf.
static inline __m512 masked(__m512 a, float scale, int64_t t0, int64_t lim) {
  __m512 x = _mm512_mul_ps(a, _mm512_set1_ps(scale));
  if (t0 + 16 > lim) {
    const int64_t keep = lim > t0 ? lim - t0 : 0;
    x = _mm512_mask_blend_ps(static_cast<__mmask16>((1u << keep) - 1), _mm512_set1_ps(-INFINITY), x);
  }
  return x;
}

// Rows [0, R) (R <= RT) of one query head: positions pos0 + r, each attending keys [0, pos0 + r].
// kT (64, Lk): the keys transposed; vv (Lk, 64): the values; s: RT * Lk scratch. RT rows share
// every K and V line loaded: at 8 rows the V pass runs in two halves of the head dim (8 x 2
// accumulators each) so the 8 rows' sums stay in registers.
template <int RT>
static void tile(const float* const* qrow, int R, int64_t pos0, const float* kT, const float* vv, int64_t Lk,
                 float scale, float* s, float* const* orow) {
  const int64_t lim_last = pos0 + R;  // keys the last row sees
  const int64_t nblk = (lim_last + 15) / 16;
  float mx[RT];
  for (int r = 0; r < RT; ++r) mx[r] = -INFINITY;
  constexpr int KB = RT == 8 ? 1 : 2;  // 16-key blocks per pass: RT x KB accumulators
  int64_t b = 0;
  for (; b + KB <= nblk; b += KB) {
    __m512 a[RT][KB];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < KB; ++c) a[r][c] = _mm512_setzero_ps();
    const float* kp = kT + b * 16;
    for (int d = 0; d < 64; ++d, kp += Lk) {
      __m512 kc[KB];
      for (int c = 0; c < KB; ++c) kc[c] = _mm512_loadu_ps(kp + 16 * c);
#pragma GCC unroll 8
      for (int r = 0; r < RT; ++r) {
        const __m512 qd = _mm512_set1_ps(qrow[r][d]);
        for (int c = 0; c < KB; ++c) a[r][c] = _mm512_fmadd_ps(qd, kc[c], a[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < KB; ++c) {
        const __m512 x = masked(a[r][c], scale, (b + c) * 16, pos0 + r + 1);
        _mm512_storeu_ps(s + r * Lk + (b + c) * 16, x);
        mx[r] = std::max(mx[r], _mm512_reduce_max_ps(x));
      }
  }
  for (; b < nblk; ++b) {  // a last odd block (KB = 2)
    __m512 a[RT];
    for (int r = 0; r < RT; ++r) a[r] = _mm512_setzero_ps();
    const float* kp = kT + b * 16;
    for (int d = 0; d < 64; ++d, kp += Lk) {
      const __m512 k0 = _mm512_loadu_ps(kp);
      for (int r = 0; r < RT; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(qrow[r][d]), k0, a[r]);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 x = masked(a[r], scale, b * 16, pos0 + r + 1);
      _mm512_storeu_ps(s + r * Lk + b * 16, x);
      mx[r] = std::max(mx[r], _mm512_reduce_max_ps(x));
    }
  }
  float inv[RT];
  const int64_t n16 = nblk * 16;
  for (int r = 0; r < RT; ++r) {
    inv[r] = 0.f;
    if (r >= R) {  // a padding row: weights 0
      for (int64_t t = 0; t < n16; t += 16) _mm512_storeu_ps(s + r * Lk + t, _mm512_setzero_ps());
      continue;
    }
    inv[r] = 1.f / exp_shifted_row(s + r * Lk, n16, mx[r]);  // the masked keys' -inf give 0
  }
  constexpr int NC = RT == 8 ? 2 : 4;  // 16-float columns of V per pass
  for (int c0 = 0; c0 < 4; c0 += NC) {
    __m512 o[RT][NC];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < NC; ++c) o[r][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < lim_last; ++t) {
      const float* vt = vv + t * 64 + 16 * c0;
      __m512 vc[NC];
      for (int c = 0; c < NC; ++c) vc[c] = _mm512_loadu_ps(vt + 16 * c);
#pragma GCC unroll 8
      for (int r = 0; r < RT; ++r) {
        const __m512 w = _mm512_set1_ps(s[r * Lk + t]);
        for (int c = 0; c < NC; ++c) o[r][c] = _mm512_fmadd_ps(w, vc[c], o[r][c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 iv = _mm512_set1_ps(inv[r]);
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(orow[r] + 16 * (c0 + c), _mm512_mul_ps(o[r][c], iv));
    }
  }
}
#endif

// Each request b's q_len[b] new tokens (rows q_start[b].. of q and out, T rows) attend causally
// over its kv_len[b] slots (slots[b, :kv_len[b]], the new tokens' last): token i sees keys
// [0, kv_len - q_len + i].
extern "C" int64_t radixkv_paged_extend(const float* q, int64_t q_stride, const float* k, const float* v,
                                        const int64_t* slots, const int64_t* kv_len, const int64_t* q_start,
                                        const int64_t* q_len, float* out, int64_t B, int64_t T, int64_t Hq,
                                        int64_t Hkv, int64_t D, int64_t L, int64_t S, float scale) {
#ifndef __AVX512F__
  return -1;
#else
  if (D != 64 || Hkv <= 0 || Hq % Hkv != 0) return -1;
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b) {
    bool ok = q_len[b] >= 0 && kv_len[b] >= q_len[b] && kv_len[b] <= L && q_start[b] >= 0 &&
              q_start[b] + q_len[b] <= T;
    for (int64_t t = 0; ok && t < kv_len[b]; ++t) ok = slots[b * L + t] >= 0 && slots[b * L + t] < S;
    bad += !ok;
  }
  if (bad) return bad;
  // Phase 1: each (request, KV head)'s keys transposed and values gathered once, into one buffer.
  const int64_t g = Hq / Hkv;
  std::vector<int64_t> off(B + 1, 0), lk(B);
  for (int64_t b = 0; b < B; ++b) {
    lk[b] = (kv_len[b] + 31) / 32 * 32;
    // A row stride of a multiple of 1 KB puts the 64 rows of a key block in one set of the L1
    // (the 4 KB aliasing): 1,958 cached + 90 new ran 1.4-1.6x slower than 2,000 + 100.
    if (lk[b] % 256 == 0) lk[b] += 32;
    off[b + 1] = off[b] + Hkv * lk[b] * 64;
  }
  // Not zeroed: the columns past a request's keys are read only in its last 16-key block, where
  // the causal mask replaces whatever they give.
  std::unique_ptr<float[]> kT(new float[off[B]]), vv(new float[off[B]]);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * Hkv; ++bh) {
    const int64_t b = bh / Hkv, h = bh % Hkv, Lk = lk[b];
    float* kt = kT.get() + off[b] + h * Lk * 64;
    float* vh = vv.get() + off[b] + h * Lk * 64;
    const int64_t* sl = slots + b * L;
    for (int64_t t = 0; t < kv_len[b]; ++t) {
      const float* kr = k + (sl[t] * Hkv + h) * 64;
      for (int d = 0; d < 64; ++d) kt[d * Lk + t] = kr[d];
      std::memcpy(vh + t * 64, v + (sl[t] * Hkv + h) * 64, 64 * sizeof(float));
    }
  }
  // Phase 2: tasks of up to 16 new tokens of one query head; later tokens (more keys) first.
  constexpr int64_t TQ = 16;
  std::vector<int64_t> task_b, task_j, task_i;
  int64_t lk_max = 32;
  for (int64_t b = 0; b < B; ++b) {
    lk_max = std::max(lk_max, lk[b]);
    for (int64_t h = 0; h < Hkv; ++h)  // a (request, KV head)'s tasks together: its keys stay in cache
      for (int64_t i = (q_len[b] - 1) / TQ * TQ; i >= 0; i -= TQ)
        for (int64_t j = h * g; j < (h + 1) * g; ++j) { task_b.push_back(b); task_j.push_back(j); task_i.push_back(i); }
  }
  const int64_t tasks = static_cast<int64_t>(task_b.size());
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(RT * lk_max));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < tasks; ++it) {
      const int64_t b = task_b[it], j = task_j[it], h = j / g, i0 = task_i[it];
      const int64_t n = q_len[b], P = kv_len[b] - n, i1 = std::min(n, i0 + TQ), Lk = lk[b];
      const float* kt = kT.get() + off[b] + h * Lk * 64;
      const float* vh = vv.get() + off[b] + h * Lk * 64;
      for (int64_t i = i0; i < i1; i += RT) {
        const int R = static_cast<int>(std::min<int64_t>(RT, i1 - i));
        const float* qrow[RT];
        float* orow[RT];
        for (int r = 0; r < RT; ++r) {
          const int64_t row = q_start[b] + i + std::min(r, R - 1);
          qrow[r] = q + row * q_stride + j * 64;
          orow[r] = out + (row * Hq + j) * 64;
        }
        tile<RT>(qrow, R, P + i, kt, vh, Lk, scale, s.data(), orow);  // s: RT rows of Lk <= lk_max
      }
    }
  }
  return 0;
#endif
}
