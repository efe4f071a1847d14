#include "models/safetensors.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/linear.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace exmy::models {
namespace {

int dtype_bytes(const std::string& d) {
  if (d == "F32" || d == "I32") return 4;
  if (d == "F64" || d == "I64") return 8;
  if (d == "BF16" || d == "F16") return 2;
  return 0;
}

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "F64" || d == "BF16" || d == "F16"; }

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ffu;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(man | 0x400u), exp - 25);
  return sign ? -v : v;
}

template <class U>
U load(const uint8_t* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open safetensors file '" + path + "'");
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) throw Error(path + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  if (hlen > size - 8) throw Error(path + ": corrupt safetensors header length " + std::to_string(hlen));
  std::string header(static_cast<size_t>(hlen), '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  data_.resize(static_cast<size_t>(size - 8 - hlen));
  in.read(reinterpret_cast<char*>(data_.data()), static_cast<std::streamsize>(data_.size()));
  if (!in) throw Error(path + ": read error");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception&) {
    throw Error(path + ": corrupt safetensors header (not JSON)");
  }
  if (!j.is_object()) throw Error(path + ": corrupt safetensors header (not a JSON object)");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_object())
        for (auto m = it->begin(); m != it->end(); ++m)
          metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      continue;
    }
    const auto& e = *it;
    StTensorInfo t;
    t.name = it.key();
    try {
      t.dtype = e.at("dtype").get<std::string>();
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2) throw Error("");
      t.begin = off[0];
      t.end = off[1];
    } catch (const std::exception&) {
      throw Error(path + ": malformed header entry for tensor '" + t.name + "'");
    }
    const int eb = dtype_bytes(t.dtype);
    if (eb == 0) throw Error(path + ": tensor '" + t.name + "' has unsupported dtype " + t.dtype +
                             " (expected F32, BF16, F16, F64, I32 or I64)");
    for (int64_t d : t.shape)
      if (d < 0) throw Error(path + ": tensor '" + t.name + "' has a negative dimension");
    if (t.end < t.begin || t.end > data_.size() || t.end - t.begin != static_cast<uint64_t>(t.numel() * eb))
      throw Error(path + ": tensor '" + t.name + "' has data offsets that do not match its shape or the file size");
    tensors_.push_back(std::move(t));
  }
}

const StTensorInfo* SafetensorsReader::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const StTensorInfo& SafetensorsReader::get(std::string_view name) const {
  const StTensorInfo* t = find(name);
  if (!t) throw Error(path_ + ": no tensor named '" + std::string(name) + "'");
  return *t;
}

template <class T>
void SafetensorsReader::read(const StTensorInfo& t, T* out) const {
  const uint8_t* p = data_.data() + t.begin;
  const int64_t n = t.numel();
  if constexpr (std::is_floating_point_v<T>) {
    if (!is_float_dtype(t.dtype))
      throw Error(path_ + ": tensor '" + t.name + "' is " + t.dtype + " (expected a floating dtype)");
    for (int64_t i = 0; i < n; ++i) {
      if (t.dtype == "F32") out[i] = static_cast<T>(load<float>(p + 4 * i));
      else if (t.dtype == "F64") out[i] = static_cast<T>(load<double>(p + 8 * i));
      else if (t.dtype == "BF16") out[i] = static_cast<T>(std::bit_cast<float>(uint32_t{load<uint16_t>(p + 2 * i)} << 16));
      else out[i] = static_cast<T>(half_to_float(load<uint16_t>(p + 2 * i)));
    }
  } else {
    if (is_float_dtype(t.dtype))
      throw Error(path_ + ": tensor '" + t.name + "' is " + t.dtype + " (expected an integer dtype)");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = t.dtype == "I32" ? load<int32_t>(p + 4 * i) : load<int64_t>(p + 8 * i);
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
        throw Error(path_ + ": tensor '" + t.name + "' has a value that does not fit");
      out[i] = static_cast<T>(v);
    }
  }
}

template <class T>
std::vector<T> SafetensorsReader::read(std::string_view name) const {
  const StTensorInfo& t = get(name);
  std::vector<T> v(static_cast<size_t>(t.numel()));
  read(t, v.data());
  return v;
}

template void SafetensorsReader::read<float>(const StTensorInfo&, float*) const;
template void SafetensorsReader::read<double>(const StTensorInfo&, double*) const;
template void SafetensorsReader::read<int32_t>(const StTensorInfo&, int32_t*) const;
template void SafetensorsReader::read<int64_t>(const StTensorInfo&, int64_t*) const;
template std::vector<float> SafetensorsReader::read<float>(std::string_view) const;
template std::vector<double> SafetensorsReader::read<double>(std::string_view) const;
template std::vector<int32_t> SafetensorsReader::read<int32_t>(std::string_view) const;
template std::vector<int64_t> SafetensorsReader::read<int64_t>(std::string_view) const;

void write_safetensors(const std::string& path, const std::vector<StSource>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    const int sources = (t.f32 != nullptr) + (t.f64 != nullptr) + (t.i32 != nullptr) + (t.i64 != nullptr);
    if (sources != 1) throw Error("safetensors: tensor '" + t.name + "' needs exactly one source");
    const bool fsrc = t.f32 || t.f64;
    const int eb = dtype_bytes(t.dtype);
    if (eb == 0 || t.dtype == "F16" || fsrc != is_float_dtype(t.dtype))
      throw Error("safetensors: cannot write tensor '" + t.name + "' as " + t.dtype);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + static_cast<uint64_t>(n * eb)}}};
    off += static_cast<uint64_t>(n * eb);
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  io::write_file_atomic(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + tmp + "'");
    const uint64_t hlen = header.size();
    out.write(reinterpret_cast<const char*>(&hlen), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::vector<uint8_t> buf;
    for (const auto& t : tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      buf.resize(static_cast<size_t>(n * dtype_bytes(t.dtype)));
      uint8_t* p = buf.data();
      for (int64_t i = 0; i < n; ++i) {
        if (t.dtype == "I32") {
          const int64_t v = t.i32 ? t.i32[i] : t.i64[i];
          if (v < INT32_MIN || v > INT32_MAX) throw Error("safetensors: tensor '" + t.name + "' does not fit I32");
          const int32_t w = static_cast<int32_t>(v);
          std::memcpy(p + 4 * i, &w, 4);
        } else if (t.dtype == "I64") {
          const int64_t v = t.i32 ? t.i32[i] : t.i64[i];
          std::memcpy(p + 8 * i, &v, 8);
        } else {
          const double v = t.f32 ? static_cast<double>(t.f32[i]) : t.f64[i];
          if (t.dtype == "F64") {
            std::memcpy(p + 8 * i, &v, 8);
          } else if (t.dtype == "F32") {
            const float f = static_cast<float>(v);
            std::memcpy(p + 4 * i, &f, 4);
          } else {  // BF16, rounded from the source value directly
            const float f = t.f32 ? sim::round_bf16(t.f32[i]) : static_cast<float>(sim::round_bf16(t.f64[i]));
            const uint16_t b = static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
            std::memcpy(p + 2 * i, &b, 2);
          }
        }
      }
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    out.close();
    if (!out) throw Error("write error on '" + tmp + "' (disk full?)");
  });
}

}  // namespace exmy::models
