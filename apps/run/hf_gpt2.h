// GPT-2 as Hugging Face transformers ships it (`config.json` + `model.safetensors`, what
// `GPT2LMHeadModel.save_pretrained` writes), in and out of belay.
//
// belay's GPT is GPT-2's architecture; only the storage differs, and this file is that one map:
// - names: transformer.h.{i}.attn.c_attn.* <-> blocks.{i}.attn.{q,k,v}.*, and so on (the
//   "transformer." prefix is optional on the way in, as the original OpenAI files lack it);
// - layout: transformers' Conv1D keeps a weight as [in, out], belay's Linear as [out, in]
//   (PyTorch's), so every projection is transposed;
// - fusion: GPT-2's one c_attn of width 3 D is belay's q, k and v, in that order;
// - the head: GPT-2's is tied to wte; a file with an lm_head.weight that differs is refused.
// Every config field belay can represent is mapped; every one it cannot is refused with one line
// naming the field (import_hf_gpt2 writes nothing then). Fields that change only training
// (dropout) or only the tokenizer's ids (bos/eos) are read as they are or ignored, as said below.
//
// A model file (kModelFileFormat, amp/checkpoint.h): the FP32 weights under belay's state-dict
// names and the model's settings as a checkpoint records them ("setting.model", ".width", ...), nothing of a
// run. `belay import` writes one; `belay train --init`, `belay sample` and `belay export` read
// one or a checkpoint alike (model_file_settings, amp/checkpoint.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/text/bpe.h"
#include "engine/safetensors.h"

namespace belay {

// A Hugging Face GPT-2, read and checked: belay's settings (model gpt, context, width, layers,
// heads, gelu, in, out) and the weights under belay's names, FP32, in the file's order of layers.
struct HfGpt2 {
  std::map<std::string, std::string> settings;
  NamedTensors weights;
  std::vector<std::string> notes;  // what was read but has no effect in belay (dropout rates)
  // The directory's tokenizer (tokenizer.json, or vocab.json + merges.txt), when it has one.
  std::shared_ptr<const BpeTokenizer> tokenizer;
};

// `dir` holds config.json and model.safetensors. UsageError naming the file and the field or
// tensor for anything belay cannot represent, a missing or malformed field, a shape that does
// not match the config, a non-finite weight, or a truncated or corrupt file.
HfGpt2 read_hf_gpt2(const std::string& dir);

// read_hf_gpt2(dir) written to `out` as a model file (atomically; nothing on error).
// `extra_metadata` joins the file's metadata; the tokenizer, when there is one, travels as
// attach.tokens.bpe (apps/text/bpe_source.h).
void write_model_file(const std::string& out, const HfGpt2& model,
                      const std::map<std::string, std::string>& extra_metadata = {});

// A GPT checkpoint or model file as `dir`/config.json + `dir`/model.safetensors, which
// transformers' GPT2LMHeadModel.from_pretrained(dir) loads as it is. `dir` is made if missing;
// one that already holds a config.json or model.safetensors is refused (nothing is overwritten).
// A file that carries a tokenizer adds its files (vocab.json, merges.txt, tokenizer.json).
// Returns the files written.
std::vector<std::string> export_hf_gpt2(const std::string& model_path, const std::string& dir);

// The config.json export_hf_gpt2 writes for these settings (tests read it).
std::string hf_gpt2_config_json(const std::map<std::string, std::string>& settings);

}  // namespace belay
