// `exmy formats [SPEC...]`: range facts of formats.
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

std::string num(double v) {
  char buf[64];
  const double l = std::log2(v);
  if (v != 0 && l == std::floor(l) && (l > 16 || l < -4)) std::snprintf(buf, sizeof buf, "2^%d", static_cast<int>(l));
  else std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string hex(uint32_t c, int bits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", (bits + 3) / 4, c);
  return buf;
}

}  // namespace

int cmd_formats(const Args& args) {
  po::options_description desc(
      "exmy formats: range facts of format presets or of the given specs\n\n"
      "usage: exmy formats [SPEC...]\n\noptions");
  desc.add_options()("help,h", "show this help")("spec", po::value<std::vector<std::string>>(), "format specs");
  po::positional_options_description pos;
  pos.add("spec", -1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  std::vector<std::string> specs = vm.count("spec") ? vm["spec"].as<std::vector<std::string>>() : preset_names();
  std::vector<Format> fmts;
  for (const auto& s : specs) fmts.push_back(parse_format(s));
  std::printf("%-22s %4s %3s %3s %5s %4s %5s %12s %12s %12s %7s %-13s %s\n", "format", "bits", "E", "M", "bias", "sign",
              "subn", "max", "min normal", "min subnorm", "binades", "inf codes", "nan codes");
  for (size_t i = 0; i < fmts.size(); ++i) {
    const Format& f = fmts[i];
    const std::string infs = f.has_inf ? hex(f.inf_mag(), f.bits) + (f.is_signed ? "," + hex(f.inf_mag() | f.sign_bit, f.bits) : "") : "-";
    std::string nans = "-";
    if (f.nans > 0) {
      const uint32_t lo = f.mag_count - static_cast<uint32_t>(f.nans), hi = f.mag_count - 1;
      nans = (lo == hi ? hex(lo, f.bits) : hex(lo, f.bits) + ".." + hex(hi, f.bits));
      if (f.is_signed) nans += " (and with sign)";
    }
    if (f.is_signed && !f.negzero) nans = (nans == "-" ? "" : nans + ", ") + hex(f.sign_bit, f.bits) + " (-0)";
    // With subnormals, codes below 2^M are subnormal (non-zero ones exist
    // only when M > 0) and normal values exist only when some code reaches
    // 2^M (ue0m1 has none); without subnormals every non-zero code is normal.
    const bool normals = !f.subnormals || f.max_mag >= (1u << f.M);
    const bool subnormal_values = f.subnormals && f.M > 0;
    const std::string subn = subnormal_values ? num(f.min_pos) : "-";
    const std::string min_normal = !normals ? "-" : num(f.subnormals ? f.min_normal : f.min_pos);
    const int binades = f.max_exp - ilog2(f.min_pos) + 1;
    std::printf("%-22s %4d %3d %3d %5d %4s %5s %12s %12s %12s %7d %-13s %s\n", format_name(f).c_str(), f.bits, f.E, f.M,
                f.bias, f.is_signed ? "yes" : "no", f.subnormals ? "yes" : "no", num(f.max).c_str(),
                min_normal.c_str(), subn.c_str(), binades, infs.c_str(), nans.c_str());
  }
  return 0;
}

}  // namespace exmy::cli
