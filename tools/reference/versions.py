"""Print the versions of the reference tools (make-fixtures.sh writes this to fixtures/VERSIONS.txt).

Run:  .venv/bin/python tools/reference/versions.py
"""

import platform
from importlib.metadata import version

for pkg in ["gguf", "llama_cpp_python", "transformers", "tokenizers", "torch", "jinja2", "numpy",
            "sentencepiece", "protobuf", "accelerate"]:
    try:
        print(f"{pkg}=={version(pkg)}")
    except Exception:
        print(f"{pkg}: not installed")
print(f"python=={platform.python_version()}")
