// `exmy quantize` end to end: every shared reference vector through the
// command line (raw float32 in, values/codes/scales/stats out), the other
// file formats, and the bad-input contract (non-zero exit, one line naming
// the problem, no output file left behind).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <algorithm>
#include <string>
#include <vector>

#include "sim/device/device.hpp"

namespace fs = std::filesystem;

namespace {

struct CmdResult {
  int status;
  std::string err;  // stderr
};

// Runs `exmy <args>` through the shell, capturing stderr.
CmdResult exmy(const std::string& args) {
  const fs::path errf = fs::temp_directory_path() / ("exmy_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(EXMY_BINARY) + " " + args + " 2>" + errf.string() + " >/dev/null";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(errf);
  std::stringstream ss;
  ss << f.rdbuf();
  fs::remove(errf);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ss.str()};
}

// Runs `exmy <args>` with stdout and stderr into `text`; true when it exits 0.
bool exmy_output(const std::string& args, std::string& text) {
  const fs::path outf = fs::temp_directory_path() / ("exmy_cli_out_" + std::to_string(::getpid()));
  const int rc = std::system((std::string(EXMY_BINARY) + " " + args + " >" + outf.string() + " 2>&1").c_str());
  std::ifstream f(outf);
  std::stringstream ss;
  ss << f.rdbuf();
  fs::remove(outf);
  text = ss.str();
  return rc == 0;
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_f32(const fs::path& p, const std::vector<uint32_t>& bits) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(bits.size() * 4));
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("exmy_cli_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
  std::string P(const std::string& name) const { return (dir / name).string(); }
};

TEST_F(CliTest, AllReferenceVectors) {
  std::ifstream f(EXMY_VECTORS);
  ASSERT_TRUE(f.good());
  std::string line;
  int n_cases = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const auto& a = j["args"];
    std::vector<uint32_t> in;
    for (const auto& h : j["input"]) in.push_back(static_cast<uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16)));
    write_f32(dir / "x.f32", in);
    std::ostringstream args;
    args << "quantize --input " << P("x.f32") << " --shape " << j["shape"][0] << "," << j["shape"][1]
         << " --elem " << a["elem"].get<std::string>() << " --scale " << a["scale"].get<std::string>() << " --block "
         << a["block"].get<std::string>() << " --scale-rule " << a["scale_rule"].get<std::string>()
         << " --tensor-amax " << a["tensor_amax"].get<std::string>() << " --round " << a["round"].get<std::string>()
         << " --sr-bits " << a["sr_bits"] << " --seed " << a["seed"] << " --stream " << a["stream"] << " --arith "
         << a["arith"].get<std::string>() << " --zero-scale " << a["zero_scale"].get<std::string>();
    if (a.contains("scale_target")) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", a["scale_target"].get<double>());
      args << " --scale-target " << buf;
    }
    // Even case ids take the threaded path, odd ones the scalar reference.
    if (j["id"].get<int>() % 2) args << " --reference";
    args << " --output " << P("y.f32") << " --codes " << P("codes.bin") << " --scales " << P("scales.bin")
         << " --stats " << P("stats.json");
    const CmdResult r = exmy(args.str());
    ASSERT_EQ(r.status, 0) << "case " << j["id"] << ": " << r.err;

    const auto y = slurp(dir / "y.f32");
    ASSERT_EQ(y.size(), 4 * j["values"].size()) << "case " << j["id"];
    for (size_t i = 0; i < j["values"].size(); ++i) {
      uint32_t b;
      std::memcpy(&b, y.data() + 4 * i, 4);
      ASSERT_EQ(b, std::stoul(j["values"][i].get<std::string>(), nullptr, 16)) << "case " << j["id"] << " element " << i;
    }
    const auto codes = slurp(dir / "codes.bin");
    const size_t cw = codes.size() / j["codes"].size();
    ASSERT_TRUE(cw == 1 || cw == 2) << "case " << j["id"];
    for (size_t i = 0; i < j["codes"].size(); ++i) {
      const uint32_t c = cw == 1 ? codes[i] : (codes[2 * i] | (codes[2 * i + 1] << 8));
      ASSERT_EQ(c, j["codes"][i].get<uint32_t>()) << "case " << j["id"] << " element " << i;
    }
    const auto scales = slurp(dir / "scales.bin");
    if (j["scales"].empty()) {
      ASSERT_TRUE(scales.empty());
    } else {
      const size_t sw = scales.size() / j["scales"].size();
      ASSERT_EQ(scales.size(), sw * j["scales"].size());
      for (size_t i = 0; i < j["scales"].size(); ++i) {
        const uint32_t c = sw == 1 ? scales[i] : (scales[2 * i] | (scales[2 * i + 1] << 8));
        ASSERT_EQ(c, j["scales"][i].get<uint32_t>()) << "case " << j["id"] << " block " << i;
      }
    }
    std::ifstream sf(dir / "stats.json");
    const auto st = nlohmann::json::parse(sf);
    ASSERT_EQ(st.size(), 14u) << "the stats file holds exactly the names of docs/numerics.md §5";  // scale_four the 14th
    for (const auto& [k, v] : j["stats"].items()) {
      ASSERT_TRUE(st.contains(k)) << k;
      if (v.is_number_float()) {
        ASSERT_EQ(st[k].get<double>(), v.get<double>()) << "case " << j["id"] << " " << k;
      } else {
        ASSERT_EQ(st[k].get<uint64_t>(), v.get<uint64_t>()) << "case " << j["id"] << " " << k;
      }
    }
    ++n_cases;
  }
  EXPECT_EQ(n_cases, 306);  // every case of the public vectors, the six wide-row cases included
}

