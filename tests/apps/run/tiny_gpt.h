// A tiny GPT checkpoint for the tests of belay sample and validate: a tokens file of ASCII
// text (I64 ids, vocabulary 128, so bytes >= 128 are not tokens) and a GPT (1 block, width 16,
// 2 heads, context 8) trained a few steps on it. Milliseconds; a path private to the process.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "apps/run/token_dataset.h"
#include "apps/run/train.h"
#include "engine/safetensors.h"
#include "tests/files.h"

namespace belay::test {

inline std::string tiny_tokens_file(const std::string& prefix) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "def f" + std::to_string(i % 7) + "(x):\n    return x * " + std::to_string(i) + "\n";
  std::vector<int64_t> ids(text.begin(), text.end());
  const size_t cut = ids.size() * 9 / 10;
  const std::string path = temp_path(prefix, "tokens.safetensors");
  write_safetensors(path, {}, {{"tokens.format", kTokensFormat}, {"tokens.vocab", "128"}},
                    {{"train", std::vector<int64_t>(ids.begin(), ids.begin() + static_cast<long>(cut))},
                     {"heldout", std::vector<int64_t>(ids.begin() + static_cast<long>(cut), ids.end())}});
  return path;
}

// The tiny GPT's run on `tokens` (1 block, width 16, 2 heads, context 8, batch 4), quiet.
inline TrainConfig tiny_gpt_config(const std::string& tokens, int64_t steps) {
  TrainConfig c;
  c.model = "gpt";
  c.data = tokens;
  c.layers = 1;
  c.width = 16;
  c.heads = 2;
  c.context = 8;
  c.batch = 4;
  c.steps = steps;
  c.quiet = true;
  return c;
}

// Trains the tiny GPT `steps` steps on `tokens` and returns its checkpoint's path.
inline std::string tiny_gpt_checkpoint(const std::string& prefix, const std::string& tokens, int64_t steps = 5) {
  TrainConfig c = tiny_gpt_config(tokens, steps);
  c.checkpoint = temp_path(prefix, "gpt.ck");
  std::ostringstream out;
  run_training(c, out);
  return c.checkpoint;
}

}  // namespace belay::test
