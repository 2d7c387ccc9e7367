// GPT-2's byte-level BPE (apps/text/): the pre-tokenizer's pieces, encoding by merge rank on a
// vocabulary whose ids are worked out by hand, byte round trips of any bytes, training, the
// compact form and the Hugging Face files, and each refusal in one line.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "apps/text/bpe.h"
#include "apps/text/bpe_source.h"
#include "apps/text/byte_alphabet.h"
#include "apps/text/pretokenize.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "files.h"

namespace {

using belay::BpeTokenizer;
using Pieces = std::vector<std::string>;

Pieces pieces(const std::string& text) {
  Pieces out;
  for (std::string_view p : belay::pretokenize(text)) out.emplace_back(p);
  return out;
}

std::string joined(const Pieces& p) {
  std::string s;
  for (const auto& x : p) s += x;
  return s;
}

// A folder of its own for each test case's files.
std::string temp_dir(const std::string& name) {
  const std::string d = belay::test::temp_path("bpe", name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// vocab.json: the 256 bytes with id == byte, then `extra` tokens (alphabet form) from id 256.
std::string vocab_json(const std::vector<std::string>& extra) {
  std::string j = "{";
  for (int b = 0; b < 256; ++b) {
    std::string c = belay::byte_char(static_cast<uint8_t>(b));
    if (c == "\"" || c == "\\") c = "\\" + c;
    j += "\"" + c + "\": " + std::to_string(b) + ", ";
  }
  for (size_t i = 0; i < extra.size(); ++i) j += "\"" + extra[i] + "\": " + std::to_string(256 + i) + ", ";
  j.resize(j.size() - 2);
  return j + "}";
}

// The hand-made tokenizer: h e -> 256 "he", l l -> 257 "ll", he ll -> 258 "hell",
// hell o -> 259 "hello", Ġ w -> 260 " w".
BpeTokenizer hand_made(const std::string& dir) {
  belay::test::spit(dir + "/vocab.json", vocab_json({"he", "ll", "hell", "hello", "Ġw"}));
  belay::test::spit(dir + "/merges.txt", "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ w\n");
  return BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt");
}

std::string random_bytes(std::mt19937& rng, size_t max_len) {
  std::uniform_int_distribution<size_t> len(0, max_len);
  std::uniform_int_distribution<int> byte(0, 255), kind(0, 3);
  std::string s(len(rng), '\0');
  for (char& c : s) {
    const int k = kind(rng);  // some runs of text among the noise, so that merges apply
    c = static_cast<char>(k == 0 ? byte(rng) : k == 1 ? ' ' : k == 2 ? 'a' + byte(rng) % 4 : byte(rng) | 0x80);
  }
  return s;
}

// A one-line UsageError whose message holds `part`.
template <class F>
void refuses(F&& f, const std::string& part) {
  try {
    f();
    FAIL("no error; expected one with: " << part);
  } catch (const belay::UsageError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find(part) != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}

const char* kSample =
    "def main(argv):\n    for i in range(10):\n        print('hello world', i)  # it's 3.14\n\n"
    "class Thing:\n    \"\"\"A thing.\"\"\"\n    x = 1_000\n    y = x ** 2\n    return x + y   \n";

}  // namespace

TEST_CASE("pretokenize splits ASCII words numbers and symbols as GPT-2", "[bpe]") {
  CHECK(pieces("Hello world") == Pieces{"Hello", " world"});
  CHECK(pieces("$$$ ok!! 3.14") == Pieces{"$$$", " ok", "!!", " 3", ".", "14"});
  CHECK(pieces("a_b(c)") == Pieces{"a", "_", "b", "(", "c", ")"});
  CHECK(pieces("") == Pieces{});
}

TEST_CASE("pretokenize keeps the lowercase contractions only", "[bpe]") {
  CHECK(pieces("I'm don't you're we've he'll she'd it's") ==
        Pieces{"I", "'m", " don", "'t", " you", "'re", " we", "'ve", " he", "'ll", " she", "'d", " it", "'s"});
  CHECK(pieces("IT'S") == Pieces{"IT", "'", "S"});
  CHECK(pieces("x 's") == Pieces{"x", " '", "s"});
}

TEST_CASE("pretokenize reads Unicode letters and numbers", "[bpe]") {
  CHECK(pieces("héllo wörld 123 ١٢٣ 漢字") == Pieces{"héllo", " wörld", " 123", " ١٢٣", " 漢字"});
  CHECK(pieces("Ωmega²") == Pieces{"Ωmega", "²"});  // ² is a number (No)
  // No-break space is white space (not the ' ' of ' ?'); U+180E is not (Oniguruma's \s).
  CHECK(pieces("a\u00A0b") == Pieces{"a", "\u00A0", "b"});
  CHECK(pieces("a\u180Eb") == Pieces{"a", "\u180E", "b"});
}

TEST_CASE("pretokenize leaves the last space of a run to the next word", "[bpe]") {
  CHECK(pieces("a  b") == Pieces{"a", " ", " b"});
  CHECK(pieces("x   \n  y") == Pieces{"x", "   \n ", " y"});
  CHECK(pieces("end   ") == Pieces{"end", "   "});
  CHECK(pieces("x\n") == Pieces{"x", "\n"});
  CHECK(pieces("\n\n    return") == Pieces{"\n\n   ", " return"});
  CHECK(pieces("a \t!") == Pieces{"a", " ", "\t", "!"});  // " \t" before "!" backs off to " "
}

TEST_CASE("pretokenize makes each invalid UTF-8 byte a piece of its own", "[bpe]") {
  CHECK(pieces("ab\xff" "cd") == Pieces{"ab", "\xff", "cd"});
  CHECK(pieces("\xe6\xbc") == Pieces{"\xe6", "\xbc"});              // 漢 cut short
  CHECK(pieces("\xc0\xaf") == Pieces{"\xc0", "\xaf"});              // an overlong '/'
  CHECK(pieces("\xed\xa0\x80") == Pieces{"\xed", "\xa0", "\x80"});  // a surrogate
  CHECK(pieces("\xf4\x90\x80\x80") == Pieces{"\xf4", "\x90", "\x80", "\x80"});  // above U+10FFFF
  CHECK(pieces(" \xff word") == Pieces{" ", "\xff", " word"});
  CHECK(pieces("\xe6\xbc\xa2") == Pieces{"\xe6\xbc\xa2"});
  CHECK(belay::utf8_sequence_length("\xf0\x9f\x98\x80") == 4);
  CHECK(belay::utf8_sequence_length("\xf0\x8f\xbf\xbf") == 0);  // overlong 4-byte
}

TEST_CASE("pretokenize covers any bytes in order and survives long runs", "[bpe]") {
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_bytes(rng, 200);
    const Pieces p = pieces(s);
    CHECK(joined(p) == s);
    for (const auto& x : p) CHECK(!x.empty());
  }
  const std::string spaces(1 << 20, ' ');
  CHECK(pieces(spaces + "x") == Pieces{spaces.substr(1), " x"});
  const std::string letters(1 << 20, 'a');
  CHECK(pieces(letters) == Pieces{letters});
}

TEST_CASE("bpe encodes by merge rank on a hand-made vocabulary", "[bpe]") {
  const BpeTokenizer tok = hand_made(temp_dir("hand"));
  CHECK(tok.vocab_size() == 261);
  CHECK(tok.merges() == 5);
  CHECK(tok.encode("hello") == std::vector<int32_t>{259});
  CHECK(tok.encode("hello world") == std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'});
  CHECK(tok.encode("hel") == std::vector<int32_t>{256, 'l'});
  CHECK(tok.encode("ell") == std::vector<int32_t>{'e', 257});
  CHECK(tok.encode("hellhello") == std::vector<int32_t>{258, 259});
  CHECK(tok.encode("") == std::vector<int32_t>{});
  CHECK(tok.decode({259, 260, 'o'}) == "hello wo");
  CHECK(tok.token_bytes(260) == " w");
  CHECK(tok.token_bytes(10) == "\n");
}

TEST_CASE("bpe decode of encode gives back any bytes", "[bpe]") {
  const BpeTokenizer hand = hand_made(temp_dir("roundtrip"));
  const BpeTokenizer trained = belay::train_bpe(kSample, 60);
  std::mt19937 rng(2024);
  for (int i = 0; i < 500; ++i) {
    const std::string s = random_bytes(rng, 300);
    CHECK(hand.decode(hand.encode(s)) == s);
    CHECK(trained.decode(trained.encode(s)) == s);
  }
  CHECK(trained.decode(trained.encode(kSample)) == kSample);
  CHECK(trained.encode(kSample).size() < std::string(kSample).size() / 2);
}

TEST_CASE("train_bpe with 0 merges is the byte tokens", "[bpe]") {
  const BpeTokenizer tok = belay::train_bpe("anything", 0);
  CHECK(tok.vocab_size() == 256);
  CHECK(tok.merges() == 0);
  const std::string s = "bytes \xff\x00 and text";
  const std::vector<int32_t> ids = tok.encode(s);
  REQUIRE(ids.size() == s.size());
  for (size_t i = 0; i < s.size(); ++i) CHECK(ids[i] == static_cast<uint8_t>(s[i]));
}

TEST_CASE("train_bpe merges the most frequent pair and breaks ties by the smallest ids", "[bpe]") {
  // Pieces "ab", " ab" x2, " cd": (a,b) 3 times, then ( ,ab) 2, then ( ,c) and (c,d) tie at 1.
  const BpeTokenizer tok = belay::train_bpe("ab ab ab cd", 4);
  CHECK(tok.encode("ab") == std::vector<int32_t>{256});
  CHECK(tok.encode(" ab") == std::vector<int32_t>{257});
  CHECK(tok.token_bytes(258) == " c");
  CHECK(tok.token_bytes(259) == " cd");
  refuses([] { belay::train_bpe("ab ab ab cd", 5); }, "no pair left to merge after 4 merges");
  refuses([] { belay::train_bpe("ab", -1); }, "merges must be");
}

TEST_CASE("train_bpe is deterministic", "[bpe]") {
  const BpeTokenizer a = belay::train_bpe(kSample, 60), b = belay::train_bpe(kSample, 60);
  CHECK(a.serialized() == b.serialized());
  CHECK(a.vocab_size() == 316);
  for (int32_t id = 0; id < 256; ++id) CHECK(a.token_bytes(id) == std::string(1, static_cast<char>(id)));
}

TEST_CASE("bpe serialized form round-trips exactly", "[bpe]") {
  const BpeTokenizer tok = belay::train_bpe(kSample, 50);
  const std::string s = tok.serialized();
  const BpeTokenizer back = BpeTokenizer::from_serialized(s, "test");
  CHECK(back.serialized() == s);
  CHECK(back.encode(kSample) == tok.encode(kSample));
  refuses([] { BpeTokenizer::from_serialized("{not json", "x.safetensors"); }, "x.safetensors: tokens.bpe is not");
  refuses([] { BpeTokenizer::from_serialized(R"({"format":"other"})", "x.safetensors"); }, "belay.bpe.v1");
  refuses([] { BpeTokenizer::from_serialized(R"({"format":"belay.bpe.v1","vocab":[]})", "x.safetensors"); },
          "malformed");
}

TEST_CASE("bpe Hugging Face files round-trip through a directory", "[bpe]") {
  const std::string dir = temp_dir("files");
  const BpeTokenizer tok = belay::train_bpe(kSample, 70);
  tok.write_files(dir + "/out");
  const BpeTokenizer from_json = BpeTokenizer::from_directory(dir + "/out");
  const BpeTokenizer from_pair = BpeTokenizer::from_files(dir + "/out/vocab.json", dir + "/out/merges.txt");
  CHECK(from_json.serialized() == tok.serialized());
  CHECK(from_pair.serialized() == tok.serialized());
  CHECK(belay::load_bpe_tokenizer(dir + "/out").serialized() == tok.serialized());
  CHECK(belay::load_bpe_tokenizer(dir + "/out/tokenizer.json").serialized() == tok.serialized());
  // A tokens file (or checkpoint) with tokens.bpe in its metadata.
  belay::write_safetensors(dir + "/t.safetensors", {}, {{belay::kBpeMetadataKey, tok.serialized()}},
                           {{"train", {1, 2}}});
  CHECK(belay::load_bpe_tokenizer(dir + "/t.safetensors").serialized() == tok.serialized());
  belay::write_safetensors(dir + "/bytes.safetensors", {}, {{"tokens.vocab", "256"}}, {{"train", {1, 2}}});
  refuses([&] { belay::load_bpe_tokenizer(dir + "/bytes.safetensors"); }, "has no tokens.bpe");
  refuses([&] { belay::load_bpe_tokenizer(dir + "/nothing"); }, "no such file or directory");
  refuses([&] { BpeTokenizer::from_directory(dir); }, "holds neither tokenizer.json nor vocab.json");
}

TEST_CASE("bpe tokenizer.json keeps its added tokens and matches them in the text", "[bpe]") {
  const std::string dir = temp_dir("added");
  const BpeTokenizer base = hand_made(dir);
  base.write_files(dir + "/hf");
  std::string json = belay::test::slurp(dir + "/hf/tokenizer.json");
  const std::string added = R"("added_tokens":[{"id":261,"content":"<|endoftext|>","single_word":false,"lstrip":false,)"
                            R"("rstrip":false,"normalized":false,"special":true},{"id":262,"content":"<|end|>",)"
                            R"("single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}])";
  json.replace(json.find(R"("added_tokens":[])"), std::string(R"("added_tokens":[])").size(), added);
  belay::test::spit(dir + "/hf/tokenizer.json", json);
  const BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(dir + "/hf/tokenizer.json");
  CHECK(tok.vocab_size() == 263);
  CHECK(tok.encode("hello<|endoftext|> world<|end|>") == std::vector<int32_t>{259, 261, 260, 'o', 'r', 'l', 'd', 262});
  CHECK(tok.encode("<|end|><|endoftext|>x") == std::vector<int32_t>{262, 261, 'x'});
  CHECK(tok.decode({259, 261}) == "hello<|endoftext|>");
  const BpeTokenizer back = BpeTokenizer::from_serialized(tok.serialized(), "t");
  CHECK(back.encode("a<|endoftext|>b") == std::vector<int32_t>{'a', 261, 'b'});
  tok.write_files(dir + "/again");
  CHECK(BpeTokenizer::from_directory(dir + "/again").serialized() == tok.serialized());
}

