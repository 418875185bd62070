#!/usr/bin/env python3
"""Generates tests/fixtures/gguf_py_dequant.json: gguf-py's dequantization of pseudo-random blocks.

Run from the repository root with the project's venv (gguf 0.19.0 and NumPy installed):

    .venv/bin/python crates/quant/tests/gen_fixtures.py

and commit the JSON it writes. `cargo test -p tf-quant --test gguf_py_fixtures` checks it.

Each case is a byte string of `n_blocks` blocks of one type, made from a seed so the file stays small:
splitmix64 outputs, each written as 8 little-endian bytes, truncated to `n_blocks * type_size`. When
`finite_f16` is true, every f16 field at the listed byte offsets of each block that is Inf or NaN gets bit 14
cleared (so its exponent is no longer all ones). The Rust test rebuilds the same bytes, checks them against
`head_bytes` (the first blocks, hex), dequantizes them and compares with `head_f32` (the output of those
first blocks as hex little-endian f32 bits) and with `fnv1a64` (FNV-1a 64 over all the output's f32 bytes).

A case with `bytes_hex` carries its input bytes whole instead of a seed (hand-built edge cases, see
`EXPLICIT`).

Cases with `finite_f16: false` keep Inf/NaN scales; their expected bits depend on how the CPU propagates NaNs
through the NumPy arithmetic, so the Rust test checks them only on x86_64 and reports them separately.
"""

import importlib.metadata
import json
import os
import sys

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

MASK64 = (1 << 64) - 1


def splitmix64_bytes(seed: int, n: int) -> bytes:
    out = bytearray()
    state = seed & MASK64
    while len(out) < n:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        out += z.to_bytes(8, "little")
    return bytes(out[:n])


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


# (GGUF type, byte offsets of the f16 fields in one block, number of blocks). Plain types count elements.
TYPES = [
    (T.F32, [], 256),
    (T.Q4_0, [0], 8192),
    (T.Q4_1, [0, 2], 8192),
    (T.Q5_0, [0], 8192),
    (T.Q5_1, [0, 2], 8192),
    (T.Q8_0, [0], 8192),
    (T.Q2_K, [80, 82], 2048),
    (T.Q3_K, [108], 2048),
    (T.Q4_K, [0, 2], 2048),
    (T.Q5_K, [0, 2], 2048),
    (T.Q6_K, [208], 2048),
    (T.IQ4_NL, [0], 8192),
    (T.IQ4_XS, [0], 2048),
    (T.IQ3_S, [0], 2048),
    (T.IQ3_XXS, [0], 2048),
    (T.MXFP4, [], 8192),
    (T.IQ2_XXS, [0], 2048),
    (T.IQ2_XS, [0], 2048),
    (T.IQ1_S, [0], 2048),
    (T.IQ2_S, [0], 2048),
]
# F16 and BF16 are checked on every one of the 65536 bit patterns, in order ("exhaustive_u16": true).
EXHAUSTIVE = [T.F16, T.BF16]



def mxfp4_every_scale_and_code() -> bytes:
    """MXFP4: 256 blocks, block `i` with E8M0 scale byte `i` (0, 1, 127, 128, 254 and 255 among them; 255 is
    NaN in the OCP format and 2^127 in gguf-py, which then overflows to +-Inf for |code value| >= 2) and in byte `j`
    of its codes the low nibble `(j + i) % 16` and the high nibble `(15 - j + i) % 16`: every code in both
    positions at every scale."""
    out = bytearray()
    for i in range(256):
        out.append(i)
        out += bytes(((j + i) % 16) | (((15 - j + i) % 16) << 4) for j in range(16))
    return bytes(out)


# (GGUF type, name, bytes): cases whose input is written out whole.
EXPLICIT = [(T.MXFP4, "every_scale_and_code", mxfp4_every_scale_and_code)]

HEAD_ELEMS = 16  # plain types: the head is the first 16 elements; quant types: the first block


def make_bytes(seed: int, n_blocks: int, type_size: int, f16_offsets: list[int], finite: bool) -> bytes:
    if seed is None:
        return np.arange(65536, dtype="<u2").tobytes()
    raw = bytearray(splitmix64_bytes(seed, n_blocks * type_size))
    if finite:
        for blk in range(n_blocks):
            for off in f16_offsets:
                at = blk * type_size + off
                h = raw[at] | (raw[at + 1] << 8)
                if h & 0x7C00 == 0x7C00:
                    h &= ~0x4000
                    raw[at + 1] = h >> 8
    return bytes(raw)


def case(qtype, f16_offsets, n_blocks, seed, finite, explicit=None):
    """One case; `explicit` is `(name, input bytes)` for a hand-built case (then `seed` is unused)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = make_bytes(seed, n_blocks, type_size, f16_offsets, finite) if explicit is None else explicit[1]
    arr = np.frombuffer(data, dtype=np.uint8).reshape((n_blocks, type_size))
    if block_size == 1:
        arr = arr.reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN scales in the non-finite cases
        out = np.ascontiguousarray(dequantize(arr, qtype), dtype=np.float32)
    assert out.dtype == np.float32 and out.size == n_blocks * block_size
    out_bytes = out.tobytes()
    head_elems = block_size if block_size > 1 else HEAD_ELEMS
    return {
        "dtype": qtype.name,
        "exhaustive_u16": seed is None and explicit is None,
        "seed": seed if seed is not None else 0,
        "n_blocks": n_blocks,
        "f16_offsets": f16_offsets,
        "finite_f16": finite,
        "head_bytes": data[: head_elems // block_size * type_size].hex(),
        "head_f32": out_bytes[: 4 * head_elems].hex(),
        "fnv1a64": f"{fnv1a64(out_bytes):016x}",
    } | ({"name": explicit[0], "bytes_hex": explicit[1].hex()} if explicit is not None else {})


def main():
    cases = []
    for qtype in EXHAUSTIVE:
        cases.append(case(qtype, [], 65536, None, finite=False))
    for i, (qtype, offsets, n_blocks) in enumerate(TYPES):
        seed = 1000 + i
        cases.append(case(qtype, offsets, n_blocks, seed, finite=True))
        if offsets and GGML_QUANT_SIZES[qtype][0] > 1:
            cases.append(case(qtype, offsets, 512, seed + 500, finite=False))
    for qtype, name, make in EXPLICIT:
        data = make()
        n_blocks = len(data) // GGML_QUANT_SIZES[qtype][1]
        cases.append(case(qtype, [], n_blocks, None, True, explicit=(name, data)))
    doc = {
        "generator": "crates/quant/tests/gen_fixtures.py",
        "gguf_py_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "prng": "splitmix64, 8 little-endian bytes per output",
        "hash": "fnv1a64 over the f32 little-endian output bytes",
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gguf_py_dequant.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases, {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
