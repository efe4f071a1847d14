#include "sim/quant/quantized_linear.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "formats/error.hpp"
#include "sim/gemm.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/grouped_launches.hpp"
#include "sim/quant/stream.hpp"

namespace exmy::sim::quant {

void QuantRuntime::begin(const StepContext& ctx) {
  if (ctx.step < 1) throw Error("optimizer step " + std::to_string(ctx.step) + " (steps count from 1)");
  if (ctx.micro_batch < 0) throw Error("micro-batch " + std::to_string(ctx.micro_batch) + " is negative");
  finish();
  ctx_ = ctx;
}

void QuantRuntime::finish() {
  if (!records_.empty()) {
    try {
      ops_->collect_stats();
    } catch (...) {
      records_.clear();
      throw;
    }
    hand_records();
  }
  ops_->check_deferred();
}

QuantRuntime::Record& QuantRuntime::open_record(const CallKey& key, bool gemm) {
  Record& r = records_.emplace_back();
  r.key = key;
  r.gemm = gemm;
  return r;
}

void QuantRuntime::close_record(Record& r) {
  r.closed = true;
  if (!ops_->defers_stats()) hand_records();
}

void QuantRuntime::hand_records() {
  std::deque<Record> records = std::move(records_);
  records_.clear();
  if (!stats_) return;
  for (Record& r : records) {
    if (!r.closed) continue;  // (a call that threw before its record was complete)
    if (r.gemm) {
      stats_->record_gemm(r.key, r.gemm_stats);
    } else {
      if (r.amax_is_reference) r.operand.amax = r.operand.reference;
      stats_->record_operand(r.key, r.operand);
    }
  }
}

namespace {

// How GEMM g of a linear with these role specs runs: the fp32 model in BF16
// (Fp32Gemm::bf16 and formats bfloat16 holds), and whether an operand has
// row outer scales (its alphas then made on the host's word). The
// quantized linear runs so, and quant_scratch_bytes plans so.
struct GemmPath {
  bool bf16 = false, rows = false;
};
GemmPath gemm_path(const std::array<RoleSpec, kNumRoles>& specs, Gemm g, const GemmModel& model, Fp32Gemm fp32_gemm) {
  const QuantSpec& qa = specs[static_cast<size_t>(gemm_roles(g)[0])].q;
  const QuantSpec& qb = specs[static_cast<size_t>(gemm_roles(g)[1])].q;
  GemmPath p;
  p.bf16 = model.kind == GemmModel::Kind::fp32 && fp32_gemm == Fp32Gemm::bf16 && bf16_holds_encoded(qa) &&
           bf16_holds_encoded(qb);
  p.rows = qa.outer == OuterScale::row || qb.outer == OuterScale::row;
  return p;
}

// What sample_rows takes for the GEMM statistics of an M-row output: the
// rows compared, min(gemm_stats_rows, ceil(M / gemm_stats_sample)), or 0
// (all) when gemm_stats_rows is 0.
int64_t compared_rows_request(const RuntimeOptions& opt, int64_t M) {
  const int64_t cap = opt.gemm_stats_rows, every = std::max<int64_t>(1, opt.gemm_stats_sample);
  return cap == 0 ? 0 : std::min(cap, (M + every - 1) / every);
}

// Marks the shared scratch as in use for one call.
struct ScratchGuard {
  QuantRuntime::Scratch& s;
  explicit ScratchGuard(QuantRuntime::Scratch& sc) : s(sc) {
    if (s.busy) throw std::logic_error("quantized linears of one QuantRuntime were called concurrently");
    s.busy = true;
  }
  ~ScratchGuard() { s.busy = false; }
};

}  // namespace

QuantizedLinear::QuantizedLinear(const LinearInfo& info, const std::array<RoleSpec, kNumRoles>& specs,
                                 const GemmModel& gemm, bool shared_dy_reference, std::shared_ptr<QuantRuntime> runtime)
    : Linear<float>(info), specs_(specs), gemm_(gemm), rt_(std::move(runtime)) {
  for (Role r : kRoles) {
    const size_t i = static_cast<size_t>(r);
    specs_[i].q.validate();
    refs_[i] = &rt_->references().get(reference_key(info_.name, r, shared_dy_reference));
    if (specs_[i].q.scale) scale_tables_[i] = ScaleCodeTable(*specs_[i].q.scale);
  }
  for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) {
    const GemmPath p = gemm_path(specs_, g, gemm_, rt_->options().fp32_gemm);
    bf16_gemm_[static_cast<size_t>(g)] = p.bf16;
    row_gemm_[static_cast<size_t>(g)] = p.rows;
  }
}

