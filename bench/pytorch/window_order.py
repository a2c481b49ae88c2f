#!/usr/bin/env python3
"""fanout's data order for token windows, in plain Python (no numpy), so that
another trainer can visit the same windows in the same order.

  shuffled_indices(n, seed, epoch)  the training order of one epoch
      (runtime/data/sampler.cpp): a Fisher-Yates shuffle driven by a
      64-bit Mersenne Twister (std::mt19937_64) seeded with
      splitmix64(seed ^ epoch * 0x9E3779B97F4A7C15), each draw uniform
      in [0, i] by rejection (no modulo bias).
  eval_subset(n, rows)  the validation windows --eval-steps evaluates:
      floor(i * n / rows) for i in [0, rows) (runtime/train/trainer.cpp).
  num_windows(tokens, block) / window_span(i, block)  the window layout of
      a token split (runtime/data/tokens.cpp): window i is tokens
      [i * block, i * block + block + 1); x its first block tokens, y the
      block after the first.

  python3 bench/pytorch/window_order.py --n N --seed S --epoch E
prints the epoch's order, one index per line.
"""
import argparse

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(x):
    """runtime/core/splitmix.h's finalizer, modulo 2^64."""
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class MT19937_64:
    """std::mt19937_64: the 64-bit Mersenne Twister seeded with one integer."""

    N, M = 312, 156
    MATRIX_A = 0xB5026F5AA96619E9
    UPPER = 0xFFFFFFFF80000000  # the top w - r = 33 bits
    LOWER = 0x7FFFFFFF  # the low r = 31 bits

    def __init__(self, seed=5489):
        mt = [0] * self.N
        mt[0] = seed & MASK64
        for i in range(1, self.N):
            mt[i] = (6364136223846793005 * (mt[i - 1] ^ (mt[i - 1] >> 62)) + i) & MASK64
        self.mt = mt
        self.index = self.N

    def _twist(self):
        mt, n, m = self.mt, self.N, self.M
        for i in range(n):
            y = (mt[i] & self.UPPER) | (mt[(i + 1) % n] & self.LOWER)
            v = mt[(i + m) % n] ^ (y >> 1)
            if y & 1:
                v ^= self.MATRIX_A
            mt[i] = v
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def uniform_upto(rng, bound):
    """Uniform in [0, bound]: draws above the last whole multiple of bound + 1 are rejected."""
    if bound == MASK64:
        return rng()
    span = bound + 1
    limit = MASK64 - (MASK64 % span + 1) % span
    while True:
        r = rng()
        if r <= limit:
            return r % span


def shuffled_indices(n, seed, epoch):
    """The order of [0, n) that fanout's shuffling sampler gives epoch `epoch` under `seed`."""
    if n < 0:
        raise ValueError(f"shuffled_indices: dataset size must be non-negative, got {n}")
    order = list(range(n))
    if n > 1:
        rng = MT19937_64(splitmix64((seed & MASK64) ^ ((epoch * GOLDEN) & MASK64)))
        for i in range(n - 1, 0, -1):
            j = uniform_upto(rng, i)
            order[i], order[j] = order[j], order[i]
    return order


def eval_subset(n, rows):
    """The validation windows fanout's --eval-steps evaluates: rows of the n, spread evenly, in order."""
    rows = min(rows, n)
    return [i * n // rows for i in range(rows)]


def eval_rows(n_val, eval_steps, batch_size):
    """How many validation windows --eval-steps K evaluates at --batch-size B (K = 0: all of them)."""
    return n_val if eval_steps <= 0 else min(n_val, eval_steps * batch_size)


def num_windows(num_tokens, block):
    """Windows of block + 1 tokens, overlapping by one, in a split of num_tokens tokens."""
    return max(0, (num_tokens - 1) // block)


def window_span(i, block):
    """[start, end) of window i in its split's tokens."""
    return i * block, i * block + block + 1


def train_batches(n, batch_size, seed, first_epoch=0):
    """Every training batch of a run, forever: (epoch, the batch's window indices); each epoch's
    order in batches of batch_size, the last one of an epoch short when n is not a multiple."""
    epoch = first_epoch
    while True:
        order = shuffled_indices(n, seed, epoch)
        for b in range(0, n, batch_size):
            yield epoch, order[b:b + batch_size]
        epoch += 1


def _self_check():
    rng = MT19937_64(5489)
    for _ in range(9999):
        rng()
    assert rng() == 9981545732273789042, "mt19937_64's 10000th output differs from the standard's"


def main():
    p = argparse.ArgumentParser(description="Print fanout's shuffled order of [0, N) for (seed, epoch).")
    p.add_argument("--n", type=int, required=True, help="number of items (windows)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (0..2^64-1)")
    p.add_argument("--epoch", type=int, default=0, help="0-based epoch")
    p.add_argument("--self-check", action="store_true", help="also check the generator against the standard")
    a = p.parse_args()
    if not 0 <= a.seed <= MASK64:
        p.error(f"--seed must be in [0, 2^64), got {a.seed}")
    if a.n < 0 or a.epoch < 0:
        p.error("--n and --epoch must be non-negative")
    if a.self_check:
        _self_check()
    for i in shuffled_indices(a.n, a.seed, a.epoch):
        print(i)


if __name__ == "__main__":
    main()
