// `belay validate --checkpoint GPT.ck --data TOKENS`: mixed precision checked against the
// FP32 reference on a GPT's next-token decisions over held-out text (docs/validate.md). The
// model the checkpoint holds runs on the first --windows held-out windows of the tokens file,
// in FP32 and under autocast; every position is a decision among the vocabulary. Reported:
// the logits' errors, changed argmax tokens, near-ties (reference top-2 gap under the tie
// margin), and the loss in nats per token in FP32 and under AMP. validate's options (--rtol
// --atol --tie-margin --max-flips) read for logits, their defaults scaled with the model's
// depth (validate_gpt.cpp says how); the checks: both runs finite, logits within the
// tolerance, no changed decision away from the near-ties beyond --max-flips. Printed and in
// --json.
#pragma once
#include <iosfwd>

#include "apps/run/validate.h"

namespace belay {

// True when `config` asks for the GPT check: a GPT checkpoint, or --model gpt.
bool validates_gpt(const ValidateConfig& config);
ValidateResult run_validate_gpt(const ValidateConfig& config, std::ostream& out);

}  // namespace belay