CallKey QuantizedLinear::key(Gemm g, Role r) const {
  CallKey k;
  k.layer = info_.name;
  k.block = info_.layer;
  k.kind = info_.kind;
  k.gemm = g;
  k.role = r;
  k.step = rt_->context().step;
  k.micro_batch = rt_->context().micro_batch;
  return k;
}

QuantizedLinear::Operand QuantizedLinear::quantize_operand(Role role, const float* src, int64_t src_rows,
                                                           int64_t src_cols, bool transpose_src,
                                                           QuantRuntime::OperandBuffers& b) {
  const size_t ri = static_cast<size_t>(role);
  const RoleSpec& rs = specs_[ri];
  const StepContext& ctx = rt_->context();
  const int64_t rows = transpose_src ? src_cols : src_rows;
  const int64_t cols = transpose_src ? src_rows : src_cols;  // K
  const int64_t n = rows * cols;
  if (rs.q.rht && cols % rs.q.rht_size != 0)
    throw Error(info_.name + ", " + std::string(role_name(role)) + ": the random Hadamard transform runs along K = " +
                std::to_string(cols) + ", which must be a multiple of " + std::to_string(rs.q.rht_size));

  QuantOps& ops = rt_->ops();
  const float* hp = src;
  if (transpose_src) {
    ops.transpose(ensure(b.hp, n, ops.memory()), src, src_rows, src_cols);
    hp = b.hp.data();
  }
  if (rs.pre_round_bf16) {  // round_bf16 works in place
    ops.round_bf16(ensure(b.hp, n, ops.memory()), hp, n);
    hp = b.hp.data();
  }

  // The tensor reference of this call. A replay (recompute_forward) takes
  // the spec the forward of this micro-batch decided, and records nothing.
  ReferenceState& ref = *refs_[ri];
  if (replay_) {
    const Decided& d = decided_[ri];
    if (!d.valid || d.step != ctx.step || d.micro_batch != ctx.micro_batch)
      throw Error(info_.name + ": recompute_forward without a forward of step " + std::to_string(ctx.step) +
                  ", micro-batch " + std::to_string(ctx.micro_batch));
    return quantize_decided(d.q, hp, rows, cols, b, nullptr, role_gemm(role), false).op;
  }
  // Row outer scales: the reference is one amax per row (held row by row).
  const bool by_row = rs.q.outer == OuterScale::row;
  ReferenceState::Use use;
  try {
    use = ref.begin_call(rs.reference, ctx.step, by_row ? rows : 0);
  } catch (const Error& e) {
    throw Error(info_.name + ", " + std::string(role_name(role)) + ": " + e.what());
  }
  QuantSpec q = rs.q;
  q.seed = rt_->options().seed;
  q.stream = quant_stream(ctx.step, ctx.micro_batch, info_.layer, info_.kind, role);
  q.amax_kind = use.kind;
  q.amax_value = by_row ? 0 : use.value;
  if (by_row && use.kind == AmaxKind::given) q.row_amax = std::move(use.rows);
  // A held reference of 0 or NaN means "no tensor scale" (t = 1 either
  // way); say so in the spec, which `exmy quantize` can then replay. (A
  // row's 0 or NaN is the same for that row.)
  if (!by_row && use.kind == AmaxKind::given && !(use.value > 0 && std::isfinite(use.value))) {
    q.amax_kind = AmaxKind::none;
    q.amax_value = 0;
  }

  decided_[ri] = Decided{true, ctx.step, ctx.micro_batch, q};
  const Gemm g = role_gemm(role);
  CaptureSink* cap = ctx.capture ? rt_->capture_sink() : nullptr;
  if (cap) cap->capture(key(g, role), q, host_view(ops.memory(), hp, n, rt_->scratch().host), rows, cols);

  StatsSink* sink = ctx.stats ? rt_->stats_sink() : nullptr;
  QuantRuntime::Record* rec = sink ? &rt_->open_record(key(g, role), false) : nullptr;
  OperandStats* os = rec ? &rec->operand : nullptr;
  const Quantized r = quantize_decided(q, hp, rows, cols, b, os, g, ref.takes_amax(rs.reference));

  // The operand's amax: `current` calls measured it as their reference; the
  // others need it for a delayed history or row outer scales (at once), or
  // for the statistics (later, where the ops defer them), and the CPU path
  // measures it anyway in its block-amax pass. (On a device, a reduction
  // there: only its result comes to the host.)
  const bool measured = !by_row && use.kind == AmaxKind::current;
  const bool amax_now = by_row || ReferenceState::needs_amax(rs.reference);
  double amax = r.info.amax;
  if (!measured && amax_now) amax = r.info.abs_max ? *r.info.abs_max : ops.abs_max(r.hp, n);
  ref.end_call(rs.reference, ctx.step, amax, by_row ? &r.info.row_abs_max : nullptr);

  if (rec) {
    if (measured) rec->amax_is_reference = true;
    if (amax_now) os->amax = amax;
    // Counted where the tensors live (on a device: only the counts come to the host).
    ops.operand_stats(r.hp, rows, cols, !measured && !amax_now, q.scale ? &scale_tables_[ri] : nullptr,
                      b.scale_codes.data(), r.blocks, q.block_rows, q.block_cols, *os);
    rt_->close_record(*rec);
  }
  return r.op;
}

