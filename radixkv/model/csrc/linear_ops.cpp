// radixkv::packed_linear and radixkv::packed_linear_add, the compiled forward's linear layers, as
// C++ operators (radixkv/model/linear_ops.py defines their schemas and fake kernels).
//
// Why C++: a decode step calls them 121 times, and through a Python implementation each call
// cost 8 us of dispatch and argument checks around a product of 50-300 us; here the call costs
// about 1.5 us. The product itself is the same: `radixkv_packed_gemm` (packed_gemm.cpp, included
// below) for decode-sized rows over oneDNN's packed weight, oneDNN's own kernel for the rest.
//
// A layer's weight is registered once (`radixkv::packed_register`) under the id its module's
// `key` tensor holds; the registry keeps the packed tensor alive until `packed_unregister`.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "packed_gemm.cpp"

namespace {

constexpr int64_t kMaxRows = 24;  // packed_gemm.MAX_ROWS: where the kernel beats oneDNN

struct Weight {
  at::Tensor packed;                // oneDNN's blocked copy of the (N, K) weight
  std::optional<at::Tensor> bias;   // (N,) fp32 contiguous
  int64_t N, K, NB;                 // NB: panel width when the kernel reads `packed`, else 0
  const float* panels;              // packed's memory (when NB > 0)
};

std::mutex registry_lock;
std::unordered_map<int64_t, std::shared_ptr<const Weight>> registry;

int64_t key_id(const at::Tensor& key) {
  TORCH_CHECK(key.scalar_type() == at::kLong && key.numel() == 1 && key.device().is_cpu(),
              "radixkv::packed_linear: the key must be one int64 on the CPU, got ", key.scalar_type());
  return *key.data_ptr<int64_t>();
}

std::shared_ptr<const Weight> find(const at::Tensor& key) {
  const int64_t id = key_id(key);
  std::lock_guard<std::mutex> guard(registry_lock);
  auto it = registry.find(id);
  TORCH_CHECK(it != registry.end(), "radixkv::packed_linear: no live PackedLinear owns key ", id);
  return it->second;
}

void packed_register(const at::Tensor& key, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                     int64_t N, int64_t K, int64_t NB, int64_t panels_address) {
  TORCH_CHECK(NB == 0 || (NB % 16 == 0 && N % NB == 0 && panels_address != 0), "packed_register: bad panels");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N),
              "packed_register: the bias must be (N,) fp32 contiguous");
  auto w = std::make_shared<const Weight>(
      Weight{packed, bias, N, K, NB, reinterpret_cast<const float*>(panels_address)});
  std::lock_guard<std::mutex> guard(registry_lock);
  registry[key_id(key)] = std::move(w);
}

void packed_unregister(int64_t id) {
  std::lock_guard<std::mutex> guard(registry_lock);
  registry.erase(id);
}

int64_t packed_registered() {
  std::lock_guard<std::mutex> guard(registry_lock);
  return static_cast<int64_t>(registry.size());
}

// oneDNN over the packed weight, through the dispatcher (prefill-sized rows; any layout).
at::Tensor onednn(const at::Tensor& x, const at::Tensor* residual, const Weight& w) {
  std::vector<c10::IValue> stack;
  if (residual != nullptr) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "binary");
    stack = {x, *residual, w.packed, w.bias, std::string("add")};
    op.callBoxed(&stack);
  } else {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    stack = {x, w.packed, w.bias, std::string("none"), c10::List<std::optional<at::Scalar>>(), std::string("")};
    op.callBoxed(&stack);
  }
  return stack[0].toTensor();
}

at::Tensor product(const at::Tensor& x, const at::Tensor* residual, const Weight& w) {
  const bool rows = w.NB > 0 && x.dim() == 2 && x.size(0) > 0 && x.size(0) <= kMaxRows && x.size(1) == w.K &&
                    x.scalar_type() == at::kFloat && x.device().is_cpu() && x.stride(1) == 1;
  at::Tensor res;
  if (rows && residual != nullptr) {
    res = residual->contiguous();
    if (res.scalar_type() != at::kFloat || res.dim() != 2 || res.size(0) != x.size(0) || res.size(1) != w.N)
      return onednn(x, residual, w);
  }
  if (!rows) return onednn(x, residual, w);
  const int64_t M = x.size(0);
  at::Tensor out = at::empty({M, w.N}, x.options());  // (M, N)
  radixkv_packed_gemm(x.data_ptr<float>(), x.stride(0), w.panels, w.bias ? w.bias->data_ptr<float>() : nullptr,
                      residual != nullptr ? res.data_ptr<float>() : nullptr, out.data_ptr<float>(), M, w.N, w.K,
                      w.NB);
  return out;
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& key, int64_t out_features) {
  auto w = find(key);
  TORCH_CHECK(w->N == out_features, "radixkv::packed_linear: key ", key_id(key), " has ", w->N, " outputs, not ",
              out_features);
  return product(x, nullptr, *w);  // (T, in) -> (T, out)
}

at::Tensor packed_linear_add(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& key) {
  auto w = find(key);
  return product(x, &residual, *w);  // (T, in) -> (T, out) + residual
}

}  // namespace

extern "C" int64_t radixkv_linear_ops_abi() { return 1; }

TORCH_LIBRARY_FRAGMENT(radixkv, m) {
  m.def("packed_register(Tensor key, Tensor packed, Tensor? bias, int N, int K, int NB, int panels_address) -> ()",
        TORCH_FN(packed_register));
  m.def("packed_unregister(int id) -> ()", TORCH_FN(packed_unregister));
  m.def("packed_registered() -> int", TORCH_FN(packed_registered));
}

TORCH_LIBRARY_IMPL(radixkv, CPU, m) {
  m.impl("packed_linear", TORCH_FN(packed_linear));
  m.impl("packed_linear_add", TORCH_FN(packed_linear_add));
}
