#include "formats/pack.hpp"

#include <algorithm>
#include <limits>

#include "formats/error.hpp"

namespace exmy {

void store_code(void* base, int bytes, int64_t i, uint32_t code) {
  if (!base) return;
  auto* p = static_cast<uint8_t*>(base);
  switch (bytes) {
    case 1: p[i] = static_cast<uint8_t>(code); break;
    case 2: p[2 * i] = static_cast<uint8_t>(code); p[2 * i + 1] = static_cast<uint8_t>(code >> 8); break;
    default:
      for (int k = 0; k < 4; ++k) p[4 * i + k] = static_cast<uint8_t>(code >> (8 * k));
  }
}

uint32_t load_code(const void* codes, int bytes, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(codes);
  switch (bytes) {
    case 1: return p[i];
    case 2: return static_cast<uint32_t>(p[2 * i]) | (static_cast<uint32_t>(p[2 * i + 1]) << 8);
    default: {
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(p[4 * i + k]) << (8 * k);
      return v;
    }
  }
}

int64_t packed_bytes(const Format& f, int64_t n) {
  if (f.bits <= 4) return (n + 1) / 2;
  return n * f.code_bytes();
}

std::vector<uint8_t> pack_codes(const Format& f, const void* codes, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(packed_bytes(f, n)), 0);
  if (f.bits <= 4) {
    const auto* c = static_cast<const uint8_t*>(codes);
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>((c[i] & 0xf) << (4 * (i & 1)));
  } else {
    const auto* c = static_cast<const uint8_t*>(codes);
    std::copy(c, c + out.size(), out.begin());
  }
  return out;
}

void unpack_codes(const Format& f, const uint8_t* packed, int64_t n, void* codes) {
  auto* c = static_cast<uint8_t*>(codes);
  if (f.bits <= 4) {
    for (int64_t i = 0; i < n; ++i) c[i] = (packed[i / 2] >> (4 * (i & 1))) & 0xf;
  } else {
    std::copy(packed, packed + n * f.code_bytes(), c);
  }
}

std::vector<float> PackedTensor::dequantize() const {
  const int64_t n = rows * cols;
  std::vector<float> out(static_cast<size_t>(n));
  const int cb = plan.fe.code_bytes();
  std::vector<uint8_t> codes(static_cast<size_t>(n * cb));
  unpack_codes(plan.fe, payload.data(), n, codes.data());
  if (!plan.has_scale) {
    const BlockConsts c{1.0, 0.0f};
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = dequant(plan, c, load_code(codes.data(), cb, i));
    return out;
  }
  const int64_t gr = (rows + plan.br - 1) / plan.br, gc = (cols + plan.bc - 1) / plan.bc;
  const int sb = plan.fs.code_bytes();
  std::vector<uint8_t> sc(static_cast<size_t>(gr * gc * sb));
  unpack_codes(plan.fs, scales.data(), gr * gc, sc.data());
  for (int64_t bi = 0; bi < gr; ++bi)
    for (int64_t bj = 0; bj < gc; ++bj) {
      const uint32_t scode = load_code(sc.data(), sb, bi * gc + bj);
      const double s = plan.fs.decode(scode);
      const bool nan_block = plan.fs.classify(scode) == CodeClass::nan;
      const BlockConsts c = block_consts(plan, s);
      for (int64_t r = bi * plan.br; r < std::min(rows, (bi + 1) * plan.br); ++r)
        for (int64_t cc = bj * plan.bc; cc < std::min(cols, (bj + 1) * plan.bc); ++cc) {
          const int64_t i = r * cols + cc;
          const uint32_t code = load_code(codes.data(), cb, i);
          float v;
          // a NaN block shows as a NaN scale code, or, where Fs has none, as
          // NaN element codes
          if (nan_block || plan.fe.classify(code) == CodeClass::nan) v = std::numeric_limits<float>::quiet_NaN();
          else if (s == 0.0) v = (code & plan.fe.sign_bit) ? -0.0f : 0.0f;
          else v = dequant(plan, c, code);
          out[static_cast<size_t>(i)] = v;
        }
    }
  return out;
}

PackedTensor quantize_packed(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, int threads) {
  PackedTensor t;
  t.plan = spec.plan();
  t.rows = rows;
  t.cols = cols;
  const int64_t n = rows * cols;
  std::vector<uint8_t> codes(static_cast<size_t>(n * t.plan.fe.code_bytes()));
  const int64_t nb = block_count(spec, rows, cols);
  std::vector<uint8_t> scodes(static_cast<size_t>(nb * (t.plan.has_scale ? t.plan.fs.code_bytes() : 1)));
  QuantOutput out;
  out.codes = codes.data();
  out.scale_codes = scodes.data();
  const QuantInfo info = quantize(spec, x, rows, cols, out, threads);
  set_tensor_amax(t.plan, info.amax);
  t.payload = pack_codes(t.plan.fe, codes.data(), n);
  if (t.plan.has_scale) t.scales = pack_codes(t.plan.fs, scodes.data(), nb);
  return t;
}

}  // namespace exmy