// An operand whose spec is decided (reference applied, RHT still to do):
// the RHT, the quantization call into the role's buffers, and the grouped
// model's encoding (or, when GEMM g runs in BF16, the encoding as bfloat16
// bits for the fp32 model in BF16). With `stats`, the call's statistics and
// the scale codes (for the histograms) too. A replay (recompute_forward)
// calls it alone.
QuantizedLinear::Quantized QuantizedLinear::quantize_decided(const QuantSpec& q, const float* hp, int64_t rows,
                                                             int64_t cols, QuantRuntime::OperandBuffers& b,
                                                             OperandStats* stats, Gemm g, bool need_amax) {
  const bool bf16 = bf16_gemm_[static_cast<size_t>(g)], rows_gemm = row_gemm_[static_cast<size_t>(g)];
  const int64_t n = rows * cols;
  QuantOps& ops = rt_->ops();
  Memory& mem = ops.memory();
  if (q.rht) {
    if (hp != b.hp.data()) {
      mem.copy(ensure(b.hp, n, mem), hp, sizeof(float) * static_cast<size_t>(n));
      hp = b.hp.data();
    }
    ops.rht(q, b.hp.data(), rows, cols);
  }
  const bool grouped = gemm_.kind == GemmModel::Kind::grouped;
  QuantSpec qc = q;
  qc.rht = false;  // applied above
  Quantized r;
  r.hp = hp;
  r.blocks = block_count(qc, rows, cols);
  QuantOutput out;
  // The GEMM in BF16 reads the encoding alone: no decoded values, unless
  // for the statistics (a device's quantizer then writes none).
  out.values = bf16 && !stats ? nullptr : ensure(b.dq, n, mem);
  // Element codes feed the encodings; scale codes also feed the
  // statistics' scale histograms.
  if (grouped || bf16) out.codes = ensure(b.codes, n * qc.elem.code_bytes(), mem);
  if ((grouped || bf16 || stats) && qc.scale)
    out.scale_codes = ensure(b.scale_codes, std::max<int64_t>(1, r.blocks * qc.scale->code_bytes()), mem);
  // The info's amax and t are read by a reference that records the amax,
  // and a grouped or BF16 GEMM with a row-scaled operand, which apply both
  // operands' scales to their result on the host's word; another grouped
  // or BF16 GEMM reads t where the ops run, and the sgemm GEMM's operands
  // carry it already. The statistics take theirs with the call's
  // (quantize_recorded: on a device, later).
  float* t_at = (bf16 || grouped) && !rows_gemm ? ensure(b.t, 1, mem) : nullptr;
  const bool need_info = need_amax || ((grouped || bf16) && rows_gemm);
  r.info = stats ? ops.quantize_recorded(qc, hp, rows, cols, out, need_info, t_at, *stats)
                 : ops.quantize(qc, hp, rows, cols, out, need_info, t_at);
  r.op.t_at = t_at;
  r.op.dq = out.values;
  r.op.t = r.info.t;
  if (!r.info.row_t.empty()) {  // (QuantInfo's are on the host; the GEMM's alphas read them where the ops run)
    const int64_t m = static_cast<int64_t>(r.info.row_t.size());
    mem.from_host(ensure(b.row_t, m, mem), r.info.row_t.data(), sizeof(float) * static_cast<size_t>(m));
    r.op.row_t = b.row_t.data();
  }
  if (grouped) {
    ops.encode(ensure(b.enc, n, mem), qc, b.codes.data(), qc.scale ? b.scale_codes.data() : nullptr, rows, cols);
    r.op.enc = b.enc.data();
  }
  if (bf16) {
    ops.encode_bf16(ensure(b.bf16, n, mem), qc, b.codes.data(), qc.scale ? b.scale_codes.data() : nullptr, rows,
                    cols);
    r.op.bf16 = b.bf16.data();
  }
  return r;
}

