// Every op of the op table (engine/backend.h) called with one bad argument at a time: an
// undefined tensor, a wrong dtype, a wrong shape, a tensor on the other kind of device, an
// output sharing storage with another operand, a missing slot field or step scalar. Written
// once for any backend: tests/kernels/test_backend_checks.cpp runs it on the CPU backend,
// tests/gpu/test_cuda_backend_checks.cpp on both backends and compares their errors.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace belay::test::backend_checks {

// One operand of an op's good call.
struct Arg {
  Shape shape;
  DType dtype = DType::F32;
  const char* dtype_error = nullptr;                    // the op refuses FP16 here, saying this; null: any dtype goes
  bool any_shape = false;                               // the op takes any shape here (no shape case)
  Shape bad_shape{};                                    // the shape case's shape; empty: numel + 1 elements
  const char* undefined_error = "tensor is undefined";  // what an undefined tensor here is told
};

// An op, its operands and a good call on them; `call` runs the op on be with t (any of which a
// case may have replaced).
struct Op {
  const char* name;  // the prefix of every error the op's checks throw
  std::vector<Arg> args;
  std::function<void(const Backend&, std::vector<Tensor>&)> call;
};

inline Arg f32(Shape s) { return {s, DType::F32, "fp32"}; }   // an operand that must be FP32
inline Arg any(Shape s) { return {s, DType::F32, nullptr}; }  // any dtype
inline Arg scalar() { return f32(Shape{1}); }                 // an FP32 [1]
// layer_norm_backward's dweight and dbias: one message for every way they can be wrong.
inline Arg grad_param() { return {{4}, DType::F32, "must be fp32", false, {}, "must be fp32"}; }

inline std::vector<Tensor> make_args(const std::vector<Arg>& args, Device dev) {
  std::vector<Tensor> t;
  for (const Arg& a : args) t.push_back(Tensor::zeros(a.shape, a.dtype, dev));
  return t;
}

inline StepScalars step_scalars(std::vector<Tensor>& t, size_t first) {
  return {&t[first], &t[first + 1], &t[first + 2], &t[first + 3], &t[first + 4]};
}

