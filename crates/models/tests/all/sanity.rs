//! Greedy continuation of a plain prompt on the real models: the next token after "... The capital of Italy is"
//! must be " Rome", and a few more greedy tokens are printed (compare with llama.cpp by eye). The prompt's token
//! ids are llama.cpp's (from `tests/data/gguf_reference.json`), so this needs no tokenizer.

use crate::common::{alloc_kv, argmax, batch, gguf_model, Row, Seq};
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, ConfigView, Precision};
use tf_loader::gguf::GgufFile;

fn prompt_ids(case: &str) -> Vec<u32> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf_reference.json");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    r["models"][case]["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The vocabulary's text of token `id`, with the byte-level BPE / SentencePiece space marks turned into spaces.
fn token_text(vocab: &[String], id: u32) -> String {
    vocab[id as usize].replace(['Ġ', '▁'], " ").replace('Ċ', "\n")
}

/// Greedy-decodes `n` tokens after the prompt (prompt in one chunk, then one row per step); returns the ids.
fn greedy(be: &dyn Backend, short: &str, n: usize) -> (Vec<u32>, Vec<String>) {
    let file = GgufFile::open(tf_testkit::model_path(short)).unwrap();
    let vocab = file.get_str_array("tokenizer.ggml.tokens").unwrap();
    let model = gguf_model(be, short);
    let mut tokens = prompt_ids(short);
    let prompt_len = tokens.len();
    let seq = Seq::new(prompt_len + n, 0, 1);
    let mut kv = alloc_kv(be, model.as_ref(), seq.max_block() as usize + 1);
    let mut rows: Vec<Row> = tokens.iter().enumerate().map(|(p, &t)| Row { seq: 0, pos: p, token: t }).collect();
    for _ in 0..n {
        let mut b = batch(&[&seq], &rows);
        b.logit_rows = vec![rows.len() - 1];
        let next = argmax(&be.to_host(&model.forward(be, &b, &mut kv))) as u32;
        rows = vec![Row { seq: 0, pos: tokens.len(), token: next }];
        tokens.push(next);
    }
    (tokens[prompt_len..].to_vec(), vocab)
}

fn check_rome(short: &str, precision: Precision) {
    let be = CpuBackend::new(2, precision);
    let (ids, vocab) = greedy(&be, short, 8);
    let text: String = ids.iter().map(|&i| token_text(&vocab, i)).collect();
    eprintln!("{short} {}: greedy continuation {ids:?} = {text:?}", precision.name());
    assert_eq!(token_text(&vocab, ids[0]), " Rome", "{short}: first greedy token");
}

#[test]
fn smollm2_says_rome() {
    check_rome("smollm2", Precision::Checkpoint);
    check_rome("smollm2", Precision::Full);
}

#[test]
fn qwen05_says_rome() {
    check_rome("qwen05", Precision::Checkpoint);
}

#[test]
fn gemma3_says_rome() {
    check_rome("gemma3", Precision::Checkpoint);
}