void QuantizedLinear::run_gemm(Gemm g, const Operand& a, const Operand& b, int64_t M, int64_t N, int64_t K, float* dst,
                               bool accumulate, const float* X, const float* W, const float* dY, int64_t tokens) {
  QuantRuntime::Scratch& s = rt_->scratch();
  QuantOps& ops = rt_->ops();
  StatsSink* sink = rt_->context().stats && !replay_ ? rt_->stats_sink() : nullptr;
  float* target = accumulate ? ensure(s.out, M * N, ops.memory()) : dst;
  if (gemm_.kind == GemmModel::Kind::grouped) {
    if (a.row_t || b.row_t) {  // per-row decode scales: each output's own alpha
      ops.grouped_gemm(target, a.enc, b.enc, M, N, K, gemm_, 1.0f);
      ops.outer_alpha(target, M, N, a.t, a.row_t, b.t, b.row_t);
    } else {
      ops.grouped_gemm_scaled(target, a.enc, b.enc, M, N, K, gemm_, a.t_at, b.t_at);
    }
  } else if (a.bf16 && b.bf16) {  // the fp32 model in BF16: the tensor scales applied to the result
    if (a.row_t || b.row_t) {
      ops.gemm_bf16(target, a.bf16, b.bf16, M, N, K, 1.0f);
      ops.outer_alpha(target, M, N, a.t, a.row_t, b.t, b.row_t);
    } else {
      ops.gemm_bf16_scaled(target, a.bf16, b.bf16, M, N, K, a.t_at, b.t_at);
    }
  } else {
    ops.gemm(target, N, a.dq, K, Op::N, b.dq, K, Op::T, M, N, K);
  }
  if (sink) {
    // The unquantized GEMM of the same high-precision operands, on all rows
    // or on an even sample of them, made where the operands live; the host
    // reads the result's and the reference's compared rows (on a device,
    // copies of those rows alone).
    Memory& mem = ops.memory();
    const std::vector<int64_t> rows = sample_rows(M, compared_rows_request(rt_->options(), M));
    const int64_t R = rows.empty() ? M : static_cast<int64_t>(rows.size());
    const int64_t in = info_.in_features, out = info_.out_features;
    float* ref = ensure(s.ref, R * N, mem);
    // The left operand's selected rows, gathered (or the whole tensor).
    const float* left = nullptr;
    int64_t ld = 0;
    if (g == Gemm::wgrad) {  // rows of dY^T = columns of dY
      float* ga = ensure(s.gather, R * tokens, mem);
      ops.gather_columns(ga, dY, tokens, out, R);
      left = ga;
      ld = tokens;
    } else {
      const float* full = g == Gemm::fprop ? X : dY;
      ld = g == Gemm::fprop ? in : out;
      if (R == M) {
        left = full;
      } else {
        float* ga = ensure(s.gather, R * ld, mem);
        ops.gather_rows(ga, full, ld, M, R);
        left = ga;
      }
    }
    switch (g) {
      case Gemm::fprop: ops.gemm(ref, out, left, ld, Op::N, W, in, Op::T, R, out, in); break;
      case Gemm::dgrad: ops.gemm(ref, in, left, ld, Op::N, W, in, Op::N, R, in, out); break;
      case Gemm::wgrad: ops.gemm(ref, in, left, ld, Op::N, X, in, Op::N, R, in, tokens); break;
    }
    // ŷ's compared rows: read in place on the host; on a device, gathered
    // there (compared as rows 0..R-1) and compared there.
    const float* got = target;
    int64_t got_rows = M;
    if (!mem.on_host() && R < M) {
      float* gr = ensure(s.got, R * N, mem);
      ops.gather_rows(gr, target, N, M, R);
      got = gr;
      got_rows = R;
    }
    QuantRuntime::Record& rec = rt_->open_record(key(g, gemm_roles(g)[0]), true);
    ops.compare_rows(got, got_rows, ref, N, got_rows == M ? rows : std::vector<int64_t>{}, &rec.gemm_stats);
    rt_->close_record(rec);
  }
  if (accumulate) ops.add(dst, target, M * N);
}

