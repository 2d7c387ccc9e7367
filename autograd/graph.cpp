#include "autograd/graph.h"

#include <unordered_map>
#include <unordered_set>

#include "autograd/anomaly.h"
#include "autograd/cast_census.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {
thread_local bool g_grad_enabled = true;
thread_local const char* g_module_path = "";
}

const char* current_module_path() { return g_module_path; }
ModuleScope::ModuleScope(const char* path) : saved_(g_module_path) { g_module_path = path; }
ModuleScope::~ModuleScope() { g_module_path = saved_; }

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : saved_(g_grad_enabled) { g_grad_enabled = false; }
NoGrad::~NoGrad() { g_grad_enabled = saved_; }

Var::Var(Tensor value, bool requires_grad) {
  check_defined("Var", value);
  node_ = std::make_shared<Node>();
  node_->handles = 1;
  node_->value = std::move(value);
  node_->requires_grad = requires_grad;
  node_->grad_dtype = node_->value.dtype();
}

Var Var::parameter(Tensor master, std::string name) {
  check_dtype("parameter master", master, DType::F32);
  Var v(master, true);
  v.node_->master = master;
  v.node_->name = std::move(name);
  v.node_->grad_dtype = DType::F32;
  return v;
}

bool Var::release_master() {
  if (!is_parameter()) throw Error("release_master: '" + name() + "' is not a parameter");
  if (node_->master_released) return true;
  if (node_->value.data() == node_->master.data()) return false;  // FP32: the master is the value
  node_->master = Tensor();
  node_->master_released = true;
  return true;
}

void Var::set_working_dtype(DType dtype) {
  if (!is_parameter()) throw Error("set_working_dtype: '" + name() + "' is not a parameter");
  if (node_->master_released)
    throw Error("set_working_dtype: the master of '" + name() + "' was released (sharded optimizer state)");
  node_->value = dtype == DType::F32 ? node_->master : node_->master.to(dtype);
}

void Var::zero_grad(bool set_to_none) {
  if (!node_ || !node_->grad.defined()) return;
  if (set_to_none)
    node_->grad = Tensor();
  else
    node_->grad.fill(0.0f);
}

void Var::let_go() {
  if (!node_) return;
  if (--node_->handles == 0) release_if_unread(*node_);
  node_.reset();
}

// Anomaly mode reports the values of an op's inputs when its backward goes wrong: it keeps them.
void release_if_unread(Node& n) {
  if (n.is_leaf || n.handles > 0 || n.readers > 0 || n.value.data() == nullptr || anomaly_mode_enabled()) return;
  n.value = n.value.released();
}

// After n's backward ran (or had no gradient to run with): the values it read have one reader less.
void drop_backward_reads(Node& n) {
  for (size_t i = 0; i < n.inputs.size() && i < 32; ++i)
    if (n.reads_inputs >> i & 1u) {
      --n.inputs[i]->readers;
      release_if_unread(*n.inputs[i]);
    }
  if (n.reads_output) {
    --n.readers;
    release_if_unread(n);
  }
}

DType grad_dtype_of(const Node& node) {
  return node.is_leaf ? node.grad_dtype : node.fp32_grad ? DType::F32 : node.value.dtype();
}

void accumulate_grad(Node& node, const Tensor& g, bool fresh) {
  if (!node.requires_grad) return;
  check_same_shape("accumulate_grad", node.value, g);
  const DType dtype = grad_dtype_of(node);
  // A leaf's FP16/BF16 gradient buffer (--grad-dtype compute) takes FP32 values: under a cast
  // census, each rounding into it is counted (autograd/cast_census.h), with the bits it had.
  CastCensus* census = node.is_leaf ? active_cast_census() : nullptr;
  if (!node.grad.defined()) {
    node.grad = g.dtype() == dtype ? (fresh ? g : g.clone())
                : census      ? cast_counted(census, CastSite::GradBuffer, g, dtype, node.name)
                              : g.to(dtype);
    return;
  }
  const Backend& be = backend_for(node.grad.device());
  if (census && counted_cast(g.dtype(), node.grad.dtype())) {
    // accumulate's FP32 sum (old + g), rounded once into the buffer, as accumulate rounds it.
    Tensor sum = node.grad.to(DType::F32);
    be.accumulate(sum, g, 1.0f, nullptr);
    census->cast(CastSite::GradBuffer, node.name, sum, node.grad);
    return;
  }
  be.accumulate(node.grad, g, 1.0f, nullptr);
}