// The table: every op of Backend that takes tensors.
inline const std::vector<Op>& ops() {
  static const std::vector<Op> table = {
      {"cast", {any({2, 3}), {{2, 3}, DType::F16}}, [](const Backend& be, auto& t) { be.cast(t[0], t[1]); }},
      {"fill", {{{5}, DType::F32, nullptr, true}}, [](const Backend& be, auto& t) { be.fill(t[0], 1.0f); }},
      {"binary",
       {any({4}), any({4}), any({4})},
       [](const Backend& be, auto& t) { be.binary(BinaryOp::Add, t[0], t[1], t[2]); }},
      {"scale", {any({4}), any({4})}, [](const Backend& be, auto& t) { be.scale(t[0], 2.0f, t[1]); }},
      {"accumulate",
       {any({4}), any({4}), scalar()},
       [](const Backend& be, auto& t) { be.accumulate(t[0], t[1], 0.5f, &t[2]); }},
      {"broadcast_scalar",
       {scalar(), {{4}, DType::F32, nullptr, true}},
       [](const Backend& be, auto& t) { be.broadcast_scalar(t[0], 2.0f, t[1]); }},
      {"activation",
       {any({4}), any({4})},
       [](const Backend& be, auto& t) { be.activation(Activation::Gelu, t[0], t[1]); }},
      {"activation_backward",
       {any({4}), any({4}), any({4})},
       [](const Backend& be, auto& t) { be.activation_backward(Activation::Relu, t[0], t[1], t[2]); }},
      {"unary", {any({4}), any({4})}, [](const Backend& be, auto& t) { be.unary(UnaryOp::Exp, 0.0f, t[0], t[1]); }},
      {"unary_backward",
       {any({4}), any({4}), any({4}), any({4})},
       [](const Backend& be, auto& t) { be.unary_backward(UnaryOp::Exp, 0.0f, t[0], t[1], t[2], t[3]); }},
      {"binary_broadcast",
       {any({2, 3}), any({3}), any({2, 3})},
       [](const Backend& be, auto& t) {
         be.binary_broadcast(BinaryOp::Mul, t[0], t[1], {1, 2, 3}, false, t[2]);
       }},
      {"broadcast_axis",
       {any({3}), any({2, 3})},
       [](const Backend& be, auto& t) {
         be.broadcast_axis(t[0], {1, 2, 3}, 1.0f, t[1]);
       }},
      {"sum_axis",
       {any({2, 3}), any({3})},
       [](const Backend& be, auto& t) {
         be.sum_axis(t[0], {1, 2, 3}, 1.0f, t[1], false);
       }},
      {"softmax",
       {any({2, 4}), any({2, 4})},
       [](const Backend& be, auto& t) { be.softmax(t[0], 4, false, false, t[1]); }},
      {"softmax_backward",
       {any({2, 4}), any({2, 4}), any({2, 4})},
       [](const Backend& be, auto& t) { be.softmax_backward(t[0], t[1], 4, true, false, t[2]); }},
      {"embedding",
       {any({3, 4}), f32({3}), {{3, 4}, DType::F32, "table's dtype"}},
       [](const Backend& be, auto& t) { be.embedding(t[0], t[1], t[2]); }},
      {"embedding_backward",
       {any({3, 4}), f32({3}), f32({3, 4})},
       [](const Backend& be, auto& t) { be.embedding_backward(t[0], t[1], t[2]); }},
      {"layer_norm",
       {any({2, 4}), any({4}), any({4}), any({2, 4}), f32({2}), f32({2})},
       [](const Backend& be, auto& t) { be.layer_norm(t[0], &t[1], &t[2], 1e-5f, t[3], t[4], t[5]); }},
      {"layer_norm_backward",
       {any({2, 4}), any({4}), f32({2}), f32({2}), any({2, 4}), any({2, 4}), grad_param(), grad_param()},
       [](const Backend& be, auto& t) {
         be.layer_norm_backward(t[0], &t[1], t[2], t[3], t[4], t[5], &t[6], &t[7], false);
       }},
      {"transpose",
       {{{2, 3}, DType::F32, "one dtype"}, {{3, 2}, DType::F32, "one dtype"}},
       [](const Backend& be, auto& t) { be.transpose(t[0], t[1]); }},
      {"swap_axes",
       {{{2, 3}, DType::F32, "one dtype"}, {{3, 2}, DType::F32, "one dtype"}},
       [](const Backend& be, auto& t) {
         be.swap_axes(t[0], {1, 2, 1, 3, 1}, t[1]);
       }},
      {"gemm",
       {{{2, 3}, DType::F32, "dtypes differ"}, {{3, 2}, DType::F32, "dtypes differ"}, any({2, 2}), any({2})},
       [](const Backend& be, auto& t) {
         GemmArgs g;
         g.a = &t[0];
         g.b = &t[1];
         g.c = &t[2];
         g.bias = &t[3];
         be.gemm(g);
       }},
      {"sum_rows", {any({2, 3}), f32({3})}, [](const Backend& be, auto& t) { be.sum_rows(t[0], t[1], false); }},
      {"sum", {{{5}, DType::F32, nullptr, true}, scalar()}, [](const Backend& be, auto& t) { be.sum(t[0], t[1]); }},
      {"mse_loss",
       {any({4}), any({4}), scalar()},
       [](const Backend& be, auto& t) { be.mse_forward(t[0], t[1], t[2]); }},
      {"mse_loss backward",
       {any({4}), any({4}), scalar(), any({4})},
       [](const Backend& be, auto& t) { be.mse_backward(t[0], t[1], t[2], t[3]); }},
      {"cross_entropy",
       {any({2, 3}), any({2}), scalar(), f32({2, 3})},
       [](const Backend& be, auto& t) { be.cross_entropy(t[0], t[1], t[2], t[3]); }},
      {"guard",
       {{{4}, DType::F32, nullptr, true}, scalar(), scalar(), scalar()},
       [](const Backend& be, auto& t) { be.guard({&t[0]}, t[1], t[2], t[3]); }},
      {"clip_coefficient",
       {scalar(), scalar()},
       [](const Backend& be, auto& t) { be.clip_coefficient(t[0], 1.0f, t[1]); }},
      {"unscale",
       {{{4}, DType::F32, nullptr, true}, scalar(), scalar()},
       [](const Backend& be, auto& t) { be.unscale_inplace({&t[0]}, t[1], t[2]); }},
      {"scale_inplace",
       {{{4}, DType::F32, nullptr, true}, scalar()},
       [](const Backend& be, auto& t) { be.scale_inplace({&t[0]}, t[1]); }},
      {"clamp", {{{4}, DType::F32, nullptr, true}}, [](const Backend& be, auto& t) { be.clamp_inplace(t[0], -1, 1); }},
      {"adamw",
       {f32({4}), f32({4}), f32({4}), any({4}), {{4}, DType::F16}, scalar(), scalar(), scalar(), scalar(), scalar()},
       [](const Backend& be, auto& t) {
         be.adamw(AdamWHyper{}, {{&t[0], &t[1], &t[2], &t[3], &t[4], 0.01f}}, step_scalars(t, 5));
       }},
      {"sgd",
       {f32({4}),
        {{4}, DType::F32, "fp32", false, {}, "no momentum buffer"},
        any({4}),
        {{4}, DType::F16},
        scalar(),
        scalar(),
        scalar(),
        scalar(),
        scalar()},
       [](const Backend& be, auto& t) {
         be.sgd(0.9f, {{&t[0], &t[1], &t[2], &t[3], 0.0f}}, step_scalars(t, 4));
       }},
      {"lookup",
       {{{3}, DType::F32, "fp32", false, Shape{2, 2}}, scalar(), scalar()},
       [](const Backend& be, auto& t) { be.lookup(t[0], t[1], t[2]); }},
      {"count_applied", {scalar(), scalar()}, [](const Backend& be, auto& t) { be.count_applied(t[0], t[1]); }},
      {"read_async",
       {scalar(), scalar()},
       [](const Backend& be, auto& t) {
         (void)be.read_async({&t[0], &t[1]});
       }},
      {"scaler_update",
       {scalar(), scalar(), scalar(), scalar()},
       [](const Backend& be, auto& t) { be.scaler_update(ScalerConfig{}, t[0], t[1], t[2], t[3]); }},
  };
  return table;
}

