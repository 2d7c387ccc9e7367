// The option table of `belay train` (apps/run/train_options.h) as the CLI builds it: every
// row is a CLI11 option of the train subcommand and nothing else is; a value given on the
// command line lands where the table says (the same config as the row's field set directly,
// which is what belay.train's keywords do); a bad word gives the same message either way.
// tests/apps/python/test_pytorch_habits.py checks the Python side against `--print-config`.
#include <catch2/catch.hpp>

#include <set>
#include <type_traits>
#include <variant>

#include "apps/cli/cli.h"
#include "apps/run/train_options.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "tests/files.h"

using namespace belay;

namespace {

// --init opens its file when the options are finished (a checkpoint or model file gives the
// model kind and sizes): a file of weights alone, which records nothing, is a good word.
std::string weights_only_file() {
  static const std::string path = [] {
    const std::string p = belay::test::temp_path("train_options", "init.safetensors");
    belay::write_safetensors(p, {});
    return p;
  }();
  return path;
}

// A good value for every kind of field, and the words of the options that are words.
std::string good_word(const TrainOption& row) {
  const std::string name = row.name;
  if (name == "model") return "mlp";
  if (name == "optimizer") return "sgd";
  if (name == "schedule") return "cosine";
  if (name == "dtype") return "bf16";
  if (name == "grad-dtype") return "compute";
  if (name == "clip-mode") return "value";
  if (name == "fp32-ops") return "linear,gelu";
  if (name == "device") return "cuda";
  if (name == "spike") return "3:1e8";
  if (name == "rollback-on") return "divergence";
  if (name == "rollback-policy") return "fp32";
  if (name == "init") return weights_only_file();
  return std::visit(
      [](auto field) -> std::string {
        using T = std::decay_t<decltype(field(std::declval<TrainOptions&>()))>;
        if constexpr (std::is_same_v<T, std::string>) return "some/file.safetensors";
        else if constexpr (std::is_floating_point_v<T>) return "0.375";
        else if constexpr (std::is_same_v<T, bool>) return "";
        else return "7";
      },
      row.field);
}

// The row's field set directly from that word, as belay.train's keyword reader does.
void set_directly(const TrainOption& row, const std::string& word, TrainOptions& o) {
  std::visit(
      [&](auto field) {
        auto& target = field(o);
        using T = std::decay_t<decltype(target)>;
        if constexpr (std::is_same_v<T, bool>) target = true;
        else if constexpr (std::is_same_v<T, std::string>) target = word;
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) target.push_back(word);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) target.push_back(std::stoll(word));
        else if constexpr (std::is_floating_point_v<T>) target = static_cast<T>(std::stod(word));
        else target = static_cast<T>(std::stoll(word));
      },
      row.field);
  o.given.insert(row.name);
}

// `belay train ARGS` parsed by the CLI's own table, and its options finished.
std::string cli_text(const std::vector<std::string>& args, std::string* error = nullptr) {
  CLI::App app;
  TrainCommand t;
  add_train_command(app, t);
  std::vector<std::string> argv{"train"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::reverse(argv.begin(), argv.end());  // CLI11 takes a reversed vector
  app.parse(argv);
  try {
    finish_train_command(t);
  } catch (const UsageError& e) {
    if (!error) throw;
    *error = e.what();
    return "";
  }
  return train_config_text(t.options);
}

}  // namespace

TEST_CASE("train options: every row is a CLI option of train, and only they are", "[apps][cli][options]") {
  CLI::App app;
  TrainCommand t;
  add_train_command(app, t);
  std::set<std::string> cli, table;
  for (const CLI::Option* o : t.app->get_options())
    for (const std::string& n : o->get_lnames())
      if (n != "help") cli.insert(n);
  for (const TrainOption& row : train_options()) CHECK(table.insert(row.name).second);  // no name twice
  CHECK(cli == table);
  CHECK(table.size() > 60);
}

TEST_CASE("train options: a value on the command line gives the config the row's field gives", "[apps][cli][options]") {
  const std::string defaults = cli_text({});
  for (const TrainOption& row : train_options()) {
    if (row.traits & kCliOnly) continue;
    INFO("--" << row.name);
    const std::string word = good_word(row);
    std::vector<std::string> args{std::string("--") + row.name};
    if (!is_flag(row)) args.push_back(word);
    TrainOptions direct;
    set_directly(row, word, direct);
    finish_train_options(direct);
    const std::string from_cli = cli_text(args);
    CHECK(from_cli == train_config_text(direct));
    CHECK(from_cli != defaults);  // the option changed something
  }
}

TEST_CASE("train options: a bad word gives one message, from the CLI and from the field", "[apps][cli][options]") {
  const std::vector<std::pair<const char*, const char*>> bad{
      {"grad-dtype", "fp64"}, {"clip-mode", "both"},   {"rollback-on", "sometimes"}, {"dtype", "fp8"},
      {"spike", "12"},        {"fp32-ops", "nothing"}, {"rollback-policy", "lower-lr"}};
  for (const auto& [name, word] : bad) {
    INFO("--" << name << " " << word);
    std::string from_cli;
    cli_text({std::string("--") + name, word}, &from_cli);
    TrainOptions direct;
    set_directly(*option_named(name), word, direct);
    std::string from_field;
    try {
      finish_train_options(direct);
    } catch (const UsageError& e) {
      from_field = e.what();
    }
    CHECK_FALSE(from_cli.empty());
    CHECK(from_cli == from_field);
    CHECK(from_cli.find(word) != std::string::npos);  // it names the bad word
  }
}

TEST_CASE("train options: the model kind's defaults fill what was not given", "[apps][cli][options]") {
  const std::string gpt = cli_text({"--model", "gpt"});
  CHECK(gpt.find("\nlr=0.00300000003\n") != std::string::npos);
  CHECK(gpt.find("\nsteps=1500\n") != std::string::npos);
  const std::string gpt_lr = cli_text({"--model", "gpt", "--lr", "0.5"});
  CHECK(gpt_lr.find("\nlr=0.5\n") != std::string::npos);
  CHECK(cli_text({}).find("\nsteps=200\n") != std::string::npos);
}
