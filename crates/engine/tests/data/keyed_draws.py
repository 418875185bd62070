"""Writes keyed_draws.txt: expected keyed draws (DESIGN.md §3) for random rows, computed with NumPy.

Written from the definition, independently of the Rust sampler. Run: python3 keyed_draws.py > keyed_draws.txt
(NumPy 2.x; the output is committed). Each line:
  case temperature top_k top_p min_p repetition presence frequency seed vocab quantized positions tokens reply
Logits are regenerated on both sides from (case, vocab, quantized) with integer arithmetic, so they are exact f32:
  r_i = mix((case << 32) ^ i) >> 40 (24 bits); quantized: ((r_i % 41) - 20) * 0.25, else (r_i - 2^23) / 2^21.
"""
import math
import random

import numpy as np

M = (1 << 64) - 1


def mix(z):
    z ^= z >> 30; z = (z * 0xBF58476D1CE4E5B9) & M
    z ^= z >> 27; z = (z * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def uniform(seed, pos, tok):
    x = mix((seed + 0x9E3779B97F4A7C15) & M)
    x = mix(x ^ ((pos * 0xD1B54A32D192ED03) & M))
    x = mix(x ^ tok)
    return (x >> 11) * 2.0**-53 + 2.0**-54


def logits(case, vocab, quantized):
    r = [mix(((case << 32) ^ i) & M) >> 40 for i in range(vocab)]
    vals = [((x % 41) - 20) * 0.25 for x in r] if quantized else [(x - 2**23) / 2**21 for x in r]
    return np.array(vals, dtype=np.float32)


def penalize(v, reply, rep, pres, freq):
    v = v.astype(np.float64).copy()
    if not reply or (rep == 1.0 and pres == 0.0 and freq == 0.0):
        return v
    count = {}
    for t in reply:
        count[t] = count.get(t, 0) + 1
    for t, c in count.items():
        if rep != 1.0:
            v[t] = v[t] / rep if v[t] > 0 else v[t] * rep
        v[t] -= freq * c + pres
    return v


def draw(lg, pos, seed, T, top_k, top_p, min_p, reply, rep, pres, freq):
    v = penalize(lg, reply, rep, pres, freq)
    ids = np.arange(len(v))
    order = np.lexsort((ids, -v))            # logit descending, ties to the lower id
    if T <= 0:
        return int(order[0])
    k = max(1, min(top_k if top_k else len(v), len(v)))
    ids = ids[order][:k]
    scaled = v[order][:k] / max(T, 1e-6)
    if 0.0 < top_p < 1.0:
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        keep = int((np.cumsum(probs) < top_p).sum()) + 1
        ids, scaled = ids[:keep], scaled[:keep]
    if min_p > 0.0:
        keep = int((scaled >= scaled[0] + math.log(min_p)).sum())
        ids, scaled = ids[:keep], scaled[:keep]
    gumbel = np.array([-math.log(-math.log(uniform(seed, pos, int(t)))) for t in ids])
    return int(ids[int(np.argmax(scaled + gumbel))])


def main():
    rnd = random.Random(20260101)
    for case in range(1500):
        vocab = rnd.choice([2, 3, 7, 8, 9, 16, 64, 127, 128, 129, 200, 300, 1000])
        quantized = rnd.random() < 0.5
        T = rnd.choice([0.0, 0.05, 0.3, 0.7, 1.0, 1.5, 3.0])
        top_k = rnd.choice([0, 0, 1, 2, 5, 40, vocab, vocab + 3])
        top_p = rnd.choice([1.0, 1.0, 0.3, 0.5, 0.9, 0.95, 0.99])
        min_p = rnd.choice([0.0, 0.0, 0.01, 0.05, 0.3])
        reply = [rnd.randrange(vocab) for _ in range(rnd.choice([0, 0, 3, 20]))]
        rep = rnd.choice([1.0, 1.0, 1.1, 1.5, 0.8])
        pres = rnd.choice([0.0, 0.0, 0.5, -0.5])
        freq = rnd.choice([0.0, 0.0, 0.3])
        seed = rnd.getrandbits(64)
        positions = [rnd.getrandbits(20) for _ in range(4)]
        lg = logits(case, vocab, quantized)
        tokens = [draw(lg, p, seed, T, top_k, top_p, min_p, reply, rep, pres, freq) for p in positions]
        join = lambda xs: ",".join(str(x) for x in xs) or "-"
        print(case, repr(T), top_k, repr(top_p), repr(min_p), repr(rep), repr(pres), repr(freq), seed, vocab,
              int(quantized), join(positions), join(tokens), join(reply))


main()