// One bad call: which op, what is wrong, a fragment its message must hold (or one of several,
// "a|b"; empty: any message of the op), and the call itself
// on a backend whose tensors live on `dev` (`other`: a device of the other kind, for the
// device cases; those need a GPU, `needs_two_kinds`).
struct BadCall {
  std::string op, what, expect;
  bool needs_two_kinds = false;
  std::function<void(const Backend& be, Device dev, Device other)> call;
};

// The cases made from the table: per operand undefined, FP16 where FP32 is required, a wrong
// shape, and on the other kind of device.
inline void add_operand_cases(const Op& op, std::vector<BadCall>& out) {
  for (size_t i = 0; i < op.args.size(); ++i) {
    const Arg& a = op.args[i];
    const std::string at = " operand " + std::to_string(i);
    const auto replaced = [&op, i](std::function<Tensor(const Arg&, Device, Device)> bad) {
      return [&op, i, bad](const Backend& be, Device dev, Device other) {
        std::vector<Tensor> t = make_args(op.args, dev);
        t[i] = bad(op.args[i], dev, other);
        op.call(be, t);
      };
    };
    out.push_back({op.name, "undefined" + at, a.undefined_error, false,
                   replaced([](const Arg&, Device, Device) { return Tensor(); })});
    if (a.dtype_error)
      out.push_back({op.name, "fp16" + at, a.dtype_error, false, replaced([](const Arg& a, Device dev, Device) {
                       return Tensor::zeros(a.shape, DType::F16, dev);
                     })});
    if (!a.any_shape)
      out.push_back({op.name, "shape" + at, "", false, replaced([](const Arg& a, Device dev, Device) {
                       const Shape s = a.bad_shape.rank() > 0 ? a.bad_shape : Shape{a.shape.numel() + 1};
                       return Tensor::zeros(s, a.dtype, dev);
                     })});
    out.push_back(
        {op.name, "other device" + at, "backend given|device", true,
         replaced([](const Arg& a, Device, Device other) { return Tensor::zeros(a.shape, a.dtype, other); })});
  }
}

// `out` replaced by a tensor sharing `in`'s storage, on ops that refuse it; the shapes are
// chosen so that only the aliasing is wrong.
struct Alias {
  const char* op;
  std::vector<Arg> args;
  size_t out, in;
  std::function<void(const Backend&, std::vector<Tensor>&)> call;
};

