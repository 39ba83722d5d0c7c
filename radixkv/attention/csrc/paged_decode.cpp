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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

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
  for (int64_t t = 0; t < n; ++t) {
    const float* kr = k + sl[t] * Hkv * D;
    if (t == 0)  // the first slots' lines at once, then one slot's PREFETCH ahead per slot
      for (int64_t u = 1; u < n && u < PREFETCH; ++u) prefetch(k, v, sl[u], Hkv, D, h0, span);
    if (t + PREFETCH < n) prefetch(k, v, sl[t + PREFETCH], Hkv, D, h0, span);
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
    float m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) m = sj[t] > m ? sj[t] : m;
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      sj[t] = std::exp(sj[t] - m);
      sum += sj[t];
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t t = 0; t < n; ++t) sj[t] *= inv;
    if (lse_row != nullptr) lse_row[j] = n > 0 ? m + std::log(sum) : -INFINITY;
  }
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
