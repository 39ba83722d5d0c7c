// radixkv::attention's CPU kernel (radixkv/attention/graph_op.py defines the operator): a pure
// decode step on a dense fp32 pool stores the new K/V and attends in one `radixkv_paged_decode`
// call (paged_decode.cpp, included below) without leaving C++; every other batch goes to the
// Python implementation, `radixkv::attention_py`, through the dispatcher.
//
// Why: the compiled forward calls the operator once per layer, and the Python path around the
// same kernel call (the backend's checks, the argument conversions) cost ~40 us a layer, more
// than the attention of a short decode step itself.
//
// What the direct path needs for the whole forward (each layer's K/V buffers, the rows' slots
// and lengths, the new tokens' slots) is handed over once per forward by
// `radixkv::direct_decode_begin` and dropped by `direct_decode_end`, both called by the Python
// forward context on the thread that runs the graph.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "paged_decode.cpp"

namespace {

struct DirectDecode {
  bool active = false;
  std::vector<at::Tensor> k, v;  // per layer: (S, Hkv, D) fp32 contiguous
  at::Tensor slots;              // (B, L) int64
  at::Tensor lens;               // (B,) int64
  at::Tensor loc;                // (B,) int64: the new tokens' slots
};

thread_local DirectDecode direct;

void direct_decode_begin(at::TensorList k, at::TensorList v, const at::Tensor& slots, const at::Tensor& lens,
                         const at::Tensor& loc) {
  TORCH_CHECK(k.size() == v.size() && !k.empty(), "direct_decode_begin: one K and one V buffer per layer");
  for (size_t i = 0; i < k.size(); ++i) {
    TORCH_CHECK(k[i].scalar_type() == at::kFloat && v[i].scalar_type() == at::kFloat && k[i].is_contiguous() &&
                    v[i].is_contiguous() && k[i].dim() == 3 && k[i].sizes() == v[i].sizes() && k[i].is_cpu(),
                "direct_decode_begin: layer ", i, "'s buffers are not dense fp32 (S, Hkv, D) on the CPU");
  }
  const int64_t B = slots.dim() == 2 ? slots.size(0) : -1;
  TORCH_CHECK(B > 0 && slots.scalar_type() == at::kLong && slots.is_contiguous() && lens.scalar_type() == at::kLong &&
                  lens.is_contiguous() && lens.dim() == 1 && lens.size(0) == B && loc.scalar_type() == at::kLong &&
                  loc.is_contiguous() && loc.dim() == 1 && loc.size(0) == B,
              "direct_decode_begin: slots (B, L), lens (B,) and loc (B,) must be contiguous int64");
  direct.k.assign(k.begin(), k.end());
  direct.v.assign(v.begin(), v.end());
  direct.slots = slots;
  direct.lens = lens;
  direct.loc = loc;
  direct.active = true;
}

void direct_decode_end() { direct = DirectDecode{}; }

// x (N, H, D) fp32 with each row's (H, D) contiguous, rows any stride apart (the views of a fused
// QKV output): itself, or a contiguous copy. (cpu_decode.rows_contiguous)
at::Tensor rows(const at::Tensor& x) {
  const int64_t H = x.size(1), D = x.size(2);
  if (x.stride(2) == 1 && x.stride(1) == D && x.stride(0) >= H * D) return x;
  return x.contiguous();
}

at::Tensor python_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer, double sm_scale,
                       std::optional<int64_t> sliding_window) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("radixkv::attention_py", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                               double, std::optional<int64_t>)>();
  return op.call(q, k, v, layer, sm_scale, sliding_window);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer, double sm_scale,
                     std::optional<int64_t> sliding_window) {
  const DirectDecode& d = direct;
  const bool fits = d.active && !sliding_window && layer >= 0 && layer < static_cast<int64_t>(d.k.size()) &&
                    q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.size(0) == d.slots.size(0) &&
                    k.sizes() == v.sizes() && k.size(0) == q.size(0) && q.scalar_type() == at::kFloat &&
                    k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat && q.is_cpu();
  if (fits) {
    const at::Tensor& kb = d.k[layer];
    const at::Tensor& vb = d.v[layer];
    const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), S = kb.size(0), Hkv = kb.size(1);
    if (kb.size(2) == D && k.size(1) == Hkv && k.size(2) == D && Hq % Hkv == 0) {
      const at::Tensor qr = rows(q), kr = rows(k), vr = rows(v);
      at::Tensor out = at::empty({B, Hq, D}, q.options());  // (B, Hq, D)
      const int64_t bad = radixkv_paged_decode(
          qr.data_ptr<float>(), kb.data_ptr<float>(), vb.data_ptr<float>(), d.slots.data_ptr<int64_t>(),
          d.lens.data_ptr<int64_t>(), out.data_ptr<float>(), nullptr, B, Hq, Hkv, D, d.slots.size(1), S,
          static_cast<float>(sm_scale), kr.data_ptr<float>(), vr.data_ptr<float>(), d.loc.data_ptr<int64_t>(), B,
          qr.stride(0), kr.stride(0), vr.stride(0));
      if (bad == 0) return out;
      // Slots outside the pool: the Python path runs the same checks and raises the typed error.
    }
  }
  return python_path(q, k, v, layer, sm_scale, sliding_window);
}

}  // namespace

extern "C" int64_t radixkv_attention_ops_abi() { return 1; }

TORCH_LIBRARY_FRAGMENT(radixkv, m) {
  m.def("direct_decode_begin(Tensor[] k, Tensor[] v, Tensor slots, Tensor lens, Tensor loc) -> ()",
        TORCH_FN(direct_decode_begin));
  m.def("direct_decode_end() -> ()", TORCH_FN(direct_decode_end));
}

TORCH_LIBRARY_IMPL(radixkv, CPU, m) { m.impl("attention", TORCH_FN(attention)); }
