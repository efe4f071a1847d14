// FP32 products on BF16 tensor cores within an FP32 budget: each float32
// operand as three bfloat16 pieces, the products of the pieces as BF16
// GEMMs with FP32 accumulation (docs/architecture.md, "Attention on tensor
// cores").
//
// Pieces. p0 = RN_bf16(x), p1 = RN_bf16(x - p0), p2 = RN_bf16(x - p0 - p1)
// (sim::bf16_bits: round to nearest, ties to even). Each subtraction is
// exact (a piece and the rest it rounds lie within a factor 2, Sterbenz),
// x - p0 has at most 16 significant bits and x - p0 - p1 at most 8, so
// x = p0 + p1 + p2 exactly when x's last bit is at or above 2^-133 (bf16's
// smallest subnormal): |x| >= 2^-110, or x = 0. Below that the last piece
// rounds: at most 2^-134 lost. |p1| <= 2^-8 (1 + 2^-8) |x|, |p2| <= 2^-16 |x|
// (but within half a bfloat16 ulp of FLT_MAX, where p0 is x truncated).
// An infinite or NaN x is its first piece, the others +0, so that the
// products give FP32's Inf and NaN.
//
// Products. A product of two split operands keeps the pairs (i, j) with
// i + j <= 2: the dropped three (p1 q2, p2 q1, p2 q2) are at most
// 2.01 x 2^-24 |x y|, about twice the rounding of the product itself in
// FP32. An operand known to hold bfloat16 values (a `bf16` policy's q, k,
// v: Bf16Operands) is its one piece, exactly, and keeps every pair with
// the other's three: one, three or six BF16 products in place of one FP32
// product, at a fifteenth of the cost each on an H200 (773 against 50.7
// TFLOP/s, docs/benchmarks.md). The pairs, smallest first, run as one
// batched BF16 GEMM each into C (the first overwriting C unless
// accumulating), or as one GEMM over the pairs' copies concatenated along
// K (SplitGemm: whichever moves fewer bytes).
//
// The error bound of the result (tests/models/run_error.hpp,
// RunErrSplitGemm, which the tests hold the device and the emulation to)
// counts the dropped pairs, the lost subnormal bits and each pair's sum and
// addition into C: with tensor cores, an FP32 accumulation that truncates
// (unit 2^-23 per addition) over K terms aligned in groups; on the host
// (HostBf16Gemm, the emulation) one double sum per output rounded once.
#pragma once

#include <cstdint>
#include <string>

#include "formats/error.hpp"
#include "sim/bf16.hpp"
#include "sim/gemm.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Which operands of a product hold bfloat16 values (so one piece each), and
// whether A is the previous product's A, unchanged (its pieces may be kept).
struct Bf16Operands {
  bool a = false, b = false, a_again = false;
};

// gemm.hinted(h, args...) where the functor takes the hint (SplitGemm and
// its error bound), else gemm(args...).
template <class G, class... Args>
void gemm_hinted(const G& gemm, Bf16Operands h, Args&&... args) {
  if constexpr (requires { gemm.hinted(h, args...); }) gemm.hinted(h, static_cast<Args&&>(args)...);
  else gemm(static_cast<Args&&>(args)...);
}

inline constexpr int kBf16Pieces = 3;

// The pieces of x (pieces 1 or 3): out[0], out[stride], ...
EXMY_HD void bf16_pieces(float x, int pieces, uint16_t* out, int64_t stride) {
  float rest = x;
  for (int i = 0; i < pieces; ++i) {
    uint16_t p = sim::bf16_bits(rest);
    // within half a bfloat16 ulp of FLT_MAX the rounding would be Inf: the
    // truncation instead (the rest then up to 2^-7 |x|, still exact)
    if ((p & 0x7fffu) == 0x7f80u && (bits_of(rest) & 0x7fffffffu) < 0x7f800000u)
      p = static_cast<uint16_t>(bits_of(rest) >> 16);
    out[i * stride] = p;
    rest -= sim::bf16_value(p);
    if ((bits_of(rest) & 0x7fffffffu) > 0x7f800000u) rest = 0;  // x Inf (Inf - Inf) or NaN: the first piece carries it
  }
}

