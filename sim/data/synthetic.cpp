#include "sim/data/synthetic.hpp"

#include <algorithm>
#include <cmath>

#include "formats/error.hpp"
#include "sim/data/sampler.hpp"

namespace exmy::data {

MarkovSource MarkovSource::random(int64_t vocab, int64_t branching, uint64_t seed) {
  if (vocab < 2) throw Error("data.synthetic needs a vocabulary of at least 2 (got " + std::to_string(vocab) + ")");
  if (branching < 1 || branching > vocab)
    throw Error("data.synthetic_branching = " + std::to_string(branching) + " must be in [1, vocabulary " +
                std::to_string(vocab) + "]");
  MarkovSource m;
  m.vocab = vocab;
  m.branching = branching;
  const size_t cells = static_cast<size_t>(vocab * branching);
  m.next_state.resize(cells);
  m.next_prob.resize(cells);
  SplitMix64 g{seed ^ 0x5851f42d4c957f2dull};
  std::vector<int64_t> succ;
  std::vector<size_t> order(static_cast<size_t>(branching));
  for (int64_t i = 0; i < vocab; ++i) {
    succ.assign(1, (i + 1) % vocab);
    while (static_cast<int64_t>(succ.size()) < branching) {
      const int64_t j = static_cast<int64_t>(g.below(static_cast<uint64_t>(vocab)));
      if (std::find(succ.begin(), succ.end(), j) == succ.end()) succ.push_back(j);
    }
    // Dirichlet(1) weights: normalised exponential draws; kept away from 0
    // so every listed successor really occurs. Drawn in the order the
    // successors were found, stored in increasing state order.
    double sum = 0;
    std::vector<double> w(succ.size());
    for (auto& x : w) sum += (x = -std::log(1.0 - g.uniform()) + 0.05);
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return succ[a] < succ[b]; });
    for (size_t k = 0; k < order.size(); ++k) {
      m.next_state[static_cast<size_t>(i * branching) + k] = succ[order[k]];
      m.next_prob[static_cast<size_t>(i * branching) + k] = w[order[k]] / sum;
    }
  }
  // Power iteration; a state adds to its successors only (the other terms
  // of a dense product are exact zeros).
  std::vector<double> pi(static_cast<size_t>(vocab), 1.0 / static_cast<double>(vocab)), next(pi.size());
  for (int it = 0; it < 100000; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t i = 0; i < vocab; ++i) {
      const double pii = pi[static_cast<size_t>(i)];
      next[static_cast<size_t>(i)] += 0.5 * pii;
      for (int64_t k = i * branching; k < (i + 1) * branching; ++k)
        next[static_cast<size_t>(m.next_state[static_cast<size_t>(k)])] += 0.5 * pii * m.next_prob[static_cast<size_t>(k)];
    }
    double diff = 0;
    for (size_t k = 0; k < pi.size(); ++k) diff += std::fabs(next[k] - pi[k]);
    pi.swap(next);
    if (diff < 1e-15) break;
  }
  m.stationary = pi;
  return m;
}

double MarkovSource::prob(int64_t i, int64_t j) const {
  for (int64_t k = i * branching; k < (i + 1) * branching; ++k)
    if (next_state[static_cast<size_t>(k)] == j) return next_prob[static_cast<size_t>(k)];
  return 0.0;
}

double MarkovSource::entropy_rate() const {
  double h = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    double hi = 0;
    for (int64_t k = i * branching; k < (i + 1) * branching; ++k) {
      const double p = next_prob[static_cast<size_t>(k)];
      if (p > 0) hi -= p * std::log(p);
    }
    h += stationary[static_cast<size_t>(i)] * hi;
  }
  return h;
}

std::vector<int32_t> MarkovSource::generate(int64_t n, uint64_t seed) const {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  SplitMix64 g{seed ^ 0x2545f4914f6cdd1dull};
  // The first state from the stationary distribution (a dense row), the
  // rest from a state's successors (their probabilities in state order).
  auto draw = [&](const double* probs, const int64_t* states, int64_t n_states) {
    const double u = g.uniform();
    double c = 0;
    int64_t last = 0;
    for (int64_t k = 0; k < n_states; ++k) {
      if (probs[k] <= 0) continue;
      last = states ? states[k] : k;
      c += probs[k];
      if (u < c) return last;
    }
    return last;  // u within rounding of 1
  };
  int64_t s = n > 0 ? draw(stationary.data(), nullptr, vocab) : 0;
  for (int64_t t = 0; t < n; ++t) {
    out[static_cast<size_t>(t)] = static_cast<int32_t>(s);
    s = draw(next_prob.data() + s * branching, next_state.data() + s * branching, branching);
  }
  return out;
}

}  // namespace exmy::data