// .npy and HDF5 in and out give the same bits as raw files.
TEST_F(CliTest, NpyAndHdf5) {
  std::vector<uint32_t> bits;
  for (int i = 0; i < 64; ++i) {
    float v = std::ldexp(static_cast<float>((i * 37) % 23) - 11.0f, (i % 7) - 3);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    bits.push_back(b);
  }
  write_f32(dir / "x.f32", bits);
  const std::string common = " --elem e2m1 --scale ue5m3 --block 1x16 --tensor-amax auto --scale-target 448";
  ASSERT_EQ(exmy("quantize --input " + P("x.f32") + " --shape 4,16" + common + " --output " + P("a.f32")).status, 0);
  // raw -> npy
  ASSERT_EQ(exmy("quantize --input " + P("x.f32") + " --shape 4,16" + common + " --output " + P("a.npy")).status, 0);
  // npy -> h5 (shape taken from the .npy header)
  ASSERT_EQ(exmy("quantize --input " + P("a.npy") + common + " --output " + P("b.h5") + ":/q/y").status, 0);
  // h5 -> raw, written into a second dataset of the same file, then read back
  ASSERT_EQ(exmy("quantize --input " + P("b.h5") + ":/q/y" + common + " --output " + P("b.h5") + ":/q/z").status, 0);
  ASSERT_EQ(exmy("quantize --input " + P("b.h5") + ":/q/z" + common + " --output " + P("c.f32")).status, 0);
  const auto a = slurp(dir / "a.f32");
  const auto npy = slurp(dir / "a.npy");
  ASSERT_EQ(a.size(), 256u);
  ASSERT_GT(npy.size(), a.size());
  // the .npy payload equals the raw output
  EXPECT_EQ(0, std::memcmp(npy.data() + npy.size() - a.size(), a.data(), a.size()));
  // quantization is idempotent on its own output: a -> quantize -> a
  EXPECT_EQ(slurp(dir / "c.f32"), a);
}

// The input is streamed in bands of about 1 MiB: a tensor of several bands
// (and a last, shorter one) gives the same bytes in every output as the
// whole-tensor reference, for 1 and 2 threads, with a current tensor amax
// (read twice) and stochastic rounding.
TEST_F(CliTest, StreamedBandsEqualTheWholeTensorReference) {
  std::vector<uint32_t> bits(static_cast<size_t>(700) * 1024);
  uint32_t h = 12345;
  for (uint32_t& b : bits) {
    h = h * 1103515245u + 12345u;
    float v = std::ldexp(static_cast<float>(static_cast<int>(h >> 8) % 2001 - 1000), -8);
    std::memcpy(&b, &v, 4);
  }
  write_f32(dir / "x.f32", bits);
  const std::string common = "quantize --input " + P("x.f32") +
                             " --shape 700,1024 --elem e2m1 --scale ue5m3 --block 1x16 --tensor-amax auto"
                             " --round stochastic --seed 5 --stream 3";
  auto outs = [&](const std::string& tag) {
    return " --output " + P(tag + ".f32") + " --codes " + P(tag + ".codes") + " --scales " + P(tag + ".scales") +
           " --stats " + P(tag + ".json");
  };
  ASSERT_EQ(exmy(common + " --reference" + outs("ref")).status, 0);
  for (const char* t : {"1", "2"}) {
    ASSERT_EQ(exmy(common + " --threads " + t + outs(t)).status, 0);
    for (const char* ext : {".f32", ".codes", ".scales", ".json"})
      EXPECT_EQ(slurp(dir / (std::string(t) + ext)), slurp(dir / (std::string("ref") + ext))) << t << ext;
  }
  EXPECT_EQ(slurp(dir / "ref.f32").size(), bits.size() * 4);
}