// The pairs of pieces a product keeps, smallest first: pair i of
// split_pairs(pa, pb) is (first, second) pieces of A and B; at most
// kMaxSplitPairs (two operands in three pieces each).
inline constexpr int kMaxSplitPairs = 6;
struct SplitPairs {
  int n = 0;
  int a[kMaxSplitPairs] = {}, b[kMaxSplitPairs] = {};
};
EXMY_HD SplitPairs split_pairs(int pa, int pb) {
  SplitPairs p;
  for (int s = 2; s >= 0; --s)
    for (int i = s; i >= 0; --i)
      if (i < pa && s - i < pb) p.a[p.n] = i, p.b[p.n] = s - i, ++p.n;
  return p;
}

// uint16 elements a piece matrix takes: a multiple of 128 (256 bytes, the
// alignment cuBLASLt's best algorithms ask for); and a row of `cols`
// pieces: a multiple of 8 (16 bytes, the tensor-core kernels' alignment).
inline int64_t piece_pad(int64_t n) { return (n + 127) / 128 * 128; }
EXMY_HD int64_t piece_ld(int64_t cols) { return (cols + 7) / 8 * 8; }

// uint16 elements of the pieces of one batched product, count entries of
// A and B stored (rows x cols): each operand split in `pieces`, a matrix a
// piece (the products a pair at a time); or one copy a pair concatenated
// along K (`pairs`, the pairs as one product; k_cols: K along the stored
// columns).
inline int64_t split_gemm_scratch(int64_t count, int64_t a_rows, int64_t a_cols, int64_t b_rows, int64_t b_cols,
                                  int pieces = kBf16Pieces) {
  return count * pieces * (piece_pad(a_rows * piece_ld(a_cols)) + piece_pad(b_rows * piece_ld(b_cols)));
}
inline int64_t split_concat_elems(int64_t rows, int64_t cols, bool k_cols, int pairs) {
  return piece_pad(k_cols ? rows * piece_ld(pairs * cols) : pairs * rows * piece_ld(cols));
}

// uint16 elements one entry of a product on pieces may take, whichever way
// SplitGemm goes (a pair at a time, or the pairs concatenated along K on
// either side): A stored ra x ca in pa pieces, B rb x cb in pb.
inline int64_t split_entry_elems(int64_t ra, int64_t ca, int pa, int64_t rb, int64_t cb, int pb) {
  const int np = split_pairs(pa, pb).n;
  const int64_t by_pair = pa * piece_pad(ra * piece_ld(ca)) + pb * piece_pad(rb * piece_ld(cb));
  const auto concat = [np](int64_t r, int64_t c) {
    const int64_t k_cols = split_concat_elems(r, c, true, np), k_rows = split_concat_elems(r, c, false, np);
    return k_cols > k_rows ? k_cols : k_rows;
  };
  const int64_t cat = np > 1 ? concat(ra, ca) + concat(rb, cb) : 0;
  return by_pair > cat ? by_pair : cat;
}

// Entry t's pieces (P of them) of X (rows x cols, row stride ld; entry t at
// X + t sx): piece i at out + (t P + i) n, rows piece_ld(cols) apart. A
// thread per element.
template <class L>
void split_launches(const L& launch, const char* name, uint16_t* out, const float* X, int64_t sx, int64_t ld,
                    int64_t rows, int64_t cols, int64_t count, int P, int64_t n) {
  const int64_t per = rows * cols, ldo = piece_ld(cols);
  launch(name, count * per, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t t = u / per, e = u % per, r = e / cols, c = e % cols;
    bf16_pieces(X[t * sx + r * ld + c], P, out + t * P * n + r * ldo + c, n);
  });
}

