//! Property test: mutated and truncated GGUF files give errors, never a panic, an out-of-bounds read or an
//! allocation larger than the file. A counting global allocator records the largest single allocation made
//! while a file is parsed.
//!
//! The seed is fresh every run and printed; set TF_FUZZ_SEED to replay one.

use rand::{rngs::StdRng, Rng, SeedableRng};
use std::io::Write;
use tf_core::{DType, WeightSource};
use tf_loader::gguf::{GgufArray, GgufFile, GgufValue};
use tf_loader::gguf_writer::GgufWriter;

#[global_allocator]
static A: tf_testkit::alloc::Counting = tf_testkit::alloc::Counting;

fn seed() -> u64 {
    let s = std::env::var("TF_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("gguf fuzz seed: {s} (replay with TF_FUZZ_SEED={s})");
    s
}

/// Opens `bytes` as a file; checks the outcome is Ok or Err without panicking, that every listed tensor's
/// bytes are readable, and that no allocation exceeded the file size plus a small constant.
fn check(bytes: &[u8], what: &str) -> bool {
    check_measured(bytes, what).0
}

/// [`check`], also returning the largest single allocation made while opening and reading.
fn check_measured(bytes: &[u8], what: &str) -> (bool, usize) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    let (r, largest) = tf_testkit::alloc::largest_allocation(|| {
        std::panic::catch_unwind(|| match GgufFile::open(f.path()) {
            Ok(g) => {
                for t in g.tensors() {
                    let b = g.bytes(&t.name).expect("listed tensor readable");
                    assert_eq!(b.len() as u64, t.nbytes());
                }
                true
            }
            Err(e) => {
                assert!(!e.problem.is_empty());
                assert!(!e.to_string().contains('\n'), "error is one line: {e}");
                false
            }
        })
    });
    let ok = r.unwrap_or_else(|_| panic!("{what}: the reader panicked"));
    assert!(
        largest <= bytes.len() + (64 << 10),
        "{what}: an allocation of {largest} bytes for a {}-byte file",
        bytes.len()
    );
    (ok, largest)
}

/// A file shaped like a real checkpoint: a vocabulary, merges, scores, token types, nested arrays and tensors.
fn realistic() -> Vec<u8> {
    let tokens: Vec<String> = (0..3000).map(|i| format!("tok{i}")).collect();
    let merges: Vec<String> = (0..2000).map(|i| format!("t o{i}")).collect();
    GgufWriter::new()
        .kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U32(2))
        .kv("llama.rope.freq_base", GgufValue::F32(10000.0))
        .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(tokens)))
        .kv("tokenizer.ggml.merges", GgufValue::Array(GgufArray::String(merges)))
        .kv("tokenizer.ggml.scores", GgufValue::Array(GgufArray::F32(vec![0.5; 3000])))
        .kv("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(vec![1; 3000])))
        .kv("nested", GgufValue::Array(GgufArray::Array(vec![GgufArray::U64(vec![1, 2]), GgufArray::Bool(vec![true])])))
        .kv("flag", GgufValue::Bool(true))
        .kv("f64", GgufValue::F64(1.0))
        .tensor_f32("token_embd.weight", &[8, 4], &[0.25; 32])
        .tensor("blk.0.attn_q.weight", DType::Q4K, &[256, 2], vec![7; 288])
        .tensor("blk.0.ffn.weight", DType::Q8_0, &[64, 3], vec![1; 204])
        .tensor("blk.0.norm", DType::F16, &[8], vec![0; 16])
        .to_bytes()
}

#[test]
fn random_mutations_never_panic_or_overallocate() {
    let base = realistic();
    let (opened, largest) = check_measured(&base, "unmutated");
    assert!(opened, "the unmutated file opens");
    // The allocator really measures: the 3000-token vocabulary alone is a 72,000-byte Vec<String>.
    assert!(largest >= 3000 * 24, "allocation tracking is live ({largest})");
    let mut rng = StdRng::seed_from_u64(seed());
    let n = if cfg!(debug_assertions) { 400 } else { 2000 };
    let (mut oks, mut errs) = (0, 0);
    for i in 0..n {
        let mut b = base.clone();
        match rng.gen_range(0..5) {
            // Flip a few random bytes anywhere.
            0 => {
                for _ in 0..rng.gen_range(1..8) {
                    let at = rng.gen_range(0..b.len());
                    b[at] ^= 1 << rng.gen_range(0..8);
                }
            }
            // Overwrite an 8-byte word in the header with a huge or random value (counts, lengths, dims, offsets).
            1 | 2 => {
                let at = rng.gen_range(0..b.len().min(80_000) - 8);
                let v: u64 = match rng.gen_range(0..4) {
                    0 => u64::MAX,
                    1 => 1 << rng.gen_range(20..63),
                    2 => rng.gen(),
                    _ => rng.gen_range(0..4096),
                };
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            // Overwrite a 4-byte word (types, dims counts).
            3 => {
                let at = rng.gen_range(0..b.len() - 4);
                b[at..at + 4].copy_from_slice(&rng.gen_range(0u32..64).to_le_bytes());
            }
            // Truncate.
            _ => b.truncate(rng.gen_range(0..b.len())),
        }
        if check(&b, &format!("mutation #{i}")) {
            oks += 1;
        } else {
            errs += 1;
        }
    }
    eprintln!("{n} mutations: {oks} opened, {errs} refused");
    assert!(errs > 0, "mutations must produce some errors");
}

#[test]
fn truncation_at_every_header_length_is_refused() {
    let base = realistic();
    let g = {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&base).unwrap();
        GgufFile::open(f.path()).unwrap().data_start()
    };
    // Every length inside the header, then every length inside the data section.
    let mut lens: Vec<usize> = (0..g as usize).step_by(7).collect();
    lens.extend(g as usize..base.len());
    for len in lens {
        assert!(!check(&base[..len], &format!("truncated to {len}")), "truncated to {len} opened");
    }
}

/// Found by fuzzing (`fuzz/`, target `gguf`): a tensor name or key holding a newline made a two-line error.
/// Names and keys from the file are escaped in messages.
#[test]
fn names_with_control_characters_give_one_line_errors() {
    let zero_dims = GgufWriter::new().tensor("<|im_start|>\n\0x", DType::F32, &[], vec![]).to_bytes();
    let dup_key = GgufWriter::new().kv("k\r\n", GgufValue::U8(1)).kv("k\r\n", GgufValue::U8(2)).to_bytes();
    for (bytes, escaped) in [(zero_dims, "<|im_start|>\\n\\u{0}x"), (dup_key, "k\\r\\n")] {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        let e = GgufFile::open(f.path()).unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains(['\n', '\r', '\0']), "{msg:?}");
        assert!(msg.contains(escaped), "{msg:?}");
        assert!(!check(&bytes, "escaped names"));
    }
}
