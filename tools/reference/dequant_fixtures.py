"""Write fixtures/dequant/<short>.json: a digest of every tensor of each GGUF, dequantized to f32.

Run:  .venv/bin/python tools/reference/dequant_fixtures.py          (all models)
      FIXTURE_MODELS=smollm2,gemma3 .venv/bin/python tools/reference/dequant_fixtures.py

Per tensor: name, GGML type name, shape (GGUF `ne` order: innermost/fastest dimension first),
n_elements, sha256 of the dequantized values as little-endian float32 bytes in file order
(row-major with ne[0] fastest), their float64 sum (numpy pairwise summation: compare with a
relative tolerance, ~1e-9), and the first 8 values.

Reference: gguf-py (`gguf.GGUFReader` + `gguf.quants.dequantize`). F32 tensors pass through as-is;
F16/BF16 are widened to f32. When llama-cpp-python is installed, every tensor is ALSO dequantized with
ggml's own C `to_float` (from llama-cpp-python's bundled libggml-base) and the result is compared
bit-for-bit: field `ggml_match` is true/false (null when ggml was not available). Any mismatch is
printed and listed in the fixture's `ggml_mismatches`.
Deterministic. Takes a few minutes for the 1.5B model on 2 cores.
"""

import ctypes
import glob
import hashlib
import os
import sys
import time
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGUFReader
from gguf.quants import dequantize

from common import FIXTURES_DIR, model_path, selected_models, file_sha256, write_json_lines


def _load_ggml():
    """ggml's per-type `to_float` from llama-cpp-python's bundled libggml-base, or None."""
    try:
        import llama_cpp  # noqa: F401
    except Exception:
        return None
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    cands = sorted(glob.glob(os.path.join(libdir, "libggml-base.so*")))
    if not cands:
        return None
    lib = ctypes.CDLL(cands[0])

    # struct ggml_type_traits (ggml/include/ggml.h in the vendored llama.cpp):
    #   const char * type_name; int64_t blck_size; int64_t blck_size_interleave; size_t type_size;
    #   bool is_quantized; ggml_to_float_t to_float; ggml_from_float_t from_float_ref;
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    class Traits(ctypes.Structure):
        _fields_ = [
            ("type_name", ctypes.c_char_p),
            ("blck_size", ctypes.c_int64),
            ("blck_size_interleave", ctypes.c_int64),
            ("type_size", ctypes.c_size_t),
            ("is_quantized", ctypes.c_bool),
            ("to_float", ctypes.c_void_p),
            ("from_float_ref", ctypes.c_void_p),
        ]

    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]

    def to_f32(raw: np.ndarray, qtype: int, n_elements: int):
        tr = lib.ggml_get_type_traits(qtype).contents
        if qtype == 0:  # F32
            return raw.view(np.float32).reshape(-1)
        if not tr.to_float:
            return None
        name = tr.type_name.decode()
        assert name == gguf.GGMLQuantizationType(qtype).name.lower() or name.upper() == gguf.GGMLQuantizationType(qtype).name, (name, qtype)
        src = np.ascontiguousarray(raw)
        out = np.empty(n_elements, dtype=np.float32)
        to_float_t(tr.to_float)(src.ctypes.data, out.ctypes.data, n_elements)
        return out

    return to_f32


def digest(values: np.ndarray):
    assert values.dtype == np.float32, values.dtype
    v = np.ascontiguousarray(values.reshape(-1)).astype("<f4", copy=False)
    h = hashlib.sha256(memoryview(v).cast("B")).hexdigest()
    return h, float(np.sum(v, dtype=np.float64)), [float(x) for x in v[:8]]


def one_model(short, filename, ggml_to_f32):
    path = model_path(filename)
    t0 = time.time()
    reader = GGUFReader(str(path))
    rows = []
    mismatches = []
    for t in reader.tensors:
        ne = [int(x) for x in t.shape]  # GGUFReader keeps GGUF ne order (innermost first)
        n = int(np.prod(ne))
        assert n == int(t.n_elements)
        deq = dequantize(t.data, t.tensor_type)
        if deq.dtype != np.float32:
            deq = deq.astype(np.float32)
        assert deq.size == n, (t.name, deq.shape, ne)
        sha, total, head = digest(deq)
        match = None
        if ggml_to_f32 is not None:
            ref = ggml_to_f32(np.asarray(t.data), int(t.tensor_type), n)
            if ref is not None:
                match = bool(np.array_equal(ref.view(np.uint32), deq.reshape(-1).view(np.uint32)))
                if not match:
                    bad = np.flatnonzero(ref.view(np.uint32) != deq.reshape(-1).view(np.uint32))
                    sha_g, sum_g, _ = digest(ref)
                    mismatches.append({"name": t.name, "n_differ": int(bad.size), "first_index": int(bad[0]),
                                       "gguf_py": float(deq.reshape(-1)[bad[0]]), "ggml": float(ref[bad[0]]),
                                       "ggml_sha256": sha_g, "ggml_sum": sum_g})
                    print(f"  MISMATCH {t.name} {t.tensor_type.name}: {bad.size} values differ", flush=True)
        rows.append({"name": t.name, "type": t.tensor_type.name, "shape": ne, "n_elements": n,
                     "sha256": sha, "sum": total, "head": head, "ggml_match": match})
        del deq
    dt = time.time() - t0
    out = FIXTURES_DIR / "dequant" / f"{short}.json"
    head = {
        "model": filename,
        "sha256": file_sha256(path),
        "reference": "gguf-py %s (numpy %s): GGUFReader + gguf.quants.dequantize -> float32; sha256 over little-endian f32 bytes "
                     "in file order (ne[0] fastest); sum = numpy float64 pairwise sum; head = first 8 values. "
                     "ggml_match: bit-exact comparison with ggml's C to_float (llama-cpp-python's libggml-base)."
                     % (version("gguf"), np.__version__),
        "n_tensors": len(rows),
        "types": sorted({r["type"] for r in rows}),
    }
    write_json_lines(out, head, "tensors", rows, tail={"ggml_mismatches": mismatches})
    print(f"{short}: {len(rows)} tensors in {dt:.1f}s, ggml mismatches: {len(mismatches)} -> {out}", flush=True)


def main():
    ggml_to_f32 = _load_ggml()
    if ggml_to_f32 is None:
        print("note: llama_cpp not importable; skipping the ggml bit-exact cross-check", file=sys.stderr)
    t0 = time.time()
    for short, filename in selected_models().items():
        one_model(short, filename, ggml_to_f32)
    print(f"total {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
