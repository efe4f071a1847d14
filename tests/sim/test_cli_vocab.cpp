// The command lines read the vocabulary tables of formats/vocab.hpp: `--help`
// shows every knob and every option row with its description, and integers
// are read as everywhere else (decimal or 0x hex).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "formats/vocab.hpp"

namespace fs = std::filesystem;

namespace exmy {
namespace {

// Runs `exmy <args>`; its standard output, and the exit status in `status`.
std::string run_exmy(const std::string& args, int* status = nullptr) {
  const std::string cmd = std::string(EXMY_BINARY) + " " + args + " 2>/dev/null";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  if (status) *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

template <class E>
void expect_rows_in(const OptionTable<E>& table, const std::string& help, const std::string& what) {
  for (const auto& r : table.rows) {
    // boost wraps long lines: the name and the help's first word stand on the row's own line
    const std::string h = r.help;
    const size_t at = help.find(std::string("  ") + r.name + " ");
    ASSERT_NE(at, std::string::npos) << what << ": " << table.what << " " << r.name;
    EXPECT_NE(help.substr(at, help.find('\n', at) - at).find(h.substr(0, h.find(' '))), std::string::npos)
        << what << ": " << r.name;
  }
}

TEST(CliVocab, HelpListsEveryRow) {
  const std::string quantize = run_exmy("quantize --help");
  const std::string sweep = run_exmy("sweep-tensors --help");
  ASSERT_FALSE(quantize.empty());
  ASSERT_FALSE(sweep.empty());
  for (const QuantKnob& k : quant_knobs()) {
    EXPECT_NE(quantize.find(std::string("--") + k.flag + " "), std::string::npos) << k.flag;
    std::string dashed = k.name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    EXPECT_NE(sweep.find("--" + dashed + " "), std::string::npos) << dashed;
  }
  for (const std::string* help : {&quantize, &sweep}) {
    const std::string what = help == &quantize ? "quantize" : "sweep-tensors";
    expect_rows_in(round_options(), *help, what);
    expect_rows_in(scale_rule_options(), *help, what);
    expect_rows_in(arith_options(), *help, what);
    expect_rows_in(zero_scale_options(), *help, what);
    expect_rows_in(tensor_amax_options(), *help, what);
    expect_rows_in(code_convention_options(), *help, what);
    expect_rows_in(dequant_order_options(), *help, what);
  }
}

// --rht-signs 1234 is 0x04D2, as a recipe's rht_signs = 1234 is now.
TEST(CliVocab, RhtSignsAreDecimalOrHex) {
  const fs::path dir = fs::temp_directory_path() / ("exmy_cli_vocab_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 2.75f + 0.01f * static_cast<float>(i);
  std::ofstream(dir / "x.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  auto out = [&](const std::string& signs) {
    const std::string y = (dir / ("y" + signs + ".f32")).string();
    int status = -1;
    run_exmy("quantize --input " + (dir / "x.f32").string() + " --shape 4,16 --elem e2m1 --scale e4m3 --rht" +
                 " --rht-signs " + signs + " --output " + y,
             &status);
    EXPECT_EQ(status, 0) << signs;
    std::ifstream f(y, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  const auto dec = out("1234");
  EXPECT_FALSE(dec.empty());
  EXPECT_EQ(dec, out("0x04D2"));
  EXPECT_NE(dec, out("0x1234"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace exmy