inline const std::vector<Alias>& aliases() {
  static const std::vector<Alias> table = {
      {"accumulate",
       {any({1}), any({1}), scalar()},
       2,
       0,
       [](const Backend& be, auto& t) { be.accumulate(t[0], t[1], 1.0f, &t[2]); }},
      {"binary_broadcast",
       {any({3}), any({3}), any({3})},
       2,
       1,
       [](const Backend& be, auto& t) {
         be.binary_broadcast(BinaryOp::Add, t[0], t[1], {1, 1, 3}, false, t[2]);
       }},
      {"broadcast_axis",
       {any({3}), any({3})},
       1,
       0,
       [](const Backend& be, auto& t) {
         be.broadcast_axis(t[0], {1, 1, 3}, 1.0f, t[1]);
       }},
      {"sum_axis",
       {any({3}), any({3})},
       1,
       0,
       [](const Backend& be, auto& t) {
         be.sum_axis(t[0], {1, 1, 3}, 1.0f, t[1], false);
       }},
      {"softmax",
       {any({2, 4}), any({2, 4})},
       1,
       0,
       [](const Backend& be, auto& t) { be.softmax(t[0], 4, false, true, t[1]); }},
      {"softmax_backward",
       {any({2, 4}), any({2, 4}), any({2, 4})},
       2,
       1,
       [](const Backend& be, auto& t) { be.softmax_backward(t[0], t[1], 4, false, false, t[2]); }},
      {"embedding",
       {any({3, 4}), f32({3}), any({3, 4})},
       2,
       0,
       [](const Backend& be, auto& t) { be.embedding(t[0], t[1], t[2]); }},
      {"embedding_backward",
       {any({3, 4}), f32({3}), f32({3, 4})},
       2,
       0,
       [](const Backend& be, auto& t) { be.embedding_backward(t[0], t[1], t[2]); }},
      {"layer_norm",
       {any({2, 4}), any({2, 4}), f32({2}), f32({2})},
       1,
       0,
       [](const Backend& be, auto& t) { be.layer_norm(t[0], nullptr, nullptr, 1e-5f, t[1], t[2], t[3]); }},
      {"layer_norm",
       {any({2, 4}), any({2, 4}), f32({2}), f32({2})},
       3,
       2,
       [](const Backend& be, auto& t) { be.layer_norm(t[0], nullptr, nullptr, 1e-5f, t[1], t[2], t[3]); }},
      {"layer_norm_backward",
       {any({2, 4}), f32({2}), f32({2}), any({2, 4}), any({2, 4}), f32({4}), f32({4})},
       4,
       3,
       [](const Backend& be, auto& t) {
         be.layer_norm_backward(t[0], nullptr, t[1], t[2], t[3], t[4], &t[5], &t[6], false);
       }},
      {"layer_norm_backward",
       {any({2, 4}), f32({2}), f32({2}), any({2, 4}), any({2, 4}), f32({4}), f32({4})},
       6,
       5,
       [](const Backend& be, auto& t) {
         be.layer_norm_backward(t[0], nullptr, t[1], t[2], t[3], t[4], &t[5], &t[6], true);
       }},
      {"transpose", {any({2, 2}), any({2, 2})}, 1, 0, [](const Backend& be, auto& t) { be.transpose(t[0], t[1]); }},
      {"swap_axes",
       {any({2, 2}), any({2, 2})},
       1,
       0,
       [](const Backend& be, auto& t) {
         be.swap_axes(t[0], {1, 2, 1, 2, 1}, t[1]);
       }},
      {"gemm",
       {any({2, 2}), any({2, 2}), any({2, 2})},
       2,
       0,
       [](const Backend& be, auto& t) {
         GemmArgs g;
         g.a = &t[0];
         g.b = &t[1];
         g.c = &t[2];
         be.gemm(g);
       }},
      {"sum_rows", {any({1, 3}), f32({3})}, 1, 0, [](const Backend& be, auto& t) { be.sum_rows(t[0], t[1], false); }},
      {"sum", {any({1}), scalar()}, 1, 0, [](const Backend& be, auto& t) { be.sum(t[0], t[1]); }},
      {"mse_loss",
       {any({1}), any({1}), scalar()},
       2,
       0,
       [](const Backend& be, auto& t) { be.mse_forward(t[0], t[1], t[2]); }},
      {"mse_loss backward",
       {any({1}), any({1}), scalar(), any({1})},
       3,
       2,
       [](const Backend& be, auto& t) { be.mse_backward(t[0], t[1], t[2], t[3]); }},
      {"cross_entropy",
       {any({2, 3}), any({2}), scalar(), f32({2, 3})},
       3,
       0,
       [](const Backend& be, auto& t) { be.cross_entropy(t[0], t[1], t[2], t[3]); }},
      {"guard",
       {any({1}), scalar(), scalar(), scalar()},
       2,
       3,
       [](const Backend& be, auto& t) { be.guard({&t[0]}, t[1], t[2], t[3]); }},
      {"guard",
       {any({1}), scalar(), scalar(), scalar()},
       3,
       0,
       [](const Backend& be, auto& t) { be.guard({&t[0]}, t[1], t[2], t[3]); }},
      {"unscale",
       {any({1}), scalar(), scalar()},
       2,
       1,
       [](const Backend& be, auto& t) { be.unscale_inplace({&t[0]}, t[1], t[2]); }},
      {"unscale",
       {any({1}), scalar(), scalar()},
       1,
       0,
       [](const Backend& be, auto& t) { be.unscale_inplace({&t[0]}, t[1], t[2]); }},
      {"scale_inplace",
       {any({1}), scalar()},
       1,
       0,
       [](const Backend& be, auto& t) { be.scale_inplace({&t[0]}, t[1]); }},
      {"adamw",
       {f32({4}), f32({4}), f32({4}), any({4}), scalar(), scalar(), scalar(), scalar(), scalar()},
       1,
       0,
       [](const Backend& be, auto& t) {
         be.adamw(AdamWHyper{}, {{&t[0], &t[1], &t[2], &t[3], nullptr, 0.0f}}, step_scalars(t, 4));
       }},
      {"adamw",
       {f32({4}), f32({4}), f32({4}), f32({4}), scalar(), scalar(), scalar(), scalar(), scalar()},
       3,
       0,
       [](const Backend& be, auto& t) {
         be.adamw(AdamWHyper{}, {{&t[0], &t[1], &t[2], &t[3], nullptr, 0.0f}}, step_scalars(t, 4));
       }},
      {"sgd",
       {f32({4}),
        {{4}, DType::F32, "fp32", false, {}, "no momentum buffer"},
        any({4}),
        scalar(),
        scalar(),
        scalar(),
        scalar(),
        scalar()},
       1,
       0,
       [](const Backend& be, auto& t) {
         be.sgd(0.9f, {{&t[0], &t[1], &t[2], nullptr, 0.0f}}, step_scalars(t, 3));
       }},
      {"count_applied", {scalar(), scalar()}, 1, 0, [](const Backend& be, auto& t) { be.count_applied(t[0], t[1]); }},
      {"scaler_update",
       {scalar(), scalar(), scalar(), scalar()},
       1,
       0,
       [](const Backend& be, auto& t) { be.scaler_update(ScalerConfig{}, t[0], t[1], t[2], t[3]); }},
  };
  return table;
}

