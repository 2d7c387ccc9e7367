// The activations the backends compute (Backend::activation), by kind.
#pragma once

namespace belay {

// Gelu: the exact (erf) form, PyTorch's default. GeluTanh: the tanh form, PyTorch's
// approximate='tanh', GPT-2's own and Hugging Face's "gelu_new".
enum class Activation { Relu, Gelu, GeluTanh };

}  // namespace belay
