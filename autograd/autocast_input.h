// Internal to autograd: how an op reads an input under autocast. The op class's rule
// (amp/autocast.h: the table, --fp32-ops, low_ops) picks the dtype; a cast, when needed, is
// recorded in the graph as "cast for <op>" so the gradient goes back in the input's dtype and
// anomaly mode names the op that asked for it (a cast to FP16 is where an overflow starts).
#pragma once
#include "amp/autocast.h"
#include "autograd/graph.h"

namespace belay {

// The dtype an op of this class runs in for an input of dtype `given`.
DType autocast_dtype(OpClass cls, DType given);
// x cast to `dtype` (x itself when it has it), recorded as "cast for <op>". `operand` names x
// among the op's inputs ("input", "weight", "q"): the cast census's site (cast_census.h).
Var autocast_cast(const Var& x, DType dtype, OpClass cls, const char* operand);
// x as an op of this class reads it: cast up to FP32, down to the autocast dtype, or x itself,
// as the class's rule says (autocast_cast(x, autocast_dtype(cls, x.dtype()), cls, "input")).
Var autocast_input(const Var& x, OpClass cls);

}  // namespace belay