TEST_CASE("bpe refuses bad files in one line naming the file", "[bpe]") {
  const std::string dir = temp_dir("refusals");
  const std::string v = dir + "/vocab.json", m = dir + "/merges.txt";
  belay::test::spit(m, "#version: 0.2\nh e\n");
  belay::test::spit(v, vocab_json({"he"}));
  CHECK(BpeTokenizer::from_files(v, m).merges() == 1);
  refuses([&] { BpeTokenizer::from_files(dir + "/missing.json", m); },
          "cannot read vocabulary '" + dir + "/missing.json': No such file or directory");
  refuses([&] { BpeTokenizer::from_files(v, dir + "/missing.txt"); },
          "cannot read merges file '" + dir + "/missing.txt': No such file or directory");
  refuses([&] { BpeTokenizer::from_files(v, dir); }, "merges file '" + dir + "' is a directory");
  refuses([&] { BpeTokenizer::from_tokenizer_json(dir); }, "tokenizer file '" + dir + "' is a directory");
  belay::test::spit(dir + "/bad.json", "{\"a\": 1,\n");
  refuses([&] { BpeTokenizer::from_files(dir + "/bad.json", m); }, dir + "/bad.json: not valid JSON");
  belay::test::spit(dir + "/m2.txt", "h e\nq zz\n");
  refuses([&] { BpeTokenizer::from_files(v, dir + "/m2.txt"); }, "m2.txt line 2: token 'zz' is not in the vocabulary");
  belay::test::spit(dir + "/m3.txt", "h e\ne h\n");
  refuses([&] { BpeTokenizer::from_files(v, dir + "/m3.txt"); }, "merge 2 ('e' 'h') makes 'eh', which is not in the vocabulary");
  belay::test::spit(dir + "/m4.txt", "h e\nh e\n");
  refuses([&] { BpeTokenizer::from_files(v, dir + "/m4.txt"); }, "repeats merge 1");
  belay::test::spit(dir + "/m5.txt", "h e x\n");
  refuses([&] { BpeTokenizer::from_files(v, dir + "/m5.txt"); }, "m5.txt line 1: 'h e x' is not two tokens");
  std::string dup = vocab_json({"he"});
  dup.insert(dup.size() - 1, ", \"xy\": 256");
  belay::test::spit(dir + "/dup.json", dup);
  refuses([&] { BpeTokenizer::from_files(dir + "/dup.json", m); }, "id 256 is given to both");
  belay::test::spit(dir + "/gap.json", vocab_json({"he", "hh"}).replace(vocab_json({"he", "hh"}).find("257"), 3, "300"));
  refuses([&] { BpeTokenizer::from_files(dir + "/gap.json", m); }, "no token has id 257");
  belay::test::spit(dir + "/few.json", R"({"a": 0, "b": 1})");
  belay::test::spit(dir + "/none.txt", "");
  refuses([&] { BpeTokenizer::from_files(dir + "/few.json", dir + "/none.txt"); }, "a byte-level BPE needs all 256 bytes");
  refuses([&] { BpeTokenizer::from_files(v, m).decode({1, 9999}); }, "token id 9999 is out of range");
  refuses([&] { BpeTokenizer::from_files(v, m).token_bytes(-1); }, "token id -1 is out of range");
  belay::test::spit(dir + "/wp.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  refuses([&] { BpeTokenizer::from_tokenizer_json(dir + "/wp.json"); }, "wp.json: model type 'WordPiece' is not BPE");
  belay::test::spit(dir + "/pre.json", R"({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Whitespace"}})");
  refuses([&] { BpeTokenizer::from_tokenizer_json(dir + "/pre.json"); }, "the pre-tokenizer is not ByteLevel");
}
