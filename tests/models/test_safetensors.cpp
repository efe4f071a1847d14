// safetensors read/write and HF checkpoint round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "formats/error.hpp"
#include "models/hf_checkpoint.hpp"
#include "models/safetensors.hpp"

namespace exmy::models {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("exmy_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(Safetensors, RoundTripAllDtypes) {
  const fs::path dir = temp_dir("st");
  const std::vector<float> f = {1.0f, -2.5f, 3.14159274f, 1e-30f, 65504.0f, 1.00390625f};
  const std::vector<double> d = {0.1, -1e300, 2.0};
  const std::vector<int32_t> i32 = {-7, 0, 2147483647};
  const std::vector<int64_t> i64 = {-1, 1LL << 40};
  std::vector<StSource> src(5);
  src[0] = {"a.f32", {2, 3}, "F32", f.data()};
  src[1] = {"a.bf16", {6}, "BF16", f.data()};
  src[2] = {"b.f64", {3}, "F64", nullptr, d.data()};
  src[3] = {"c.i32", {3}, "I32", nullptr, nullptr, i32.data()};
  src[4] = {"c.i64", {2, 1}, "I64", nullptr, nullptr, nullptr, i64.data()};
  const std::string path = (dir / "t.safetensors").string();
  write_safetensors(path, src, {{"format", "pt"}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.get("a.f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.read<float>("a.f32"), f);
  const auto bf = r.read<float>("a.bf16");
  // bf16 keeps 8 significant bits, rounded to nearest even.
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_EQ(bf[2], 3.140625f);
  EXPECT_EQ(bf[5], 1.0f);  // 1 + 2^-8 is a tie: to even
  EXPECT_EQ(r.read<double>("b.f64"), d);
  EXPECT_EQ(r.read<int32_t>("c.i32"), i32);
  EXPECT_EQ(r.read<int64_t>("c.i64"), i64);
  EXPECT_THROW(r.read<float>("c.i32"), Error);
  EXPECT_THROW(r.read<int32_t>("c.i64"), Error);  // 2^40 does not fit
  EXPECT_THROW(r.get("nope"), Error);
  fs::remove_all(dir);
}

TEST(Safetensors, CorruptFilesAreOneLineErrors) {
  const fs::path dir = temp_dir("st_bad");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  auto msg = [](const std::string& path) {
    try {
      SafetensorsReader r(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(write("short", "abc")).find("not a safetensors file"), std::string::npos);
  EXPECT_NE(msg(write("hlen", std::string("\xff\xff\x00\x00\x00\x00\x00\x00", 8) + "{}")).find("corrupt safetensors header length"),
            std::string::npos);
  const std::string hdr = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(hdr.size());
  EXPECT_NE(msg(write("trunc", len + hdr + "12345678")).find("do not match its shape or the file size"),
            std::string::npos);
  EXPECT_NE(msg((dir / "missing").string()).find("cannot open"), std::string::npos);
  fs::remove_all(dir);
}

TEST(HfCheckpoint, SaveAndLoadRoundTrip) {
  const fs::path dir = temp_dir("ckpt");
  const NemotronHConfig c = preset_config("proxy-tiny");
  auto f = sim::make_linear_factory<float>("fp32");
  NemotronH<float> a(c, *f);
  a.init_weights(5);
  save_hf_checkpoint(a, dir.string(), "F32");
  NemotronH<float> b(resolve_config(dir.string()), *f);
  load_hf_weights(b, dir.string());
  EXPECT_TRUE(std::equal(a.arena().params().begin(), a.arena().params().end(), b.arena().params().begin()));
  SafetensorsReader r((dir / "model.safetensors").string());
  EXPECT_NE(r.find("backbone.layers.0.mixer.in_proj.weight"), nullptr);
  EXPECT_NE(r.find("lm_head.weight"), nullptr);
  EXPECT_EQ(r.get("backbone.layers.0.mixer.conv1d.weight").shape, (std::vector<int64_t>{64, 1, 4}));
  // A checkpoint of another shape is refused with the tensor named.
  NemotronHConfig other = c;
  apply_override(other, "hidden_size", "48");
  NemotronH<float> wrong(other, *f);
  try {
    load_hf_weights(wrong, dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape (64,32) but the config needs (64,48)"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace exmy::models
