"""Write fixtures/tokenizer/<short>.json: reference token ids for fixtures/tokenizer/strings.json.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/tokenizer_fixtures.py
      (FIXTURE_MODELS=smollm2,qwen05 to restrict; make_strings.py must have run first)

For every string and model:
  llama_cpp              llama.cpp (via llama-cpp-python, vocab_only=True) tokenize(text, add_special=False, parse_special=True)
  llama_cpp_add_special  same with add_special=True (llama.cpp then adds BOS/EOS per the GGUF's add_bos/add_eos flags)
  llama_cpp_detok        llama.cpp's llama_detokenize of the `llama_cpp` ids (remove_special=False,
                         unparse_special=True, i.e. special tokens are rendered as their text), as UTF-8 (errors="replace")
  transformers           AutoTokenizer.from_pretrained(models/, gguf_file=...).encode(text, add_special_tokens=False)
  transformers_add_special   the same with add_special_tokens=True
llama.cpp is the reference; strings where transformers differs are listed under "disagreements".
Deterministic (no sampling, no network: set HF_HUB_OFFLINE=1).
"""

import ctypes
import json
import os
import time
import traceback
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llama_cpp  # noqa: E402
from gguf import GGUFReader  # noqa: E402

from common import FIXTURES_DIR, MODELS_DIR, file_sha256, model_path, selected_models, write_json_lines  # noqa: E402


def load_strings():
    return json.loads((FIXTURES_DIR / "tokenizer" / "strings.json").read_text(encoding="utf-8"))


class LlamaCppVocab:
    """Thin wrapper over llama.cpp's C tokenizer API (as exposed by llama-cpp-python)."""

    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def tokenize(self, text: str, add_special: bool):
        b = text.encode("utf-8")
        # Llama.tokenize(text, add_bos, special): add_bos maps to llama_tokenize's add_special.
        return [int(t) for t in self.llm.tokenize(b, add_bos=add_special, special=True)]

    def detokenize(self, ids):
        n = len(ids)
        arr = (llama_cpp.llama_token * max(n, 1))(*ids)
        cap = max(64, 16 * n + 64)
        while True:
            buf = ctypes.create_string_buffer(cap)
            r = llama_cpp.llama_detokenize(self.vocab, arr, n, buf, cap, False, True)
            if r >= 0:
                return buf.raw[:r].decode("utf-8", errors="replace")
            cap = -r + 1

    def vocab_facts(self):
        """What llama.cpp itself decided about this vocabulary (special ids, add flags, end-of-generation set)."""
        v = self.vocab
        n = llama_cpp.llama_vocab_n_tokens(v)
        ids = {
            "bos": llama_cpp.llama_vocab_bos(v), "eos": llama_cpp.llama_vocab_eos(v),
            "eot": llama_cpp.llama_vocab_eot(v), "sep": llama_cpp.llama_vocab_sep(v),
            "nl": llama_cpp.llama_vocab_nl(v), "pad": llama_cpp.llama_vocab_pad(v),
        }
        for k in ["fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"]:
            fn = getattr(llama_cpp, f"llama_vocab_{k}", None)
            if fn is not None:
                ids[k] = fn(v)
        return {
            "n_tokens": n,
            "vocab_type": int(llama_cpp.llama_vocab_type(v)),
            "special_ids": {k: int(x) for k, x in ids.items()},
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
            "eog_ids": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)],
            "n_control": sum(1 for i in range(n) if llama_cpp.llama_vocab_is_control(v, i)),
        }

    def close(self):
        self.llm.close()


def load_transformers(filename):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=filename)


def describe_diff(a, b, pieces):
    """Human note: where two id lists first differ, with the tokens' vocab strings."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1

    def show(ids):
        seg = ids[i:i + 6]
        return "[" + ", ".join(f"{t}:{pieces[t]!r}" if 0 <= t < len(pieces) else str(t) for t in seg) + \
            ("…" if len(ids) > i + 6 else "") + "]"

    return (f"llama.cpp {len(a)} ids vs transformers {len(b)} ids; first difference at index {i}: "
            f"llama.cpp {show(a)} vs transformers {show(b)}")


def one_model(short, filename, strings):
    path = model_path(filename)
    reader = GGUFReader(str(path))
    pieces = reader.fields["tokenizer.ggml.tokens"].contents()
    del reader

    t0 = time.time()
    lc = LlamaCppVocab(path)
    hf, hf_error = None, None
    try:
        hf = load_transformers(filename)
    except Exception as e:  # record why, keep going with llama.cpp only
        hf_error = f"{type(e).__name__}: {e}"
        traceback.print_exc()

    facts = lc.vocab_facts()
    cases, disagreements = [], []
    for s in strings:
        ids = lc.tokenize(s, add_special=False)
        ids_sp = lc.tokenize(s, add_special=True)
        case = {"text": s, "llama_cpp": ids, "llama_cpp_add_special": ids_sp,
                "llama_cpp_detok": lc.detokenize(ids)}
        if hf is not None:
            h = [int(x) for x in hf.encode(s, add_special_tokens=False)]
            h_sp = [int(x) for x in hf.encode(s, add_special_tokens=True)]
            case["transformers"] = h
            case["transformers_add_special"] = h_sp
            if h != ids:
                disagreements.append({"text": s, "kind": "add_special=False", "note": describe_diff(ids, h, pieces)})
            if h_sp != ids_sp:
                disagreements.append({"text": s, "kind": "add_special=True", "note": describe_diff(ids_sp, h_sp, pieces)})
        else:
            case["transformers"] = None
            case["transformers_add_special"] = None
        cases.append(case)
    lc.close()

    roundtrip_fail = [c["text"] for c in cases if c["llama_cpp_detok"] != c["text"]]
    ref = (f"llama.cpp via llama-cpp-python {version('llama_cpp_python')} (Llama(vocab_only=True); tokenize with "
           f"parse_special=True; llama_detokenize(remove_special=False, unparse_special=True)); "
           f"transformers {version('transformers')} + tokenizers {version('tokenizers')} "
           f"(AutoTokenizer.from_pretrained(models_dir, gguf_file=...), tokenizer built from GGUF metadata)")
    if hf_error:
        ref += f"; transformers could NOT load this GGUF's tokenizer: {hf_error}"
    head = {
        "model": filename,
        "sha256": file_sha256(path),
        "reference": ref,
        "transformers_class": type(hf).__name__ if hf is not None else None,
        "llama_cpp_vocab": facts,
        "n_cases": len(cases),
        "detok_roundtrip_failures": roundtrip_fail,
    }
    out = FIXTURES_DIR / "tokenizer" / f"{short}.json"
    write_json_lines(out, head, "cases", cases, tail={"disagreements": disagreements})
    print(f"{short}: {len(cases)} cases, {len(disagreements)} disagreements, "
          f"{len(roundtrip_fail)} detok round-trip failures, {time.time() - t0:.1f}s -> {out}", flush=True)
    for d in disagreements:
        print(f"  DISAGREE [{d['kind']}] {d['text']!r}: {d['note']}")
    for t in roundtrip_fail:
        print(f"  detok != text for {t!r}")


def main():
    strings = load_strings()
    for short, filename in selected_models().items():
        one_model(short, filename, strings)


if __name__ == "__main__":
    main()
