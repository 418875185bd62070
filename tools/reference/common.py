"""Shared helpers for the reference-fixture scripts in tools/reference/.

Not run on its own. The scripts import it; they expect to be run with the project's
reference venv (see tools/reference/setup-venv.sh), e.g. `.venv/bin/python tools/reference/X.py`.
"""

import hashlib
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / "models"
FIXTURES_DIR = ROOT / "fixtures"

# short name -> GGUF file name (files fetched by scripts/fetch-models.sh)
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen05": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen15": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


def selected_models():
    """Models to process: all, or the comma-separated short names in $FIXTURE_MODELS."""
    want = os.environ.get("FIXTURE_MODELS")
    if not want:
        return dict(MODELS)
    names = [w.strip() for w in want.split(",") if w.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model short names: {unknown}; known: {list(MODELS)}")
    return {n: MODELS[n] for n in names}


def model_path(filename):
    p = MODELS_DIR / filename
    if not p.exists():
        raise SystemExit(f"missing {p}: run scripts/fetch-models.sh first")
    return p


def file_sha256(path):
    """sha256 of a file, streamed."""
    path = Path(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(s):
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def write_json_lines(path, head, list_key, items, tail=None):
    """Write a JSON object whose scalar fields are indented normally and whose list `list_key`
    has one compact JSON item per line (keeps fixtures small and diff-friendly).
    `head` and `tail` are dicts of fields written before/after the list."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = ["{"]
    fields = [(k, v) for k, v in head.items()]
    parts = []
    for k, v in fields:
        parts.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}")
    if items:
        body = ",\n".join("    " + json.dumps(it, ensure_ascii=False, separators=(",", ":")) for it in items)
        parts.append(f"  {json.dumps(list_key)}: [\n{body}\n  ]")
    else:
        parts.append(f"  {json.dumps(list_key)}: []")
    for k, v in (tail or {}).items():
        if isinstance(v, list) and v:
            body = ",\n".join("    " + json.dumps(it, ensure_ascii=False, separators=(",", ":")) for it in v)
            parts.append(f"  {json.dumps(k)}: [\n{body}\n  ]")
        else:
            parts.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}")
    out.append(",\n".join(parts))
    out.append("}")
    text = "\n".join(out) + "\n"
    json.loads(text)  # sanity: valid JSON
    path.write_text(text, encoding="utf-8")
    return path
