// Decode attention straight from the paged KV pool (CPU, fp32): one query token per row
// attends over the KV slots its row lists, read in place (no gather into a padded copy).
//
// q      (B, Hq, D)      one query per row
// k, v   (S, Hkv, D)     the pool's buffers of one layer
// slots  (B, L) int64    each row's KV slots (row b reads its first lens[b])
// lens   (B,)   int64
// out    (B, Hq, D)      softmax(q k^T * scale) v
// lse    (B, Hq) or null log-sum-exp of each row's scaled scores (to merge with other parts)
//
// With at least as many rows as threads, a work item is a row: each of its tokens' K/V rows is
// read whole, once, for every head (sequential reads). With fewer (batch 1), a work item is a
// (row, KV head) so both threads work; the query heads of one KV head (GQA group) share each
// K/V read either way. Scores go to a per-thread buffer, then softmax, then the weighted sum of
// V. Measured on 2 cores: 18 GB/s of K/V at 8-32 rows of 500-600 consecutive slots; reading by
// (row, head) there fell to 5-6 GB/s at 16-32 rows (three strided passes over the same lines).
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

extern "C" int radixkv_paged_decode_abi() { return 2; }

static void by_head(const float* q, const float* k, const float* v, const int64_t* slots,
                                     const int64_t* lens, float* out, float* lse, int64_t B, int64_t Hq,
                                     int64_t Hkv, int64_t D, int64_t L, float scale) {
  const int64_t g = Hq / Hkv;
  const int64_t items = B * Hkv;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(g * (L > 0 ? L : 1)));
    std::vector<float> acc(static_cast<size_t>(g * D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t n = lens[b];
      const int64_t* sl = slots + b * L;
      const float* qh = q + (b * Hq + h * g) * D;
      for (int64_t t = 0; t < n; ++t) {
        const float* kr = k + (sl[t] * Hkv + h) * D;
        if (t + 1 < n) __builtin_prefetch(k + (sl[t + 1] * Hkv + h) * D);
        for (int64_t j = 0; j < g; ++j) {
          const float* qj = qh + j * D;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < D; ++d) s += qj[d] * kr[d];
          scores[j * L + t] = s * scale;
        }
      }
      for (int64_t j = 0; j < g; ++j) {
        float* sj = scores.data() + j * L;
        float m = -INFINITY;
        for (int64_t t = 0; t < n; ++t) m = sj[t] > m ? sj[t] : m;
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          sj[t] = std::exp(sj[t] - m);
          sum += sj[t];
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t t = 0; t < n; ++t) sj[t] *= inv;
        if (lse != nullptr) lse[b * Hq + h * g + j] = n > 0 ? m + std::log(sum) : -INFINITY;
      }
      for (int64_t i = 0; i < g * D; ++i) acc[i] = 0.f;
      for (int64_t t = 0; t < n; ++t) {
        const float* vr = v + (sl[t] * Hkv + h) * D;
        if (t + 1 < n) __builtin_prefetch(v + (sl[t + 1] * Hkv + h) * D);
        for (int64_t j = 0; j < g; ++j) {
          const float p = scores[j * L + t];
          float* aj = acc.data() + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) aj[d] += p * vr[d];
        }
      }
      float* oh = out + (b * Hq + h * g) * D;
      for (int64_t i = 0; i < g * D; ++i) oh[i] = acc[i];
    }
  }
}

static void one_row(const float* q, const float* k, const float* v, const int64_t* sl, int64_t n, float* out, float* lse,
                    int64_t Hq, int64_t Hkv, int64_t D, int64_t L, float scale, float* scores, float* acc) {
  const int64_t g = Hq / Hkv;
  for (int64_t t = 0; t < n; ++t) {
    const float* kr = k + sl[t] * Hkv * D;
    if (t + 1 < n) { const char* nx = (const char*)(k + sl[t + 1] * Hkv * D); for (int64_t c = 0; c < Hkv * D * 4; c += 64) __builtin_prefetch(nx + c); }
    for (int64_t j = 0; j < Hq; ++j) {
      const float* qj = q + j * D; const float* kh = kr + (j / g) * D;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qj[d] * kh[d];
      scores[j * L + t] = s * scale;
    }
  }
  for (int64_t j = 0; j < Hq; ++j) {
    float* sj = scores + j * L; float m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) m = sj[t] > m ? sj[t] : m;
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) { sj[t] = std::exp(sj[t] - m); sum += sj[t]; }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t t = 0; t < n; ++t) sj[t] *= inv;
    if (lse != nullptr) lse[j] = n > 0 ? m + std::log(sum) : -INFINITY;
  }
  for (int64_t i = 0; i < Hq * D; ++i) acc[i] = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    const float* vr = v + sl[t] * Hkv * D;
    if (t + 1 < n) { const char* nx = (const char*)(v + sl[t + 1] * Hkv * D); for (int64_t c = 0; c < Hkv * D * 4; c += 64) __builtin_prefetch(nx + c); }
    for (int64_t j = 0; j < Hq; ++j) {
      const float p = scores[j * L + t]; float* aj = acc + j * D; const float* vh = vr + (j / g) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) aj[d] += p * vh[d];
    }
  }
  for (int64_t i = 0; i < Hq * D; ++i) out[i] = acc[i];
}

static void by_row(const float* q, const float* k, const float* v, const int64_t* slots,
                                     const int64_t* lens, float* out, float* lse, int64_t B, int64_t Hq,
                                     int64_t Hkv, int64_t D, int64_t L, float scale) {
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(Hq * (L > 0 ? L : 1)));
    std::vector<float> acc(static_cast<size_t>(Hq * D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      one_row(q + b * Hq * D, k, v, slots + b * L, lens[b], out + b * Hq * D, lse ? lse + b * Hq : nullptr, Hq, Hkv, D, L, scale, scores.data(), acc.data());
  }
}

// Returns 0, or (computing nothing) the number of rows whose length or slots fall outside the
// pool's S slots / the L columns: a bad plan never reads past the buffers.
extern "C" int64_t radixkv_paged_decode(const float* q, const float* k, const float* v, const int64_t* slots,
                                        const int64_t* lens, float* out, float* lse, int64_t B, int64_t Hq,
                                        int64_t Hkv, int64_t D, int64_t L, int64_t S, float scale) {
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[b];
    bool ok = n >= 0 && n <= L;
    for (int64_t t = 0; ok && t < n; ++t) ok = slots[b * L + t] >= 0 && slots[b * L + t] < S;
    bad += !ok;
  }
  if (bad) return bad;
  if (B >= omp_get_max_threads())
    by_row(q, k, v, slots, lens, out, lse, B, Hq, Hkv, D, L, scale);
  else
    by_head(q, k, v, slots, lens, out, lse, B, Hq, Hkv, D, L, scale);
  return 0;
}
