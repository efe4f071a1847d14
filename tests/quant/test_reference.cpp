// Tensor-reference policies: current, periodic (sample-and-hold), delayed,
// none; micro-batches; the shared dY reference; checkpoint round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/quant/reference.hpp"

namespace exmy::sim::quant {
namespace {

// One call: what the state says, then the tensor's amax.
ReferenceState::Use call(ReferenceState& s, const RefPolicy& p, int64_t step, double amax) {
  const auto u = s.begin_call(p, step);
  s.end_call(p, step, u.kind == AmaxKind::current ? amax : amax);
  return u;
}

TEST(Reference, CurrentAndNone) {
  ReferenceState s;
  EXPECT_EQ(call(s, parse_ref_policy("current"), 1, 3.0).kind, AmaxKind::current);
  EXPECT_EQ(call(s, parse_ref_policy("none"), 1, 3.0).kind, AmaxKind::none);
}

TEST(Reference, PeriodicSamplesAndHolds) {
  const RefPolicy p = parse_ref_policy("periodic:3");
  ReferenceState s;
  // step 1, micro-batch 0 samples; the other micro-batches of step 1 hold it
  EXPECT_EQ(call(s, p, 1, 2.0).kind, AmaxKind::current);
  auto u = call(s, p, 1, 9.0);
  EXPECT_EQ(u.kind, AmaxKind::given);
  EXPECT_EQ(u.value, 2.0);
  for (int step : {2, 3}) {
    u = call(s, p, step, 100.0);  // held, not a max over the window
    EXPECT_EQ(u.kind, AmaxKind::given);
    EXPECT_EQ(u.value, 2.0);
  }
  EXPECT_EQ(call(s, p, 4, 7.0).kind, AmaxKind::current);  // steps 1, D+1, 2D+1, ...
  EXPECT_EQ(s.held(), 7.0);
  EXPECT_EQ(s.sampled_step(), 4);
  EXPECT_EQ(call(s, p, 4, 1.0).value, 7.0);
  EXPECT_EQ(call(s, p, 6, 1.0).value, 7.0);
  EXPECT_EQ(call(s, p, 7, 5.0).kind, AmaxKind::current);
  EXPECT_EQ(s.held(), 5.0);
}

// A frozen reference holds its amax as a periodic sample of step 1 (what
// evaluation builds for weights and calibrated activations): the saved form
// is that of a periodic state sampled once, and later calls are given it.
TEST(Reference, FrozenHoldsItsAmax) {
  const ReferenceState f = ReferenceState::frozen(2.5);
  EXPECT_TRUE(f.has_held());
  EXPECT_EQ(f.held(), 2.5);
  EXPECT_EQ(f.sampled_step(), 1);
  ReferenceState sampled;
  call(sampled, parse_ref_policy("periodic:1000"), 1, 2.5);
  EXPECT_EQ(f.save(), sampled.save());
  ReferenceState g = f;
  for (int step : {1, 2, 500}) {
    const auto u = call(g, parse_ref_policy("periodic:1000"), step, 99.0);
    EXPECT_EQ(u.kind, AmaxKind::given) << step;
    EXPECT_EQ(u.value, 2.5) << step;
  }
}

TEST(Reference, SharedDyReference) {
  // dgrad-dy and wgrad-dy share one state under the key LAYER/dy.
  EXPECT_EQ(reference_key("layers.1.mixer.up_proj", Role::dgrad_dy, true), "layers.1.mixer.up_proj/dy");
  EXPECT_EQ(reference_key("layers.1.mixer.up_proj", Role::wgrad_dy, true), "layers.1.mixer.up_proj/dy");
  EXPECT_EQ(reference_key("layers.1.mixer.up_proj", Role::wgrad_dy, false), "layers.1.mixer.up_proj/wgrad-dy");
  EXPECT_EQ(reference_key("layers.1.mixer.up_proj", Role::fprop_x, true), "layers.1.mixer.up_proj/fprop-x");
  ReferenceStore store;
  const RefPolicy p = parse_ref_policy("periodic:2");
  ReferenceState& dgrad = store.get(reference_key("l", Role::dgrad_dy, true));
  ReferenceState& wgrad = store.get(reference_key("l", Role::wgrad_dy, true));
  EXPECT_EQ(&dgrad, &wgrad);
  EXPECT_EQ(call(dgrad, p, 1, 4.0).kind, AmaxKind::current);  // dgrad samples
  const auto u = call(wgrad, p, 1, 6.0);                      // wgrad of the same step uses it
  EXPECT_EQ(u.kind, AmaxKind::given);
  EXPECT_EQ(u.value, 4.0);
}

TEST(Reference, DelayedIsMaxOverLastSteps) {
  const RefPolicy p = parse_ref_policy("delayed:2");
  ReferenceState s;
  EXPECT_EQ(call(s, p, 1, 3.0).kind, AmaxKind::none);  // no history yet: no tensor scale
  EXPECT_EQ(call(s, p, 1, 5.0).kind, AmaxKind::none);  // second micro-batch of step 1
  auto u = call(s, p, 2, 1.0);                        // history {5}
  EXPECT_EQ(u.kind, AmaxKind::given);
  EXPECT_EQ(u.value, 5.0);
  EXPECT_EQ(call(s, p, 3, 2.0).value, 5.0);  // {5, 1}
  EXPECT_EQ(call(s, p, 4, 0.5).value, 2.0);  // {1, 2}
  EXPECT_EQ(call(s, p, 6, 0.5).value, 2.0);  // step 5 had no call: {2, 0.5}
  EXPECT_EQ(s.history().size(), 2u);
  ReferenceState n;
  call(n, p, 1, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(call(n, p, 2, 1.0).value));
}

TEST(Reference, CheckpointRoundTripAndColdRestart) {
  const RefPolicy per = parse_ref_policy("periodic:4"), del = parse_ref_policy("delayed:3");
  ReferenceStore a;
  auto run = [&](ReferenceStore& st, int64_t from, int64_t to, std::vector<double>& log) {
    for (int64_t step = from; step <= to; ++step)
      for (int mb = 0; mb < 2; ++mb) {
        const double amax = 1.0 + static_cast<double>((step * 7 + mb * 3) % 11);
        auto u1 = call(st.get("x/fprop-x"), per, step, amax);
        auto u2 = call(st.get("x/dy"), del, step, amax * 2);
        log.push_back(u1.kind == AmaxKind::given ? u1.value : -1);
        log.push_back(u2.kind == AmaxKind::given ? u2.value : -1);
      }
  };
  std::vector<double> straight, resumed;
  run(a, 1, 10, straight);
  ReferenceStore b;
  std::vector<double> first;
  run(b, 1, 6, first);
  const FlatReferenceState flat = b.save();
  ReferenceStore c;
  ReferenceState* addr = &c.get("x/fprop-x");
  c.load(flat);
  EXPECT_EQ(addr, &c.get("x/fprop-x"));  // linears hold pointers: addresses stay
  EXPECT_EQ(c.states().at("x/dy"), b.states().at("x/dy"));
  run(c, 7, 10, resumed);
  first.insert(first.end(), resumed.begin(), resumed.end());
  EXPECT_EQ(first, straight);

  // Cold restart: references start empty; a periodic one samples at once.
  ReferenceStore cold;
  cold.load(flat, true);
  EXPECT_FALSE(cold.get("x/fprop-x").has_held());
  EXPECT_EQ(call(cold.get("x/fprop-x"), per, 7, 3.0).kind, AmaxKind::current);
  EXPECT_EQ(call(cold.get("x/fprop-x"), per, 8, 5.0).value, 3.0);
  EXPECT_EQ(call(cold.get("x/fprop-x"), per, 9, 5.0).kind, AmaxKind::current);  // schedule: 1, 5, 9, ...

  // A malformed entry is refused and leaves the store as it was.
  FlatReferenceState bad = flat;
  bad["x/dy"].pop_back();
  EXPECT_THROW(c.load(bad), Error);
  EXPECT_EQ(c.save(), a.save());
}

}  // namespace
}  // namespace exmy::sim::quant

