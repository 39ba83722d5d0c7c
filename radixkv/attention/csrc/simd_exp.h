// e^x on 16 lanes and a row's softmax, for the CPU attention kernels (paged_decode.cpp,
// paged_extend.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#ifdef __AVX512F__
#include <immintrin.h>

// e^x for 16 lanes (x <= 0 here: scores minus their max): Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for e^r (relative error ~2e-7, within fp32 rounding of
// glibc's expf for softmax weights), then scalef by 2^n. Below -87.3 the result is 0.
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.3981999507e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// s[t] = exp(s[t] - m) for t < n, in place; returns their sum (m: the row's max, or above it).
static inline float exp_shifted_row(float* s, int64_t n, float m) {
  const __m512 bm = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), bm));
    _mm512_storeu_ps(s + t, e);
    vs = _mm512_add_ps(vs, e);
  }
  if (t < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - t)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), bm));
    _mm512_mask_storeu_ps(s + t, k, e);
    vs = _mm512_add_ps(vs, _mm512_maskz_mov_ps(k, e));
  }
  return _mm512_reduce_add_ps(vs);
}

// Softmax of one row of n scores in place: returns (max, sum of exp(s - max)).
static inline void softmax_row(float* s, int64_t n, float* m_out, float* sum_out) {
  __m512 vm = _mm512_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + t));
  float m = _mm512_reduce_max_ps(vm);
  for (; t < n; ++t) m = s[t] > m ? s[t] : m;
  *m_out = m;
  *sum_out = exp_shifted_row(s, n, m);
}
#else
static inline void softmax_row(float* s, int64_t n, float* m_out, float* sum_out) {
  float m = -INFINITY;
  for (int64_t t = 0; t < n; ++t) m = s[t] > m ? s[t] : m;
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - m);
    sum += s[t];
  }
  *m_out = m;
  *sum_out = sum;
}
#endif
