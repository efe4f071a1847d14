// The folder rules of docs/architecture.md, read from the sources: formats/
// includes nothing of the simulator or the models, models/ only the
// simulator's numeric core and I/O (never recipes, training or the command
// line), and HDF5 is called from sim/io/ alone (the one run-file reader and
// writer, the checkpoint and tensor-file helpers).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;

struct Source {
  std::string rel, text;
};

std::vector<Source> sources(const std::string& folder) {
  std::vector<Source> out;
  const fs::path root = fs::path(EXMY_SOURCE_DIR) / folder;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back({fs::relative(e.path(), EXMY_SOURCE_DIR).string(), ss.str()});
  }
  return out;
}

// The project headers a file includes ("dir/file.hpp").
std::vector<std::string> includes(const std::string& text) {
  static const std::regex inc(R"re(#include\s+"([^"]+)")re");
  std::vector<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), inc), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

TEST(Layering, FormatsIncludeNothingOfTheSimulatorOrModels) {
  const auto src = sources("formats");
  ASSERT_GT(src.size(), 10u);
  for (const auto& s : src)
    for (const auto& i : includes(s.text))
      EXPECT_FALSE(i.starts_with("sim/") || i.starts_with("models/")) << s.rel << " includes " << i;
}

TEST(Layering, ModelsDoNotKnowRecipesTrainingOrTheCommandLine) {
  const auto src = sources("models");
  ASSERT_GT(src.size(), 10u);
  for (const auto& s : src)
    for (const auto& i : includes(s.text))
      EXPECT_FALSE(i.starts_with("sim/quant/") || i.starts_with("sim/train/") || i.starts_with("sim/cli/") ||
                   i.starts_with("sim/sweep/") || i.starts_with("sim/eval/") || i.starts_with("sim/dist/"))
          << s.rel << " includes " << i;
}

TEST(Layering, HdfFiveIsCalledFromSimIoAlone) {
  // An H5 API call (H5Fopen(, H5Dread(, ...) or the C header itself.
  static const std::regex call(R"re(\bH5[A-Z][A-Za-z0-9_]*\s*\()re");
  static const std::regex header(R"re(#include\s*<hdf5\.h>)re");
  size_t io_calls = 0;
  for (const char* folder : {"formats", "sim", "models", "analysis"}) {
    if (!fs::exists(fs::path(EXMY_SOURCE_DIR) / folder)) continue;
    for (const auto& s : sources(folder)) {
      const bool io = s.rel.starts_with("sim/io/");
      const bool calls = std::regex_search(s.text, call), inc = std::regex_search(s.text, header);
      if (io) io_calls += calls;
      else EXPECT_FALSE(calls || inc) << s.rel << " uses the HDF5 C API outside sim/io/";
    }
  }
  EXPECT_GT(io_calls, 2u);  // the rule reads real sources
}

}  // namespace