// Missing pieces: a slot field, a step scalar, a gradient, a GEMM operand; too many scalars.
inline std::vector<BadCall> missing_cases() {
  using Args = std::vector<Tensor>;
  const auto on = [](Device dev, std::initializer_list<Arg> args) { return make_args(args, dev); };
  return {
      {"adamw", "slot without m", "lacks its master, m, v or grad", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {f32({4}), f32({4}), any({4}), scalar(), scalar(), scalar(), scalar(), scalar()});
         be.adamw(AdamWHyper{}, {{&t[0], nullptr, &t[1], &t[2], nullptr, 0.0f}}, step_scalars(t, 3));
       }},
      {"adamw", "no lr", "step scalar is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {f32({4}), f32({4}), f32({4}), any({4}), scalar(), scalar(), scalar(), scalar(), scalar()});
         StepScalars s = step_scalars(t, 4);
         s.lr = nullptr;
         be.adamw(AdamWHyper{}, {{&t[0], &t[1], &t[2], &t[3], nullptr, 0.0f}}, s);
       }},
      {"sgd", "slot without master", "lacks its master or grad", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {any({4}), scalar(), scalar(), scalar(), scalar(), scalar()});
         be.sgd(0.0f, {{nullptr, nullptr, &t[0], nullptr, 0.0f}}, step_scalars(t, 1));
       }},
      {"sgd", "momentum without a buffer", "no momentum buffer", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {f32({4}), any({4}), scalar(), scalar(), scalar(), scalar(), scalar()});
         be.sgd(0.9f, {{&t[0], nullptr, &t[1], nullptr, 0.0f}}, step_scalars(t, 2));
       }},
      {"sgd", "no applied_steps", "step scalar is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {f32({4}), any({4}), scalar(), scalar(), scalar(), scalar(), scalar()});
         StepScalars s = step_scalars(t, 2);
         s.applied_steps = nullptr;
         be.sgd(0.0f, {{&t[0], nullptr, &t[1], nullptr, 0.0f}}, s);
       }},
      {"guard", "a null gradient", "gradient is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {scalar(), scalar(), scalar()});
         be.guard({nullptr}, t[0], t[1], t[2]);
       }},
      {"unscale", "a null gradient", "gradient is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {scalar(), scalar()});
         be.unscale_inplace({nullptr}, t[0], t[1]);
       }},
      {"scale_inplace", "a null gradient", "gradient is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {scalar()});
         be.scale_inplace({nullptr}, t[0]);
       }},
      {"gemm", "no B", "missing operand", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {any({2, 2}), any({2, 2})});
         GemmArgs g;
         g.a = &t[0];
         g.c = &t[1];
         be.gemm(g);
       }},
      {"read_async", "17 scalars", "at most 16", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {scalar()});
         (void)be.read_async(std::vector<const Tensor*>(17, &t[0]));
       }},
      {"read_async", "a null scalar", "scalar is missing", false,
       [on](const Backend& be, Device d, Device) {
         Args t = on(d, {scalar()});
         (void)be.read_async({&t[0], nullptr});
       }},
  };
}