// Bad input: non-zero exit, one line naming the problem, no output written.
TEST_F(CliTest, BadInputIsOneLineAndWritesNothing) {
  write_f32(dir / "x.f32", std::vector<uint32_t>(32, 0x3f800000u));
  write_f32(dir / "nan.f32", std::vector<uint32_t>(16, 0x7fc00000u));
  std::ofstream(dir / "bad.npy") << "not a numpy file";
  const std::string out = " --output " + P("y.f32") + " --codes " + P("c.bin") + " --stats " + P("s.json");
  struct Bad {
    std::string args, needle;
  };
  const std::vector<Bad> cases = {
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e9m1" + out, "e9m1"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1:foo" + out, "foo"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --scale nope" + out, "nope"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --round sideways" + out, "sideways"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --block 3x5" + out, "3x5"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --scale-rule magic" + out, "magic"},
      {"quantize --input " + P("x.f32") + " --shape 5,8 --elem e2m1" + out, "5,8"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --frobnicate" + out, "frobnicate"},
      {"quantize --input " + P("missing.f32") + " --shape 4,8 --elem e2m1" + out, "missing.f32"},
      {"quantize --input " + P("bad.npy") + " --elem e2m1" + out, "bad.npy"},
      {"quantize --input " + P("nan.f32") + " --shape 1,16 --elem e2m1 --scale ue8m0:nans=0" + out, "NaN"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --no-saturate --tensor-amax 1e-6" + out,
       "overflows"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --tensor-amax -3" + out, "-3"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --rht --block 1x32" + out, "rht"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --sr-bits 40 --round stochastic" + out, "40"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --output " + P("nodir/y.f32"), "nodir"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --device gpu" + out,
       "--device gpu: expected cpu, cuda, cuda:N"},
      {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --device cuda --reference" + out, "--reference"},
  };
  for (const auto& c : cases) {
    const CmdResult r = exmy(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "message should name '" << c.needle << "': " << r.err;
    EXPECT_FALSE(fs::exists(dir / "y.f32")) << c.args;
    EXPECT_FALSE(fs::exists(dir / "c.bin")) << c.args;
    EXPECT_FALSE(fs::exists(dir / "s.json")) << c.args;
  }
  // nothing else (no temporaries) was left in the directory
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left.size(), 3u);
}

// --device cuda where it cannot run (no CUDA build, no device): one line
// naming why, nothing written; an index past the last device likewise.
TEST_F(CliTest, DeviceCudaWithoutADeviceIsOneLineAndWritesNothing) {
  write_f32(dir / "x.f32", std::vector<uint32_t>(32, 0x3f800000u));
  const exmy::sim::DeviceInventory inv = exmy::sim::device_inventory();
  const std::string why = !inv.built_with_cuda ? "exmy was built without CUDA (EXMY_CUDA=OFF, or no nvcc at build time)"
                          : inv.count == 0     ? "no CUDA device is visible (cudaGetDeviceCount: "
                                               : "this machine has " + std::to_string(inv.count) + " CUDA device";
  const std::string dev = inv.count == 0 ? "cuda" : "cuda:" + std::to_string(inv.count);
  const std::string out = " --output " + P("y.f32") + " --codes " + P("c.bin") + " --stats " + P("s.json");
  for (const std::string& args : {"quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --device " + dev + out,
                                 "bench quantize --elements 4096 --cols 64 --repeat 1 --device " + dev}) {
    const CmdResult r = exmy(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.err.rfind("exmy: error: --device " + dev + ": " + why, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir / "y.f32"));
  EXPECT_FALSE(fs::exists(dir / "c.bin"));
  EXPECT_FALSE(fs::exists(dir / "s.json"));
}

// An error after a file of the same name existed keeps the old file.
TEST_F(CliTest, FailedRunKeepsExistingOutput) {
  write_f32(dir / "x.f32", std::vector<uint32_t>(32, 0x3f800000u));
  std::ofstream(dir / "y.f32") << "previous result";
  const CmdResult r = exmy("quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --no-saturate --tensor-amax 1e-6 --output " +
                     P("y.f32"));
  EXPECT_NE(r.status, 0);
  std::ifstream f(dir / "y.f32");
  std::string s;
  std::getline(f, s);
  EXPECT_EQ(s, "previous result");
}

// What stands at an output path is never replaced: a symbolic link is
// written through (atomically, at its target), a FIFO or character device
// straight through, '-' to standard output; a directory or socket is a
// one-line error that leaves it as it was.
TEST_F(CliTest, OutputsNeverReplaceWhatIsAtThePath) {
  write_f32(dir / "x.f32", std::vector<uint32_t>(32, 0x3f800000u));  // 1.0: e2m1 code 0x2
  const std::string base = "quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --output " + P("y.f32");
  ASSERT_EQ(exmy(base + " --codes " + P("want.bin")).status, 0);
  const auto want = slurp(dir / "want.bin");
  ASSERT_EQ(want.size(), 32u);

  // A symbolic link (relative, through a second link): the target gets the
  // codes, both links stay links.
  fs::create_directories(dir / "real");
  std::ofstream(dir / "real" / "codes.bin") << "old";
  fs::create_symlink("real/codes.bin", dir / "link1");
  fs::create_symlink("link1", dir / "link2");
  ASSERT_EQ(exmy(base + " --codes " + P("link2")).status, 0);
  EXPECT_TRUE(fs::is_symlink(dir / "link1"));
  EXPECT_TRUE(fs::is_symlink(dir / "link2"));
  EXPECT_EQ(slurp(dir / "real" / "codes.bin"), want);
  // A dangling link: its target is created, the link stays.
  fs::create_symlink("real/new.bin", dir / "dangling");
  ASSERT_EQ(exmy(base + " --codes " + P("dangling")).status, 0);
  EXPECT_TRUE(fs::is_symlink(dir / "dangling"));
  EXPECT_EQ(slurp(dir / "real" / "new.bin"), want);

  // A FIFO: a reader gets the bytes, the FIFO stays a FIFO.
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0644), 0);
  const std::string got = P("from_fifo.bin");
  const std::string cmd = "cat " + P("fifo") + " > " + got + " & " + std::string(EXMY_BINARY) + " " + base +
                          " --codes " + P("fifo") + " && wait";
  ASSERT_EQ(std::system(("bash -c '" + cmd + "'").c_str()), 0);
  EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  EXPECT_EQ(slurp(got), want);

  // '-': standard output.
  const std::string out = P("stdout.bin");
  ASSERT_EQ(std::system((std::string(EXMY_BINARY) + " " + base + " --codes - > " + out).c_str()), 0);
  EXPECT_EQ(slurp(out), want);

  // Character devices (made here, so a regression replaces only these):
  // a null device stays a device; a full device is a one-line error naming
  // the path, and stays a device.
  if (::mknod(P("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0 &&
      ::mknod(P("full").c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) {
    EXPECT_EQ(exmy(base + " --codes " + P("null")).status, 0);
    EXPECT_TRUE(fs::is_character_file(dir / "null"));
    const CmdResult r = exmy(base + " --codes " + P("full"));
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(P("full")), std::string::npos) << r.err;
    EXPECT_TRUE(fs::is_character_file(dir / "full"));
  } else {
    std::printf("(no mknod here: the character-device cases were not run)\n");
  }

  // A directory: a one-line error, the directory and its file kept, and
  // no other output written.
  fs::create_directories(dir / "adir");
  std::ofstream(dir / "adir" / "keep") << "keep";
  fs::remove(dir / "y.f32");
  const CmdResult r = exmy(base + " --codes " + P("adir"));
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("directory"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "adir"));
  EXPECT_TRUE(fs::exists(dir / "adir" / "keep"));
  EXPECT_FALSE(fs::exists(dir / "y.f32"));
}

// A thread count far above the machine is a one-line error, not a crash
// of the OpenMP runtime.
TEST_F(CliTest, AbsurdThreadCountsAndSizesAreErrors) {
  write_f32(dir / "x.f32", std::vector<uint32_t>(32, 0x3f800000u));
  for (const char* t : {"100000", "-3"}) {
    const CmdResult r = exmy("quantize --input " + P("x.f32") + " --shape 4,8 --elem e2m1 --threads " + t +
                             " --output " + P("y.f32"));
    EXPECT_EQ(r.status, 1) << t;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  }
  const CmdResult b = exmy("bench quantize --threads 100000");
  EXPECT_EQ(b.status, 1);
  EXPECT_NE(b.err.find("--threads"), std::string::npos) << b.err;
  // non-positive sizes and counts (--cols 0 once divided by zero)
  for (const std::string bad : {"--cols 0", "--cols -4", "--repeat 0", "--repeat -2"}) {
    const CmdResult r = exmy("bench quantize --elements 4096 " + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.err;
  }
  // A tensor larger than any machine's memory: refused before allocating.
  const CmdResult m = exmy("bench quantize --elements 4000000000000000");
  EXPECT_EQ(m.status, 1);
  EXPECT_EQ(std::count(m.err.begin(), m.err.end(), '\n'), 1) << m.err;
  EXPECT_NE(m.err.find("needs about"), std::string::npos) << m.err;
}

// `exmy formats` prints "-" for values a format does not have: ue0m1 has
// no normal numbers (its one non-zero code is subnormal), ue1m0 no
// subnormal values; the table never shows a min normal above the max.
TEST(Cli, FormatsTableHasNoImpossibleRows) {
  FILE* p = ::popen((std::string(EXMY_BINARY) + " formats ue0m1 ue1m0 e2m1 e0m3").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::map<std::string, std::vector<std::string>> rows;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    if (!f.empty()) rows[f[0]] = f;
  }
  ASSERT_EQ(::pclose(p), 0);
  // columns: format bits E M bias sign subn max min-normal min-subnorm ...
  ASSERT_EQ(rows.count("ue0m1"), 1u);
  EXPECT_EQ(rows["ue0m1"][7], "1");
  EXPECT_EQ(rows["ue0m1"][8], "-");
  EXPECT_EQ(rows["ue0m1"][9], "1");
  EXPECT_EQ(rows["e0m3"][8], "-");
  EXPECT_EQ(rows["e0m3"][9], "0.25");
  EXPECT_EQ(rows["ue1m0"][8], "2");
  EXPECT_EQ(rows["ue1m0"][9], "-");
  EXPECT_EQ(rows["e2m1"][7], "6");
  EXPECT_EQ(rows["e2m1"][8], "1");
  EXPECT_EQ(rows["e2m1"][9], "0.5");
  // The bare table lists the three UE5M3 encodings.
  FILE* q = ::popen((std::string(EXMY_BINARY) + " formats").c_str(), "r");
  ASSERT_NE(q, nullptr);
  std::map<std::string, std::string> max_of;
  while (std::fgets(line, sizeof line, q)) {
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    if (f.size() > 7) max_of[f[0]] = f[7];
  }
  ASSERT_EQ(::pclose(q), 0);
  EXPECT_EQ(max_of["ue5m3"], "61440");
  EXPECT_EQ(max_of["ue5m3-fn"], "114688");
  EXPECT_EQ(max_of["ue5m3-nonan"], "122880");
}

TEST(Cli, HelpAndFormats) {
  EXPECT_EQ(exmy("--help").status, 0);
  EXPECT_EQ(exmy("quantize --help").status, 0);
  EXPECT_EQ(exmy("formats").status, 0);
  EXPECT_EQ(exmy("formats e2m1 ue5m3 e4m3:nonegzero,nans=0").status, 0);
  const CmdResult r = exmy("formats e2m1 e77m1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("e77m1"), std::string::npos);
  EXPECT_NE(exmy("nonsense").status, 0);
}


// `exmy bench quantize` on a small tensor: every row is printed with a
// throughput and a ratio; an unknown benchmark is a one-line error.
TEST_F(CliTest, BenchQuantizeSmallRun) {
  std::string text;
  ASSERT_TRUE(exmy_output("bench quantize --elements 65536 --cols 1024 --repeat 1 --threads 2", text)) << text;
  for (const char* row : {"float32 copy", "memory floor, 1 pass", "memory floor, 2 passes", "e2m1/ue5m3 1x16 rne exact",
                          "e2m1/ue5m3 1x16 exact, held", "e2m1/e4m3 16x16 rne fp32", "e2m1/e4m3 1x16 fp32 (NVFP4)",
                          "e2m1/ue8m0 1x32 mx-floor",
                          "e2m1/ue5m3 1x16 sr-fast8"}) {
    const size_t at = text.find(std::string(row) + " ");
    ASSERT_NE(at, std::string::npos) << row << "\n" << text;
    const std::string line = text.substr(at, text.find('\n', at) - at);
    // two throughputs and two ratios
    size_t me = 0, count = 0;
    while ((me = line.find(" Me/s", me + 1)) != std::string::npos) ++count;
    EXPECT_EQ(count, 2u) << line;
  }
  // The quantize rows' ratios of their floor: the row's ratio (to the copy
  // timed with it) over the ratio of the floor that applies, two passes for
  // a current tensor amax and one for the rest, at each thread count.
  auto ratios = [&](const std::string& row) {
    const size_t at = text.find(row + " ");
    const std::string line = text.substr(at, text.find('\n', at) - at);
    std::istringstream in(line.substr(row.size()));
    std::vector<double> v(6, -1.0);
    std::string unit;
    in >> v[0] >> unit >> v[1] >> v[2] >> unit >> v[3] >> v[4] >> v[5];  // rate, ratio, rate, ratio, floor ratios
    std::string which;
    std::getline(in, which);
    return std::make_pair(v, which);
  };
  const auto one_pass = ratios("memory floor, 1 pass"), two_passes = ratios("memory floor, 2 passes");
  for (const char* row : {"e2m1/ue5m3 1x16 rne exact", "e2m1/ue5m3 1x16 exact, held", "e2m1/e4m3 16x16 rne fp32",
                          "e2m1/e4m3 1x16 fp32 (NVFP4)", "e2m1/ue8m0 1x32 mx-floor", "e2m1/ue5m3 1x16 sr-fast8"}) {
    const auto [v, which] = ratios(row);
    const bool held_or_mx = std::string(row).find("held") != std::string::npos ||
                            std::string(row).find("mx-floor") != std::string::npos;
    EXPECT_EQ(which, held_or_mx ? " (1 pass)" : " (2 passes)") << row;
    const std::vector<double>& f = held_or_mx ? one_pass.first : two_passes.first;
    for (int k = 0; k < 2; ++k) {
      // (each printed to two decimals)
      const double r = v[1 + 2 * k], fr = f[1 + 2 * k];
      EXPECT_GE(v[4 + k], (r - 0.005) / (fr + 0.005) - 0.005) << row;
      EXPECT_LE(v[4 + k], (r + 0.005) / (fr - 0.005) + 0.005) << row;
    }
  }
  const CmdResult bad = exmy("bench nonsense");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("unknown benchmark 'nonsense'"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

// `--rows TEXT` times only the configurations whose name contains TEXT
// (with the copy and the floors); TEXT that names none is a one-line error.
TEST_F(CliTest, BenchQuantizeRowsFilter) {
  std::string text;
  ASSERT_TRUE(exmy_output("bench quantize --elements 65536 --cols 1024 --repeat 1 --threads 1 --rows sr-fast8", text))
      << text;
  EXPECT_NE(text.find("e2m1/ue5m3 1x16 sr-fast8 "), std::string::npos) << text;
  EXPECT_NE(text.find("memory floor, 2 passes "), std::string::npos) << text;
  EXPECT_EQ(text.find("mx-floor"), std::string::npos) << text;
  EXPECT_EQ(text.find("rne exact"), std::string::npos) << text;
  const CmdResult none = exmy("bench quantize --elements 65536 --cols 1024 --rows e9m9");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("--rows 'e9m9'"), std::string::npos) << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1) << none.err;
}

}  // namespace
