// y (M, N) = x (M, K) @ W^T [+ bias (N)] [+ residual (M, N)] for a few rows (decode), reading W
// where oneDNN packed it: panels P[N / NB][K][NB], NB columns of W^T contiguous for each k
// (radixkv/model/packed_gemm.py checks that layout before calling). At 1-16 rows the product
// is bound by streaming the weights once, which this does at the memory's rate; oneDNN's kernels
// for the same buffer reach 55-85 % of it there.
//
// Plain C++ with GCC vector extensions (no torch headers), built on first use with
// -O3 -march=native -fopenmp; `#pragma omp parallel` runs on the OpenMP runtime torch loaded.
#include <cstdint>
#include <cstring>
#include <omp.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));  // one AVX-512 register of floats

static inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

#ifdef __AVX512F__
#define MR_MAX 8  // rows per register tile: 8 x 4 accumulators (measured best at 8 and 16 rows)
#else
#define MR_MAX 2
#endif
#define PREFETCH_K 8  // rows of k ahead (see tile)

// Rows [0, MR) against NV 16-wide column vectors of one panel, over all of K, in registers.
// The loops over rows and vectors are unrolled by hand-placed pragmas: left to GCC 12 the 8 x 4
// tile kept its accumulators on the stack (1,610 spilled zmm loads and stores in the object,
// 48 after), and a decode step at batch 8 ran 7 % slower (25.8 vs 27.9 ms, A/B in one process).
template <int MR, int NV>
static inline void tile(const float* x, int64_t ldx, const float* panel, int64_t NB, int64_t K,
                        const float* bias, const float* res, float* y, int64_t ldy) {
  v16 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = (v16){};
  const float* p = panel;
  for (int64_t k = 0; k < K; ++k, p += NB) {
    // From 3 rows on the FMAs take long enough that the hardware prefetcher falls behind:
    // asking for the panel 8 rows of k ahead measured 10 % faster at 4 and 8 rows (13.7 -> 12.2
    // and 15.0 -> 13.4 ms for SmolLM2's 538 MB of weights), and no gain at 1-2 rows.
    if (MR >= 3 && k + PREFETCH_K < K) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) __builtin_prefetch(p + PREFETCH_K * NB + 16 * v);
    }
    v16 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load(p + 16 * v);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      v16 a = (v16){} + x[m * ldx + k];  // broadcast
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] += a * b[v];
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      v16 r = acc[m][v];
      if (bias) r += load(bias + 16 * v);
      if (res) r += load(res + m * ldy + 16 * v);
      store(y + m * ldy + 16 * v, r);
    }
}

template <int NV>
static inline void tile_rows(int64_t g, const float* x, int64_t ldx, const float* panel, int64_t NB, int64_t K,
                             const float* bias, const float* res, float* y, int64_t ldy) {
  switch (g) {
    case 1: tile<1, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 2: tile<2, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
#if MR_MAX > 2
    case 3: tile<3, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 4: tile<4, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 5: tile<5, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 6: tile<6, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 7: tile<7, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
    case 8: tile<8, NV>(x, ldx, panel, NB, K, bias, res, y, ldy); break;
#endif
  }
}

// All M rows against NV vectors of one panel, in near-equal groups of at most MR_MAX rows: the
// first group streams the panel from memory, the others find it in cache.
template <int NV>
static void all_rows(const float* x, int64_t ldx, const float* panel, int64_t NB, int64_t M, int64_t K,
                     const float* bias, const float* res, float* y, int64_t ldy) {
  int64_t groups = (M + MR_MAX - 1) / MR_MAX, m = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    int64_t g = (M - m) / (groups - gi);
    tile_rows<NV>(g, x + m * ldx, ldx, panel, NB, K, bias, res ? res + m * ldy : nullptr, y + m * ldy, ldy);
    m += g;
  }
}

extern "C" int64_t radixkv_packed_gemm_abi() { return 1; }

extern "C" int64_t radixkv_packed_gemm_vector_bits() {
#ifdef __AVX512F__
  return 512;
#else
  return 256;
#endif
}

// N and NB are multiples of 16, NB divides N. Each thread takes whole panels, so it streams
// one contiguous range of the buffer (with 15 or 9 panels, a panel split between two threads
// was read in strided halves: splitting at panel bounds, even 8 : 7, measured 1.5-2 % faster
// over SmolLM2's weights); with fewer panels than threads, ranges of 16-column vectors. Within
// a panel a thread takes up to 4 vectors at a time.
extern "C" void radixkv_packed_gemm(const float* x, int64_t ldx, const float* P, const float* bias,
                                    const float* res, float* y, int64_t M, int64_t N, int64_t K, int64_t NB) {
  const int64_t nvec = N / 16, per_panel = NB / 16;
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t panels = N / NB;
    const int64_t lo = panels >= nt ? panels * t / nt * per_panel : nvec * t / nt;
    const int64_t hi = panels >= nt ? panels * (t + 1) / nt * per_panel : nvec * (t + 1) / nt;
    for (int64_t v = lo; v < hi;) {
      const int64_t panel = v / per_panel, within = v % per_panel;
      int64_t take = per_panel - within;
      if (take > hi - v) take = hi - v;
      if (take > 4) take = 4;
      const float* p = P + panel * K * NB + within * 16;
      const int64_t col = v * 16;
      const float* b = bias ? bias + col : nullptr;
      const float* r = res ? res + col : nullptr;
      switch (take) {
        case 4: all_rows<4>(x, ldx, p, NB, M, K, b, r, y + col, N); break;
        case 3: all_rows<3>(x, ldx, p, NB, M, K, b, r, y + col, N); break;
        case 2: all_rows<2>(x, ldx, p, NB, M, K, b, r, y + col, N); break;
        default: all_rows<1>(x, ldx, p, NB, M, K, b, r, y + col, N); break;
      }
      v += take;
    }
  }
}