// The pairs' copies of X concatenated along K: entry t at out + t n, block
// p (of pairs.n) piece idx[p] of X; K along X's columns (k_cols: X' is
// rows x (pairs cols), block p its columns [p cols, (p + 1) cols)) or
// along its rows (X' is (pairs rows) x cols); X's rows piece_ld apart. A
// thread per element of X.
template <class L>
void split_concat_launches(const L& launch, const char* name, uint16_t* out, const float* X, int64_t sx, int64_t ld,
                           int64_t rows, int64_t cols, int64_t count, bool k_cols, SplitPairs pairs, bool use_a,
                           int pieces, int64_t n) {
  const int64_t per = rows * cols, ldo = piece_ld(k_cols ? pairs.n * cols : cols);
  launch(name, count * per, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t t = u / per, e = u % per, r = e / cols, c = e % cols;
    uint16_t piece[kBf16Pieces];
    bf16_pieces(X[t * sx + r * ld + c], pieces, piece, 1);
    uint16_t* const o = out + t * n;
    for (int p = 0; p < pairs.n; ++p) {
      const uint16_t v = piece[use_a ? pairs.a[p] : pairs.b[p]];
      if (k_cols) o[r * ldo + p * cols + c] = v;
      else o[(p * rows + r) * ldo + c] = v;
    }
  });
}

// A batched FP32 product (LoopGemm's signature) as BF16 products of pieces:
// `launch` splits the operands into `pieces` (capacity uint16 elements),
// `g16` multiplies bfloat16 matrices with an FP32 C (sim::DeviceBatchedGemm
// on a device, HostBf16Gemm on the host), in sim::gemm's row-major shapes.
// Two ways, whichever moves fewer bytes (and fits the scratch): a BF16
// product a pair, each adding into C (for a large operand and a small C:
// each piece written once), or all pairs as one product over npairs x K,
// each operand's pieces copied once a pair in that order (for a large C and
// small operands, as Q K^T: C written once). With the hint a_again (A the
// previous product's A, unchanged), the first way reuses A's pieces where
// the previous product split the same matrix the same way.
template <class L, class G16>
struct SplitGemm {
  L launch;
  G16 g16;
  uint16_t* pieces = nullptr;
  int64_t capacity = 0;
  // A's pieces as the last product left them (the first way), for a_again
  struct LastA {
    const float* X = nullptr;
    int64_t sx = 0, ld = 0, rows = 0, cols = 0, count = 0, n = 0;
    int P = 0;
    bool operator==(const LastA&) const = default;
  };
  mutable LastA last_a{};

  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const float* A, int64_t lda, int64_t sa,
                  sim::Op opA, const float* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const {
    hinted({}, count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate);
  }
  void hinted(Bf16Operands h, int64_t count, float* C, int64_t ldc, int64_t sc, const float* A, int64_t lda,
              int64_t sa, sim::Op opA, const float* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N,
              int64_t K, bool accumulate) const {
    if (count <= 0 || M == 0 || N == 0) return;
    const int pa = h.a ? 1 : kBf16Pieces, pb = h.b ? 1 : kBf16Pieces;
    const SplitPairs pairs = split_pairs(pa, pb);
    // each operand as stored (rows x cols, row-major)
    const int64_t ca = opA == sim::Op::N ? K : M, ra = opA == sim::Op::N ? M : K;
    const int64_t cb = opB == sim::Op::N ? N : K, rb = opB == sim::Op::N ? K : N;
    const int64_t a_el = ra * ca, b_el = rb * cb, c_el = M * N, np = pairs.n;
    // bytes an entry moves each way: pieces written and read, C written (and read)
    const int64_t c_bytes = 4 * c_el;
    const int64_t pair_bytes = 2 * (pa * a_el + pb * b_el) + 2 * np * (a_el + b_el) +
                               c_bytes * (2 * np - (accumulate ? 0 : 1));
    const int64_t concat_bytes = 4 * np * (a_el + b_el) + c_bytes * (accumulate ? 2 : 1);
    const bool a_kcols = opA == sim::Op::N, b_kcols = opB != sim::Op::N;  // K along the stored columns
    const int64_t ca_n = split_concat_elems(ra, ca, a_kcols, np), cb_n = split_concat_elems(rb, cb, b_kcols, np);
    if (np > 1 && concat_bytes < pair_bytes && count * (ca_n + cb_n) <= capacity) {
      uint16_t* const Ap = pieces;
      uint16_t* const Bp = pieces + count * ca_n;
      split_concat_launches(launch, "split_gemm pieces A", Ap, A, sa, lda, ra, ca, count, a_kcols, pairs, true, pa,
                            ca_n);
      split_concat_launches(launch, "split_gemm pieces B", Bp, B, sb, ldb, rb, cb, count, b_kcols, pairs, false, pb,
                            cb_n);
      last_a = {};
      const int64_t lda2 = piece_ld(a_kcols ? np * ca : ca), ldb2 = piece_ld(b_kcols ? np * cb : cb);
      g16(count, C, ldc, sc, static_cast<const uint16_t*>(Ap), lda2, ca_n, opA, static_cast<const uint16_t*>(Bp), ldb2,
          cb_n, opB, M, N, np * K, accumulate);
      return;
    }
    const int64_t lda2 = piece_ld(ca), ldb2 = piece_ld(cb);
    const int64_t na = piece_pad(ra * lda2), nb = piece_pad(rb * ldb2);
    const int64_t need = count * (pa * na + pb * nb);
    if (need > capacity)
      throw Error("split_gemm: pieces need " + std::to_string(need) + " elements of scratch, " +
                  std::to_string(capacity) + " given");
    uint16_t* const Ap = pieces;
    uint16_t* const Bp = pieces + count * pa * na;
    const LastA this_a{A, sa, lda, ra, ca, count, na, pa};
    if (!(h.a_again && last_a == this_a))
      split_launches(launch, "split_gemm pieces A", Ap, A, sa, lda, ra, ca, count, pa, na);
    last_a = this_a;
    split_launches(launch, "split_gemm pieces B", Bp, B, sb, ldb, rb, cb, count, pb, nb);
    bool acc = accumulate;
    for (int p = 0; p < pairs.n; ++p) {
      g16(count, C, ldc, sc, static_cast<const uint16_t*>(Ap + pairs.a[p] * na), lda2, pa * na, opA,
          static_cast<const uint16_t*>(Bp + pairs.b[p] * nb), ldb2, pb * nb, opB, M, N, K, acc);
      acc = true;
    }
  }
};

