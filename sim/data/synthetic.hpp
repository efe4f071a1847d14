// A synthetic token source whose entropy is known exactly: a random
// first-order Markov chain over `vocab` states, each state moving to
// `branching` successors with random probabilities.
//
// The best any model can do on its output is the chain's entropy rate
//   H = sum_i pi_i * sum_j -P_ij ln P_ij   (nats per token)
// with pi the stationary distribution, so a training test can show the loss
// falling towards a number computed in closed form rather than towards a
// guess. Successor i+1 (mod vocab) is always among a state's successors, so
// the chain is irreducible and pi is unique; it is found by power iteration
// on the lazy chain (P + I) / 2, which has the same pi and always converges.
//
// P is stored sparse (each state's `branching` successors), so memory and
// time grow with vocab x branching, not vocab^2: Nemotron's vocabulary of
// 131,072 works.
#pragma once

#include <cstdint>
#include <vector>

namespace exmy::data {

struct MarkovSource {
  int64_t vocab = 0;
  int64_t branching = 0;
  // (vocab, branching): state i's successors in increasing order and their
  // probabilities (each row sums to 1).
  std::vector<int64_t> next_state;
  std::vector<double> next_prob;
  std::vector<double> stationary;  // (vocab)

  static MarkovSource random(int64_t vocab, int64_t branching, uint64_t seed);
  // P(i -> j).
  double prob(int64_t i, int64_t j) const;
  double entropy_rate() const;  // nats per token
  // n tokens of the chain, started from its stationary distribution.
  std::vector<int32_t> generate(int64_t n, uint64_t seed) const;
};

}  // namespace exmy::data
