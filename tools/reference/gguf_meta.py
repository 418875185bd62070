"""Write fixtures/tokenizer/metadata.json: the tokenizer-relevant GGUF metadata of each model.

Run:  .venv/bin/python tools/reference/gguf_meta.py      (FIXTURE_MODELS=... to restrict)

For each model: every `tokenizer.*` key (arrays summarised: length, element type and the first entries;
`tokenizer.chat_template` as length + sha256), special token ids with their token strings, counts of each
`tokenizer.ggml.token_type` value (1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE) and the
ids/strings of all CONTROL and USER_DEFINED tokens (capped), plus general.architecture / general.name.
Read with gguf-py only. Deterministic.
"""

import collections
import json
from importlib.metadata import version

from gguf import GGUFReader, GGUFValueType

from common import FIXTURES_DIR, model_path, selected_models, sha256_text

TOKEN_TYPE_NAMES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}
ID_KEYS = ["bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id", "seperator_token_id",
           "padding_token_id", "mask_token_id", "cls_token_id", "prefix_token_id", "suffix_token_id",
           "middle_token_id", "fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id", "fim_pad_token_id",
           "fim_rep_token_id", "fim_sep_token_id"]
FLAG_KEYS = ["add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces"]
MAX_LISTED = 64


def one(short, filename):
    r = GGUFReader(str(model_path(filename)))
    F = r.fields
    tokens = F["tokenizer.ggml.tokens"].contents()
    out = {"model": filename, "architecture": F["general.architecture"].contents(),
           "name": F["general.name"].contents() if "general.name" in F else None}
    keys = {}
    for k, f in F.items():
        if not k.startswith("tokenizer."):
            continue
        if f.types and f.types[0] == GGUFValueType.ARRAY:
            v = f.contents()
            keys[k] = {"array_of": f.types[-1].name, "len": len(v), "first": v[:5]}
        elif k == "tokenizer.chat_template":
            t = f.contents()
            keys[k] = {"len": len(t), "sha256": sha256_text(t)}
        else:
            keys[k] = f.contents()
    out["tokenizer_keys"] = keys
    out["ggml_model"] = keys.get("tokenizer.ggml.model")
    out["ggml_pre"] = keys.get("tokenizer.ggml.pre")
    out["n_vocab"] = len(tokens)
    out["n_merges"] = keys["tokenizer.ggml.merges"]["len"] if "tokenizer.ggml.merges" in keys else None
    out["has_scores"] = "tokenizer.ggml.scores" in keys
    out["has_token_type"] = "tokenizer.ggml.token_type" in keys
    out["has_chat_template"] = "tokenizer.chat_template" in keys
    out["special_ids"] = {}
    for k in ID_KEYS:
        if f"tokenizer.ggml.{k}" in F:
            i = int(F[f"tokenizer.ggml.{k}"].contents())
            out["special_ids"][k] = {"id": i, "token": tokens[i] if 0 <= i < len(tokens) else None}
    out["flags"] = {k: F[f"tokenizer.ggml.{k}"].contents() for k in FLAG_KEYS if f"tokenizer.ggml.{k}" in F}
    if "tokenizer.ggml.token_type" in F:
        tt = F["tokenizer.ggml.token_type"].contents()
        c = collections.Counter(tt)
        out["token_type_counts"] = {TOKEN_TYPE_NAMES.get(t, str(t)): n for t, n in sorted(c.items())}
        for t, label in [(3, "control_tokens"), (4, "user_defined_tokens")]:
            ids = [i for i, x in enumerate(tt) if x == t]
            out[label] = {"count": len(ids), "listed": [[i, tokens[i]] for i in ids[:MAX_LISTED]],
                          "truncated": len(ids) > MAX_LISTED}
        byte_ids = [i for i, x in enumerate(tt) if x == 6]
        if byte_ids:
            out["byte_tokens"] = {"count": len(byte_ids), "first": [byte_ids[0], tokens[byte_ids[0]]],
                                  "last": [byte_ids[-1], tokens[byte_ids[-1]]]}
    if "tokenizer.ggml.scores" in F:
        sc = F["tokenizer.ggml.scores"].contents()
        out["scores_summary"] = {"min": min(sc), "max": max(sc), "first": sc[:5]}
    return out


def main():
    res = {"reference": f"gguf-py {version('gguf')} GGUFReader", "models": {}}
    for short, filename in selected_models().items():
        res["models"][short] = one(short, filename)
        m = res["models"][short]
        print(short, m["ggml_model"], m["ggml_pre"], m["n_vocab"], m["n_merges"], m["flags"],
              {k: v["id"] for k, v in m["special_ids"].items()})
    p = FIXTURES_DIR / "tokenizer" / "metadata.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(res, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {p}")


if __name__ == "__main__":
    main()
