"""Writes fixtures/tiny/byte-tokenizer.json: a byte-level BPE tokenizer with exactly 256 tokens (one per byte,
no merges, no special tokens), for the tiny random checkpoints (vocab 256) so commands that need text — such as
`tensorfold check` on the tiny target/draft pair — can run on them."""
import json
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

alphabet = ByteLevel.alphabet()  # the 256 byte-level characters
# Byte b gets id b: order the alphabet by the byte each character stands for (GPT-2's bytes_to_unicode).
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte_to_char = {b: chr(c) for b, c in zip(bs, cs)}
assert sorted(byte_to_char.values()) == sorted(alphabet)
vocab = {byte_to_char[b]: b for b in range(256)}
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.decoder = decoders.ByteLevel()
text = "héllo wörld 日本"
ids = tok.encode(text).ids
assert ids == list(text.encode()), ids
assert tok.decode(ids) == text
out = sys.argv[1] if len(sys.argv) > 1 else "fixtures/tiny/byte-tokenizer.json"
tok.save(out)
print(out, tok.get_vocab_size())
