// Reverse-mode autograd over a dynamic graph, small enough to read in one sitting.
// A Var is a handle to a Node: its value, its gradient, the inputs it was computed from
// and how to push its gradient back to them. backward() walks the graph in reverse
// topological order. Leaf gradients accumulate (+=) across backward calls until
// zero_grad; intermediate gradients are freed as soon as they have been used.
//
// An op's output value lives as long as something can still read it: a Var that names it, or a
// backward still to run that reads it (an op declares which of its inputs' values, and whether
// its own output, its backward reads: BackwardReads). When neither is left, the value is
// released (Tensor::released: its shape, dtype and device stay) while the forward or the
// backward goes on, as PyTorch frees what no backward saved. Leaves are never released.
//
// Parameters are leaves that also hold an FP32 master. Their `value` is the working copy
// the forward reads: the master itself in FP32, or an FP16/BF16 copy that the optimizer
// refreshes in the same pass that updates the master.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace belay {

struct Node {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  bool is_leaf = true;
  DType grad_dtype = DType::F32;  // leaves: FP32 by default, or the compute dtype
  // A cast from FP32 (autocast's, cast()): its gradient is kept in FP32, as its input's, so
  // the op reading the cast writes that gradient in FP32 (a linear's dX and dW straight out of
  // the GEMM's FP32 sums) and the cast hands it on: no rounding to FP16/BF16 and back.
  bool fp32_grad = false;
  Tensor master;                  // parameters only (undefined once released, below)
  bool master_released = false;   // a sharded optimizer's parameter another rank updates
  std::string name;
  const char* op = "leaf";
  // The module path the op ran under ("layers.1"; "" at the top level), for anomaly reports.
  // Points at the module's own string: no allocation per op.
  const char* module = "";
  std::vector<std::shared_ptr<Node>> inputs;
  std::function<void(Node&)> backward;  // reads this node's grad, accumulates into inputs
  // What keeps `value` (see the top of this file): the Vars naming this node, and the backward
  // functions still to run that read it. reads_inputs (bit i: inputs[i]) and reads_output say
  // what this node's own backward reads.
  int handles = 0;
  int readers = 0;
  uint32_t reads_inputs = 0;
  bool reads_output = false;
};

// Which values an op's backward reads: bit i of `inputs` for its input i, and `output` for its
// own result. The default, everything, keeps every value until the backward that reads it ran.
struct BackwardReads {
  uint32_t inputs = ~0u;
  bool output = true;
};
constexpr BackwardReads kReadsNothing{0u, false};
constexpr BackwardReads reads_inputs(uint32_t mask) { return {mask, false}; }

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false);
  // Copies and moves keep Node::handles: the last Var to let go of an op's result may release
  // its value.
  Var(const Var& other) : node_(other.node_) {
    if (node_) ++node_->handles;
  }
  Var(Var&& other) noexcept : node_(std::move(other.node_)) {}
  Var& operator=(const Var& other) {
    Var copy(other);
    std::swap(node_, copy.node_);
    return *this;
  }
  Var& operator=(Var&& other) noexcept {
    std::swap(node_, other.node_);
    return *this;
  }
  ~Var() { let_go(); }
  static Var parameter(Tensor master, std::string name);  // master must be FP32
  static Var from_node(std::shared_ptr<Node> node) {
    Var v;
    v.node_ = std::move(node);
    if (v.node_) ++v.node_->handles;
    return v;
  }

  bool defined() const { return node_ != nullptr; }
  const Tensor& value() const { return node_->value; }
  const Tensor& grad() const { return node_->grad; }
  Tensor& mutable_grad() { return node_->grad; }
  bool requires_grad() const { return node_ && node_->requires_grad; }
  bool is_parameter() const { return node_ && (node_->master.defined() || node_->master_released); }
  const Tensor& master() const { return node_->master; }  // undefined when released
  // Sharded optimizer state (optim/optimizer.h set_owned): frees the FP32 master of a
  // parameter another rank updates; this rank reads the working copy, which the owner's
  // broadcast refreshes. Only where the working copy is a tensor of its own (FP16/BF16): an
  // FP32 parameter's master is its value. Returns whether it freed it.
  bool release_master();
  bool master_released() const { return node_ && node_->master_released; }
  const std::string& name() const { return node_->name; }
  const Shape& shape() const { return node_->value.shape(); }
  DType dtype() const { return node_->value.dtype(); }
  Device device() const { return node_->value.device(); }
  Node* node() const { return node_.get(); }
  const std::shared_ptr<Node>& node_ptr() const { return node_; }

  // Parameters: the working copy's dtype (FP32 shares the master) and the gradient dtype.
  void set_working_dtype(DType dtype);
  void set_grad_dtype(DType dtype) { node_->grad_dtype = dtype; }
  void zero_grad(bool set_to_none = true);

  // Backpropagates from this one-element FP32 value. `seed` is d(objective)/d(this): a
  // loss scale and 1/accum_steps enter here, so the scaled loss is never materialised.
  void backward(float seed = 1.0f) const;
  // The same with the seed on the value's device, times `multiplier`: a loss scale that lives
  // in device memory seeds backward without a trip to the host.
  // `on_leaf_done`, when given, is called once for every leaf that requires grad as soon as
  // its gradient is final for this backward (every op that reads the leaf has pushed its
  // gradient back), while the ops nearer the input still run: data parallelism starts a
  // gradient bucket's all-reduce there (DDP's gradient hooks).
  void backward(const Tensor& seed, float multiplier, const std::function<void(Node& leaf)>& on_leaf_done = {}) const;

 private:
  void let_go();
  std::shared_ptr<Node> node_;
};

// Releases n's value when nothing can read it any more (see the top of this file).
void release_if_unread(Node& n);

// Whether new ops record the graph (this thread). NoGrad switches it off in a scope.
bool grad_enabled();
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool saved_;
};

// The module path new ops are recorded under (this thread). A module's forward opens one:
//   Var Linear::forward(const Var& x) { ModuleScope scope(path_.c_str()); ... }
// The string must outlive the ops made under it (a module's own member does).
const char* current_module_path();
class ModuleScope {
 public:
  explicit ModuleScope(const char* path);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  const char* saved_;
};

// Internal from here on: how the ops of autograd/ops.h build the graph.
// Adds g into node.grad in the node's gradient dtype. The first gradient is adopted
// without a copy when `fresh` says nobody else holds g (the producer just made it).
void accumulate_grad(Node& node, const Tensor& g, bool fresh);
// The dtype a node's gradient is kept in.
DType grad_dtype_of(const Node& node);

// Creates the result node of an op: records inputs and backward only when grad is enabled
// and some input requires grad. `reads`: which values `backward` reads (keep it exact: a value
// it reads but did not declare would be gone when it runs).
Var make_result(Tensor value, const char* op, std::vector<Var> inputs, std::function<void(Node&)> backward,
                BackwardReads reads = {});

}  // namespace belay