namespace exmy::sim::quant {
namespace {

// One call of an operand with row outer scales: its rows' amaxes.
ReferenceState::Use call_rows(ReferenceState& s, const RefPolicy& p, int64_t step, const std::vector<double>& rows) {
  auto u = s.begin_call(p, step, static_cast<int64_t>(rows.size()));
  double m = 0;
  for (const double v : rows) m = std::max(m, v);
  s.end_call(p, step, m, &rows);
  return u;
}

TEST(RowReference, PeriodicHoldsEveryRow) {
  const RefPolicy p = parse_ref_policy("periodic:2");
  ReferenceState s;
  EXPECT_EQ(call_rows(s, p, 1, {1, 2, 3}).kind, AmaxKind::current);
  const auto u = call_rows(s, p, 2, {9, 9, 9});
  EXPECT_EQ(u.kind, AmaxKind::given);
  EXPECT_EQ(u.rows, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(call_rows(s, p, 3, {4, 5, 6}).kind, AmaxKind::current);
  EXPECT_EQ(s.held_rows(), (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(s.held(), 6.0);
  // another row count is an error naming both
  try {
    s.begin_call(p, 4, 2);
    ADD_FAILURE() << "a held reference of 3 rows served 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 3 row amaxes, but the operand has 2 rows"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(s.begin_call(p, 4, 0), Error);  // and a tensor call
  // frozen per row: a periodic sample of step 1
  const ReferenceState f = ReferenceState::frozen_rows({0.5, std::nan(""), 2});
  EXPECT_TRUE(std::isnan(f.held()));
  ReferenceState g = f;
  const auto h = g.begin_call(parse_ref_policy("periodic:1000"), 5, 3);
  EXPECT_EQ(h.kind, AmaxKind::given);
  EXPECT_EQ(h.rows[0], 0.5);
  EXPECT_TRUE(std::isnan(h.rows[1]));
}

TEST(RowReference, DelayedTakesTheMaxPerRowOverTheWindow) {
  const RefPolicy p = parse_ref_policy("delayed:2");
  ReferenceState s;
  EXPECT_EQ(call_rows(s, p, 1, {1, 5}).kind, AmaxKind::none);  // no history yet
  call_rows(s, p, 1, {3, 1});                                  // a second micro-batch: max per row
  auto u = call_rows(s, p, 2, {2, 2});
  EXPECT_EQ(u.kind, AmaxKind::given);
  EXPECT_EQ(u.rows, (std::vector<double>{3, 5}));
  EXPECT_EQ(u.value, 5.0);
  u = call_rows(s, p, 3, {7, 0});
  EXPECT_EQ(u.rows, (std::vector<double>{3, 5}));  // steps 1 and 2
  u = call_rows(s, p, 4, {0, 0});
  EXPECT_EQ(u.rows, (std::vector<double>{7, 2}));  // steps 2 and 3
  EXPECT_EQ(s.row_history().size(), 2u);
  // the ranks' combination replaces the step's record row by row
  s.set_step_row_amax({8, 8});
  EXPECT_EQ(call_rows(s, p, 5, {0, 0}).rows, (std::vector<double>{8, 8}));
}

TEST(RowReference, SavedStateRoundTripsAndMalformedIsRefused) {
  ReferenceState s;
  const RefPolicy d = parse_ref_policy("delayed:3");
  for (int step = 1; step <= 4; ++step) call_rows(s, d, step, {1.0 * step, 2.0, std::nan("")});
  ReferenceState t;
  t.load(s.save());
  EXPECT_EQ(t.save().size(), s.save().size());
  const std::vector<double> a = s.save(), b = t.save();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << i;
  EXPECT_EQ(a[0], 2.0);  // the per-row layout's version
  // the continuation is the same
  EXPECT_EQ(call_rows(s, d, 5, {0, 0, 0}).rows[0], call_rows(t, d, 5, {0, 0, 0}).rows[0]);
  // a tensor reference keeps the first layout (older checkpoints read the same)
  ReferenceState plain;
  call(plain, parse_ref_policy("periodic:2"), 1, 3.0);
  EXPECT_EQ(plain.save()[0], 1.0);
  // truncated or overlong
  std::vector<double> v = s.save();
  for (const size_t cut : {v.size() - 1, size_t{9}, size_t{12}}) {
    std::vector<double> w(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(t.load(w), Error) << cut;
  }
  v.push_back(0);
  EXPECT_THROW(t.load(v), Error);
}

}  // namespace
}  // namespace exmy::sim::quant

namespace exmy::sim::quant {
namespace {

// What a checkpointed state gives the next step, frozen (exmy eval's policy
// checkpoint): periodic, the held sample; delayed, the window's max with
// the last step recorded; per row likewise.
TEST(Reference, FrozenAtTheNextStep) {
  const RefPolicy per = parse_ref_policy("periodic:2"), del = parse_ref_policy("delayed:2");
  ReferenceState p;
  call(p, per, 1, 3.0);
  call(p, per, 2, 5.0);
  ReferenceState fp = p.frozen_at(per, 3);  // step 3 would sample again; the deployment keeps 3.0
  EXPECT_EQ(fp.held(), 3.0);
  EXPECT_EQ(fp.begin_call(per, 100).value, 3.0);
  ReferenceState d;
  call(d, del, 1, 2.0);
  call(d, del, 2, 7.0);
  call(d, del, 3, 4.0);
  EXPECT_EQ(d.frozen_at(del, 4).held(), 7.0);  // max over steps 2 and 3
  ReferenceState dr;
  call_rows(dr, del, 1, {1, 9});
  call_rows(dr, del, 2, {4, 2});
  EXPECT_EQ(dr.frozen_at(del, 3).held_rows(), (std::vector<double>{4, 9}));
  EXPECT_THROW(ReferenceState{}.frozen_at(per, 1), Error);  // nothing sampled
  EXPECT_TRUE(std::isnan(ReferenceState{}.frozen_at(del, 1).held()));  // no history: no scale
  EXPECT_THROW(p.frozen_at(parse_ref_policy("current"), 3), Error);
}

}  // namespace
}  // namespace exmy::sim::quant
