// The decoder layers of a decode-shaped step (every query short, read by the fused attention
// kernel) in one C++ call: the same ops as models/llama.py's forward, in the same order, minus
// the Python between them.
//
// Why: at batch 1 the Python around ~14 ops per layer (module calls, argument checks) cost
// ~0.7 ms of a ~5.5 ms int4 step. A "plan" holds each layer's weights (as the linear kinds the
// engine uses: oneDNN-packed bf16 / fp32, int4pack, int8pack, or plain) and KV pools; it is
// registered once per model runner and run once per step with the GIL released.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace {

// kPackedUpcast: a bf16 layer on a CPU without bf16 GEMMs, packed as its weight's fp32 image
// (layers/linear.py): fp32 GEMM, output rounded back to the activations' dtype; a few rows read
// the bf16 weight itself instead.
enum LinearKind : int64_t { kPacked = 0, kInt4 = 1, kInt8 = 2, kDense = 3, kPackedUpcast = 4 };

struct PlanLinear {
  int64_t kind = kDense;
  int64_t group = 0;
  // aux: int4 scales_and_zeros / int8 scales / the bf16 weight of kPackedUpcast / the AMX copy
  // of kPacked (may be empty); bias may be undefined.
  at::Tensor w, aux, bias;
  // kInt4 only, may be undefined: the oneDNN-packed bf16 image of the same integers, which
  // beats torch's int4 kernel past a few rows (quant/int4.py); it arrives in the bias slot.
  at::Tensor twin;
};

struct PlanLayer {
  at::Tensor in_norm, post_norm;
  PlanLinear qkv, o, gate_up, down;
  at::Tensor k_cache, v_cache, k_scale, v_scale;
  at::Tensor q_norm, k_norm;  // Qwen3's per-head norms; undefined for other models
};

struct Plan {
  std::vector<PlanLayer> layers;
  int64_t num_heads = 0, kv_format = 0, block_size = 0;
  int64_t int4_max_rows = 0;  // rows up to which an int4 linear with a twin runs the int4 kernel
  double eps = 0.0, scale = 0.0;
};

std::mutex plans_mu;
// Shared: a step holds its plan while it runs without the GIL, so a free_layer_plan meanwhile
// (the Python object's finalizer at interpreter exit, beside a daemon engine thread mid-step)
// drops the registry's reference and the step's keeps the plan alive until it returns.
std::vector<std::shared_ptr<Plan>> plans;

at::Tensor optional_tensor(const at::Tensor& t) { return t.numel() ? t : at::Tensor(); }