void QuantizedLinear::recompute_forward(float* Y, const float* X, const float* W, int64_t tokens) {
  struct Replay {
    bool& flag;
    explicit Replay(bool& f) : flag(f) { flag = true; }
    ~Replay() { flag = false; }
  } replay(replay_);
  forward(Y, X, W, tokens);
}

void QuantizedLinear::forward(float* Y, const float* X, const float* W, int64_t tokens) {
  ScratchGuard guard(rt_->scratch());
  auto& s = rt_->scratch();
  const int64_t in = info_.in_features, out = info_.out_features;
  // Y (tokens, out) = X (tokens, in) · W (out, in)^T
  const Operand x = quantize_operand(Role::fprop_x, X, tokens, in, false, s.side[0]);
  const Operand w = quantize_operand(Role::fprop_w, W, out, in, false, s.side[1]);
  run_gemm(Gemm::fprop, x, w, tokens, out, in, Y, false, X, W, nullptr, tokens);
}

void QuantizedLinear::backward(float* dX, float* dW, const float* dY, const float* X, const float* W, int64_t tokens) {
  ScratchGuard guard(rt_->scratch());
  auto& s = rt_->scratch();
  const int64_t in = info_.in_features, out = info_.out_features;
  if (dX) {
    // dX (tokens, in) += dY (tokens, out) · W (out, in): K = out, B = W^T (in, out)
    const Operand dy = quantize_operand(Role::dgrad_dy, dY, tokens, out, false, s.side[0]);
    const Operand wt = quantize_operand(Role::dgrad_w, W, out, in, true, s.side[1]);
    run_gemm(Gemm::dgrad, dy, wt, tokens, in, out, dX, true, X, W, dY, tokens);
  }
  // dW (out, in) += dY^T (out, tokens) · X (tokens, in): K = tokens, A = dY^T, B = X^T (in, tokens)
  const Operand dyt = quantize_operand(Role::wgrad_dy, dY, tokens, out, true, s.side[0]);
  const Operand xt = quantize_operand(Role::wgrad_x, X, tokens, in, true, s.side[1]);
  run_gemm(Gemm::wgrad, dyt, xt, out, in, tokens, dW, true, X, W, dY, tokens);
}