Var make_result(Tensor value, const char* op, std::vector<Var> inputs, std::function<void(Node&)> backward,
                BackwardReads reads) {
  auto node = std::make_shared<Node>();
  node->value = std::move(value);
  node->op = op;
  node->module = g_module_path;
  node->is_leaf = false;
  if (anomaly_mode_enabled()) anomaly_check_output(*node, inputs);
  bool needs = false;
  if (grad_enabled())
    for (const Var& in : inputs) needs = needs || in.requires_grad();
  if (needs) {
    node->requires_grad = true;
    for (const Var& in : inputs) node->inputs.push_back(in.node_ptr());
    node->backward = std::move(backward);
    if (inputs.size() > 32) throw Error(std::string(op) + ": more than 32 inputs (BackwardReads names 32)");
    node->reads_inputs = reads.inputs & (inputs.size() == 32 ? ~0u : (1u << inputs.size()) - 1u);
    node->reads_output = reads.output;
    for (size_t i = 0; i < inputs.size() && i < 32; ++i)
      if (node->reads_inputs >> i & 1u) ++node->inputs[i]->readers;
    if (node->reads_output) ++node->readers;
  }
  return Var::from_node(std::move(node));
}

void Var::backward(float seed) const {
  if (!node_) throw Error("backward: undefined variable");
  backward(Tensor::full(Shape{1}, seed, DType::F32, node_->value.device()), 1.0f);
}

namespace {

// Every node that requires grad, reached from root, each after all of its inputs (a
// topological order; backward walks it from the end), by an iterative depth-first search (no
// recursion limit). The vector owns its nodes: freeing a node's edges during backward must not
// free nodes still to visit.
std::vector<std::shared_ptr<Node>> inputs_first_order(const std::shared_ptr<Node>& root) {
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack{{root, 0}};
  seen.insert(root.get());
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->inputs.size()) {
      std::shared_ptr<Node> in = n->inputs[next++];
      if (in->requires_grad && !seen.count(in.get())) {
        seen.insert(in.get());
        stack.push_back({std::move(in), 0});
      }
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }
  return order;
}

}  // namespace

void Var::backward(const Tensor& seed, float multiplier, const std::function<void(Node&)>& on_leaf_done) const {
  if (!node_) throw Error("backward: undefined variable");
  if (node_->value.numel() != 1)
    throw Error("backward: needs a one-element (scalar) output, got " + node_->value.describe());
  if (!node_->requires_grad) throw Error("backward: the output does not depend on anything that requires grad");

  const std::vector<std::shared_ptr<Node>> order = inputs_first_order(node_);

  // A graph already used by a backward has freed its edges: going through it again would
  // silently deliver no gradient (PyTorch raises here too). Checked before anything is written.
  for (const auto& n : order)
    if (!n->is_leaf && !n->backward)
      throw Error(std::string("backward: the graph through '") + n->op +
                  "' was already used by a backward call and freed; run the forward again");

  check_same_device("backward seed", node_->value, seed);
  if (seed.numel() != 1) throw Error("backward: the seed must have one element, got " + seed.describe());
  Tensor root = Tensor::empty(Shape{1}, DType::F32, seed.device());
  backend_for(seed.device()).scale(seed, multiplier, root);
  // With a hook: how many ops still have to push a gradient into each leaf. A leaf is done
  // when the last op reading it has run (or been passed over: an op that got no gradient
  // gives none). Counted per edge, so an op reading a leaf twice counts twice.
  std::unordered_map<Node*, int> readers_left;
  if (on_leaf_done)
    for (const auto& n : order)
      if (!n->is_leaf)
        for (const auto& in : n->inputs)
          if (in->is_leaf && in->requires_grad) ++readers_left[in.get()];
  accumulate_grad(*node_, root, true);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = it->get();
    if (n->is_leaf) continue;
    if (n->grad.defined() && n->backward) {
      n->backward(*n);
      if (anomaly_mode_enabled()) anomaly_check_backward(*n);
    }
    if (on_leaf_done)
      for (const auto& in : n->inputs)
        if (in->is_leaf && in->requires_grad && --readers_left[in.get()] == 0) on_leaf_done(*in);
    drop_backward_reads(*n);
    // The graph is used once (retain_graph=False): free the gradient and the edges.
    n->grad = Tensor();
    n->backward = nullptr;
    n->inputs.clear();
  }
}

}  // namespace belay