at::Tensor run_packed(const at::Tensor& w, const at::Tensor& bias, const at::Tensor& x) {
  // mkldnn::_linear_pointwise(X, W, B?, attr, scalars, algorithm?), boxed: it has no public C++
  // header.
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(bias.defined() ? c10::IValue(bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<c10::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor run_linear(const PlanLinear& l, const at::Tensor& x, int64_t int4_max_rows) {
  switch (l.kind) {
    case kPacked:  // aux: the weight in AMX tile order, read by amx_linear.cpp for up to 64 rows
      if (l.aux.numel() && x.size(0) <= kAmxMaxRows) return amx_linear_impl(x, l.aux, l.bias);
      return run_packed(l.w, l.bias, x);
    case kPackedUpcast:  // aux: the bf16 weight, read directly for a few rows (bf16_gemv.cpp)
      if (l.aux.numel() && x.size(0) <= kBf16LinearMaxRows)
        return bf16_linear_impl(x, l.aux, l.bias.defined() ? l.bias : at::Tensor());
      return run_packed(l.w, l.bias, x.to(at::kFloat)).to(x.scalar_type());
    case kInt4:
      if (l.twin.defined() && x.size(0) > int4_max_rows) return run_packed(l.twin, {}, x);
      return at::_weight_int4pack_mm_for_cpu(x, l.w, l.group, l.aux);
    case kInt8:
      return at::_weight_int8pack_mm(x, l.w, l.aux);
    default:
      return at::linear(x, l.w, l.bias.defined() ? std::optional<at::Tensor>(l.bias)
                                                 : std::optional<at::Tensor>());
  }
}

// Qwen3: RMSNorm over each query and key head of qkv [n, (H + 2 KVH) * D], as
// Attention.norm_qk does it (heads as the rows of a contiguous copy, the same kernel).
at::Tensor norm_qk(const at::Tensor& qkv, const PlanLayer& l, int64_t num_heads, double eps) {
  if (!l.q_norm.defined()) return qkv;
  const int64_t n = qkv.size(0), d = l.q_norm.size(0), q_size = num_heads * d;
  const int64_t kv_size = (qkv.size(1) - q_size) / 2;
  const auto parts = qkv.split_with_sizes({q_size, kv_size, kv_size}, 1);
  const at::Tensor q = rms_norm(parts[0].reshape({-1, d}), l.q_norm, eps).view({n, q_size});
  const at::Tensor k = rms_norm(parts[1].reshape({-1, d}), l.k_norm, eps).view({n, kv_size});
  return at::cat({q, k, parts[2]}, 1);
}

}  // namespace

// Per layer, 20 tensors: input norm, post-attention norm, then (w, aux, bias) for qkv, o,
// gate_up, down, then k_cache, v_cache, k_scale, v_scale, q_norm, k_norm (empty tensors where
// absent); and 8 ints: (kind, group) for the four linears. An int4 linear's bias slot holds its
// packed bf16 twin, or is empty. Returns the plan's id.
int64_t register_layer_plan(std::vector<at::Tensor> tensors, std::vector<int64_t> ints,
                            int64_t num_heads, int64_t kv_format, int64_t block_size, double eps,
                            double scale, int64_t int4_max_rows) {
  TORCH_CHECK(tensors.size() % 20 == 0 && ints.size() * 20 == tensors.size() * 8,
              "register_layer_plan: 20 tensors and 8 ints per layer");
  auto plan = std::make_shared<Plan>();
  plan->num_heads = num_heads;
  plan->kv_format = kv_format;
  plan->block_size = block_size;
  plan->eps = eps;
  plan->scale = scale;
  plan->int4_max_rows = int4_max_rows;
  for (size_t i = 0; i < tensors.size() / 20; ++i) {
    const at::Tensor* t = tensors.data() + 20 * i;
    const int64_t* k = ints.data() + 8 * i;
    PlanLayer layer;
    layer.in_norm = t[0];
    layer.post_norm = t[1];
    PlanLinear* lins[4] = {&layer.qkv, &layer.o, &layer.gate_up, &layer.down};
    for (int j = 0; j < 4; ++j) {
      lins[j]->w = t[2 + 3 * j];
      lins[j]->aux = t[3 + 3 * j];
      lins[j]->kind = k[2 * j];
      (lins[j]->kind == kInt4 ? lins[j]->twin : lins[j]->bias) = optional_tensor(t[4 + 3 * j]);
      lins[j]->group = k[2 * j + 1];
      TORCH_CHECK(lins[j]->kind >= kPacked && lins[j]->kind <= kPackedUpcast,
                  "unknown linear kind");
      TORCH_CHECK(!lins[j]->bias.defined() || lins[j]->kind != kInt8,
                  "register_layer_plan: int4 / int8 linears with a bias stay in Python");
    }
    layer.k_cache = t[14];
    layer.v_cache = t[15];
    layer.k_scale = t[16];
    layer.v_scale = t[17];
    layer.q_norm = optional_tensor(t[18]);
    layer.k_norm = optional_tensor(t[19]);
    TORCH_CHECK(layer.q_norm.defined() == layer.k_norm.defined(),
                "register_layer_plan: q_norm and k_norm come together");
    plan->layers.push_back(std::move(layer));
  }
  std::lock_guard<std::mutex> lock(plans_mu);
  plans.push_back(std::move(plan));
  return static_cast<int64_t>(plans.size()) - 1;
}

void free_layer_plan(int64_t id) {
  std::lock_guard<std::mutex> lock(plans_mu);
  if (id >= 0 && id < static_cast<int64_t>(plans.size())) plans[id].reset();
}

// x [n, hidden] (the embeddings); cos / sin [n, head_dim]; slots [n] int64; the kernel group's
// block_tables / token_seq / token_pos. Returns (the last MLP's output, the residual stream
// without it): the caller applies the final norm, as LlamaModel.forward does.
// capture: layer indices whose output residual stream (h + residual) is returned as well, in
// order (an EAGLE head's fused features); empty for a plain forward.
std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> run_layer_plan(
    int64_t id, at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor slots,
    at::Tensor block_tables, at::Tensor token_seq, at::Tensor token_pos,
    std::vector<int64_t> capture) {
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(plans_mu);
    TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(plans.size()) && plans[id],
                "run_layer_plan: unknown or freed plan");
    plan = plans[id];
  }
  pybind11::gil_scoped_release no_gil;
  at::Tensor residual = x;
  at::Tensor h;
  bool first = true;
  std::vector<at::Tensor> captured;
  size_t next_capture = 0;
  int64_t layer = 0;
  for (const PlanLayer& l : plan->layers) {
    if (first) {
      h = rms_norm(x, l.in_norm, plan->eps);
      first = false;
    } else {
      add_rms_norm_(h, residual, l.in_norm, plan->eps);
    }
    const at::Tensor qkv =
        norm_qk(run_linear(l.qkv, h, plan->int4_max_rows), l, plan->num_heads, plan->eps);
    const at::Tensor q = rope_write_kv(qkv, cos, sin, slots, l.k_cache, l.v_cache,
                                       plan->num_heads, l.k_scale, l.v_scale, plan->kv_format);
    at::Tensor attn;
    {
      // Named like the Python entry point, so `bench profile` still splits attention out.
      RECORD_FUNCTION("specserve::paged_attention_short", std::vector<c10::IValue>());
      attn = paged_attention_impl(q, l.k_cache, l.v_cache, block_tables, token_seq, token_pos,
                                  plan->block_size, plan->scale, 0, l.k_scale, l.v_scale,
                                  plan->kv_format);
    }
    h = run_linear(l.o, attn, plan->int4_max_rows);
    add_rms_norm_(h, residual, l.post_norm, plan->eps);
    h = run_linear(l.down, silu_and_mul(run_linear(l.gate_up, h, plan->int4_max_rows)),
                   plan->int4_max_rows);
    if (next_capture < capture.size() && capture[next_capture] == layer) {
      captured.push_back(at::add(h, residual));
      ++next_capture;
    }
    ++layer;
  }
  TORCH_CHECK(next_capture == capture.size(),
              "run_layer_plan: capture layers must be ascending plan layers");
  return {h, residual, captured};
}