double quant_scratch_bytes(const Recipe& recipe, int64_t num_blocks, const std::vector<LinearInfo>& linears,
                           int64_t tokens, const RuntimeOptions& opt, bool stats) {
  struct Side {  // the largest size of each of QuantRuntime::OperandBuffers' buffers
    double hp = 0, dq = 0, codes = 0, scale_codes = 0, enc = 0, bf16 = 0, t = 0, row_t = 0;
    double sum() const { return hp + dq + codes + scale_codes + enc + bf16 + t + row_t; }
  } side[2];
  double out = 0, ref = 0, gather = 0, ranges = 0;
  // On a device, statistics results wait in a ledger until the micro-batch
  // ends (sim/quant/device_stats.hpp): all calls' at once, a quarter more
  // after its first collect; and the GEMM comparison's segment partials.
  double ledger = 0, gemm_parts = 0;
  const bool grouped = recipe.gemm.kind == GemmModel::Kind::grouped;
  const auto up = [](double& v, double bytes) { v = std::max(v, bytes); };
  const auto sampled = [&](int64_t M) {  // the rows compared (sample_rows: all when the request is 0 or >= M)
    const int64_t r = compared_rows_request(opt, M);
    return r <= 0 || r >= M ? M : r;
  };
  for (const LinearInfo& info : linears) {
    if (!recipe.quantizes(info, num_blocks)) continue;
    const auto specs = recipe.resolve(info, num_blocks);
    const int64_t in = info.in_features, o = info.out_features;
    std::array<GemmPath, 3> paths;
    for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad})
      paths[static_cast<size_t>(g)] = gemm_path(specs, g, recipe.gemm, opt.fp32_gemm);
    // Each role's operand (rows, cols = K), its side and whether it is the
    // transpose of the tensor the model passes (quantize_operand).
    const auto call = [&](Role r, int si, int64_t rows, int64_t cols, bool transposed) {
      const RoleSpec& rs = specs[role_index(r)];
      const double n = static_cast<double>(rows * cols);
      const GemmPath& path = paths[static_cast<size_t>(role_gemm(r))];
      const bool bf = path.bf16, row = rs.q.outer == OuterScale::row;
      Side& b = side[si];
      if (transposed || rs.pre_round_bf16 || rs.q.rht) up(b.hp, 4 * n);
      if (!bf || stats) up(b.dq, 4 * n);
      if (grouped || bf) up(b.codes, n * rs.q.elem.code_bytes());
      if ((grouped || bf || stats) && rs.q.scale)
        up(b.scale_codes, static_cast<double>(std::max<int64_t>(1, block_count(rs.q, rows, cols)) *
                                              rs.q.scale->code_bytes()));
      if (grouped) up(b.enc, 8 * n);
      if (bf) up(b.bf16, 2 * n);
      if (bf && !path.rows) up(b.t, 4);
      if (row) up(b.row_t, 4.0 * static_cast<double>(rows));
      if (stats) {  // amax partials, range counts, scale-code counts, the quantizer's record (rounded up)
        const int cb = rs.q.scale ? rs.q.scale->code_bytes() : 0;
        const double codes = cb > 0 && cb <= 2 ? 8.0 * (1 << (8 * cb)) : 0;
        ledger += 4 * 256 + 8 * kRangeHistBins + codes + 256;
      }
    };
    call(Role::fprop_x, 0, tokens, in, false);
    call(Role::fprop_w, 1, o, in, false);
    call(Role::dgrad_dy, 0, tokens, o, false);
    call(Role::dgrad_w, 1, in, o, true);
    call(Role::wgrad_dy, 0, o, tokens, true);
    call(Role::wgrad_x, 1, in, tokens, true);
    // run_gemm: the backward's results formed apart, the grouped model's
    // ranges, the statistics' reference and gathered rows.
    up(out, 4.0 * static_cast<double>(std::max(tokens * in, o * in)));
    if (grouped)
      for (const auto& [M, N, K] : {std::array<int64_t, 3>{tokens, o, in}, {tokens, in, o}, {o, in, tokens}})
        up(ranges, static_cast<double>(std::max<int64_t>(1, grouped_gemm_scratch(M, N, K, recipe.gemm)) *
                                       static_cast<int64_t>(sizeof(GroupRange))));
    if (stats) {
      const int64_t rf = sampled(tokens), rw = sampled(o);
      ledger += 3 * 64;
      const auto segs = [](int64_t R, int64_t N) { return static_cast<double>(R * gemm_segments_per_row(N)); };
      up(gemm_parts, static_cast<double>(sizeof(GemmPartial)) * std::max({segs(rf, o), segs(rf, in), segs(rw, in)}));
      up(ref, 4.0 * static_cast<double>(std::max({rf * o, rf * in, rw * in})));
      up(gather, 4.0 * static_cast<double>(std::max({rf < tokens ? rf * in : 0, rf < tokens ? rf * o : 0,
                                                     rw * tokens})));
    }
  }
  return side[0].sum() + side[1].sum() + out + ref + gather + ranges + std::ceil(1.25 * ledger) + gemm_parts;
}

// ---------------------------------------------------------------------------
// The factory
// ---------------------------------------------------------------------------

RecipeLinearFactory::RecipeLinearFactory(Recipe recipe, int64_t num_blocks, std::shared_ptr<QuantRuntime> runtime,
                                         std::unique_ptr<LinearFactory<float>> unquantized)
    : recipe_(std::move(recipe)), num_blocks_(num_blocks), rt_(std::move(runtime)), unquantized_(std::move(unquantized)) {
  if (!rt_) rt_ = std::make_shared<QuantRuntime>();
  validate_recipe(recipe_);
  recipe_.check_selects_some(num_blocks_);
  if (!unquantized_) unquantized_ = make_linear_factory<float>(recipe_.unquantized);
}

std::unique_ptr<Linear<float>> RecipeLinearFactory::make(const LinearInfo& info) const {
  PlanEntry e;
  e.info = info;
  if (!recipe_.quantizes(info, num_blocks_)) {
    plan_.push_back(e);
    return unquantized_->make(info);
  }
  e.quantized = true;
  e.specs = recipe_.resolve(info, num_blocks_);
  plan_.push_back(e);
  return std::make_unique<QuantizedLinear>(info, e.specs, recipe_.gemm, recipe_.shared_dy_reference, rt_);
}

std::string RecipeLinearFactory::plan_text() const {
  std::string out;
  for (const auto& e : plan_) {
    out += e.info.name + ": ";
    if (!e.quantized) {
      out += recipe_.unquantized + "\n";
      continue;
    }
    for (Role r : kRoles) {
      out += std::string(role_name(r)) + "{" + role_spec_string(e.specs[role_index(r)]) + "}";
      out += r == Role::wgrad_x ? "\n" : " ";
    }
  }
  return out;
}

}  // namespace exmy::sim::quant