// Whether a GEMM functor is a SplitGemm (its pieces then need scratch:
// launches that carve their own scratch give it a piece area, with_pieces).
template <class G>
inline constexpr bool kSplitsIntoPieces = false;
template <class L, class G16>
inline constexpr bool kSplitsIntoPieces<SplitGemm<L, G16>> = true;
// A copy of a SplitGemm with its piece area (`capacity` uint16 elements at p).
template <class L, class G16>
SplitGemm<L, G16> with_pieces(const SplitGemm<L, G16>& g, uint16_t* p, int64_t capacity) {
  return {g.launch, g.g16, p, capacity};
}

// The host's BF16 product (the emulation of the device's): per output, the
// products of the bfloat16 values (exact in double) summed in double in k
// order and rounded to float once, then added to C when accumulating.
struct HostBf16Gemm {
  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const uint16_t* A, int64_t lda, int64_t sa,
                  sim::Op opA, const uint16_t* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N,
                  int64_t K, bool accumulate) const {
    for (int64_t t = 0; t < count; ++t)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            const uint16_t a = opA == sim::Op::N ? A[t * sa + i * lda + k] : A[t * sa + k * lda + i];
            const uint16_t b = opB == sim::Op::N ? B[t * sb + k * ldb + j] : B[t * sb + j * ldb + k];
            s += static_cast<double>(sim::bf16_value(a)) * static_cast<double>(sim::bf16_value(b));
          }
          float& c = C[t * sc + i * ldc + j];
          c = accumulate ? c + static_cast<float>(s) : static_cast<float>(s);
        }
  }
};

}  // namespace exmy::models
