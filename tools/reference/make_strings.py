"""Write fixtures/tokenizer/strings.json: the tokenizer test strings (a JSON list of str).

Run:  .venv/bin/python tools/reference/make_strings.py
Deterministic: the list below is the source of truth; the JSON is just its serialisation.
No NUL characters (llama.cpp's C API takes C strings). All strings are valid Unicode (no lone surrogates).
"""

import json
import unicodedata

from common import FIXTURES_DIR

_CAFE_NFC = unicodedata.normalize("NFC", "café naïve façade Ångström")
_CAFE_NFD = unicodedata.normalize("NFD", _CAFE_NFC)
assert _CAFE_NFC != _CAFE_NFD

STRINGS = [
    # --- empty / whitespace only
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    " \n ",
    "\r\n",
    "   \t  \n\t\t\n    ",
    # --- plain ASCII
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " Hello world",
    "Hello world ",
    "  leading two spaces and trailing two  ",
    "multiple    spaces   between     words",
    "tab\tseparated\tvalues",
    "line one\nline two\n\nline four\n",
    "Once upon a time,\n\n\nthere were three newlines.",
    # --- case, punctuation, contractions
    "HELLO World hello WoRlD",
    "don't can't won't it's I'm you're they've we'd",
    "I'LL DON'T WE'VE SHE'D THEY'RE",
    "Wait... what?!?! (really) [yes] {no} <maybe>",
    "!!!???...---___===+++***&&&%%%$$$###@@@",
    "e-mail: someone@example.com, url: https://example.com/a?b=c&d=e#f",
    # --- numbers
    "12345678",
    "3.14159",
    "1,000,000",
    "0 1 22 333 4444 55555 666666",
    "v1.2.3-beta+build.45 on 2024-01-31T12:34:56Z",
    "-42 +7 1e-10 0x1F 0b1010 1_000",
    # --- code
    "def add(a, b):\n    return a + b\n",
    "class Foo:\n    def __init__(self):\n        self.x = [i ** 2 for i in range(10)]\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!("{:?}", v);\n}\n',
    '{"name": "tensorfold", "version": 1, "tags": ["a", "b"], "nested": {"ok": true, "n": null}}',
    "if (x != y && z <= 3 || !w) { return -1; } // comment",
    "\tif x:\n\t\tpass\n\telse:\n\t\t\tbreak",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    # --- accents, composed vs decomposed
    _CAFE_NFC,
    _CAFE_NFD,
    "señor niño mañana über Müller straße",
    "e\u0301 vs \u00e9 and n\u0303 vs \u00f1",
    # --- scripts
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Γειά σου Κόσμε",
    "สวัสดีชาวโลก",
    # --- CJK
    "你好，世界！我们今天学习分词。",
    "こんにちは世界。カタカナとひらがな、漢字。",
    "안녕하세요 세계",
    "中文English混合mixed テキスト",
    # --- emoji
    "😀",
    "I ❤️ Rust 🦀🔥",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag",
    "🇫🇷🇯🇵🇺🇸 flags",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    # --- rare / invisible characters
    "zero\u200bwidth\u200djoiner\u200c and soft\u00adhyphen",
    "\ufeffBOM at start",
    "control\u0001chars\u0007and\u007fdel",
    "non\u00a0breaking\u2003em\u3000ideographic spaces",
    "\U0001d54f\U0001d552\U0001d55d math letters and \u2211\u222b\u221e",
    # --- special-token text for each family
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn>model\nHello!<end_of_turn>\n",
    "<bos>",
    "<eos>",
    "<bos>hello<eos>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|im_start|> <|im_end|>  <|endoftext|>",
    "<|im_start",
    "<s> </s> <unk> [INST] [/INST] <pad>",
    # --- long / repetitive
    "a" * 200,
    "ab " * 100,
    " " * 64,
    "\n" * 40,
    "hello " * 60 + "world",
    ("The rain in Spain stays mainly in the plain. " * 12).strip(),
]


def main():
    assert len(STRINGS) == len(set(STRINGS)), "duplicate strings"
    assert all("\x00" not in s for s in STRINGS)
    out = FIXTURES_DIR / "tokenizer" / "strings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join("  " + json.dumps(s, ensure_ascii=False) for s in STRINGS)
    out.write_text("[\n" + body + "\n]\n", encoding="utf-8")
    print(f"wrote {out} ({len(STRINGS)} strings)")


if __name__ == "__main__":
    main()
