// Every case of the public reference vectors (tests/reference/quantize.jsonl)
// reproduced exactly by the scalar reference and by the threaded path with 1
// and 2 threads: values as float32 bit patterns, element codes, scale codes,
// and every statistic.
#include "tests/formats/vectors.hpp"

namespace exmy {
namespace {

using vectors::Case;
using vectors::cases;
using vectors::check_case;

TEST(Vectors, AllCasesLoaded) {
  ASSERT_EQ(cases().size(), 306u);
  // The vectors are not vacuous: they hold non-zero inputs and outputs.
  size_t nonzero = 0;
  for (const auto& c : cases())
    for (float v : c.input) nonzero += v != 0.0f;
  EXPECT_GT(nonzero, 10000u);
}

TEST(Vectors, Reference) {
  for (const auto& c : cases())
    check_case(c, [&](const QuantOutput& o) { quantize_ref(c.spec, c.input.data(), c.rows, c.cols, o); }, "ref");
}

TEST(Vectors, Threaded1) {
  for (const auto& c : cases())
    check_case(c, [&](const QuantOutput& o) { quantize(c.spec, c.input.data(), c.rows, c.cols, o, 1); }, "fast/1");
}

TEST(Vectors, Threaded2) {
  for (const auto& c : cases())
    check_case(c, [&](const QuantOutput& o) { quantize(c.spec, c.input.data(), c.rows, c.cols, o, 2); }, "fast/2");
}

// Packing round trip: the packed payload and scales decode to the same values.
TEST(Vectors, PackedRoundTrip) {
  for (const auto& c : cases()) {
    const PackedTensor p = quantize_packed(c.spec, c.input.data(), c.rows, c.cols, 2);
    if (c.spec.elem.bits <= 4) {
      EXPECT_EQ(static_cast<int64_t>(p.payload.size()), (c.rows * c.cols + 1) / 2);
    }
    const std::vector<float> v = p.dequantize();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bits_of(v[i]), c.values[i]) << "case " << c.id << " element " << i;
  }
}

}  // namespace
}  // namespace exmy