inline std::vector<BadCall> bad_calls() {
  std::vector<BadCall> out;
  for (const Op& op : ops()) add_operand_cases(op, out);
  for (const Alias& a : aliases())
    out.push_back({a.op, "operand " + std::to_string(a.out) + " sharing operand " + std::to_string(a.in) + "'s storage",
                   "shares storage", false, [&a](const Backend& be, Device dev, Device) {
                     std::vector<Tensor> t = make_args(a.args, dev);
                     t[a.out] = t[a.in].reshape(a.args[a.out].shape);
                     a.call(be, t);
                   }});
  for (BadCall& c : missing_cases()) out.push_back(std::move(c));
  return out;
}

// What a bad call threw: the message, empty when nothing was; `is_error` whether it was a belay::Error.
struct Thrown {
  std::string message;
  bool is_error = false;
  bool is_usage_error = false;
};
inline Thrown thrown_by(const BadCall& c, const Backend& be, Device dev, Device other) {
  try {
    c.call(be, dev, other);
  } catch (const UsageError& e) {
    return {e.what(), true, true};
  } catch (const Error& e) {
    return {e.what(), true, false};
  } catch (const std::exception& e) {
    return {std::string("not a belay::Error: ") + e.what(), false, false};
  }
  return {};
}

inline bool holds(const std::string& message, const std::string& expect) {
  for (size_t b = 0;;) {
    const size_t e = expect.find('|', b);
    if (message.find(expect.substr(b, e == std::string::npos ? e : e - b)) != std::string::npos) return true;
    if (e == std::string::npos) return false;
    b = e + 1;
  }
}

// A message with the device names masked: the CPU and the CUDA backend describe their own
// tensors ("fp32[4] on cpu", "on cuda:0") and themselves ("CPU backend given ..."); the rest
// of a message must be the same on both.
inline std::string without_devices(std::string m) {
  const std::pair<const char*, const char*> masks[] = {{"CUDA backend", "<backend>"},
                                                       {"CPU backend", "<backend>"},
                                                       {" on cuda:0", " on <device>"},
                                                       {" on cpu", " on <device>"}};
  for (const auto& [from, to] : masks)
    for (size_t p = m.find(from); p != std::string::npos; p = m.find(from, p + std::string(to).size()))
      m.replace(p, std::string(from).size(), to);
  return m;
}

}  // namespace belay::test::backend_checks
