//! The model-level exactness test (DESIGN.md §2) on the real GGUF models, on the CPU backend in both precisions:
//! the logits of a ~100-token sequence filled in one chunk equal, bit for bit at every position,
//! - chunks of 1 (decoding one token at a time), 7, 64, and a mixed 1/7/64/3 pattern;
//! - the same sequence sharing every call with a second sequence (rows interleaved, other block tables);
//! - a verify window: a committed prefix, then rows that see their predecessors through `RowAttn::tree`.

use crate::common::{alloc_kv, batch, first_bit_difference, gguf_model, run_chunked, token_ids, Row, Seq};
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision};
use tf_models::Model;

const LEN: usize = 100;

fn assert_same(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    if let Some((p, c, a, b)) = first_bit_difference(got, want) {
        panic!("{what}: position {p} logit {c}: {a:e} ({:#x}) vs {b:e} ({:#x})", a.to_bits(), b.to_bits());
    }
}

/// Two sequences filled together, `chunk` rows of each per call, rows interleaved. Returns each one's logits.
fn run_pair(be: &dyn Backend, model: &dyn Model, a: &[u32], b: &[u32], chunk: usize) -> [Vec<Vec<f32>>; 2] {
    let seqs = [Seq::new(a.len(), 0, 2), Seq::new(b.len(), 1, 2)];
    let blocks = seqs.iter().map(|s| s.max_block()).max().unwrap() as usize + 1;
    let mut kv = alloc_kv(be, model, blocks);
    let toks = [a, b];
    let mut out = [Vec::new(), Vec::new()];
    let mut start = 0;
    while start < a.len().max(b.len()) {
        let mut rows = Vec::new();
        for p in start..start + chunk {
            for (s, t) in toks.iter().enumerate() {
                if p < t.len() {
                    rows.push(Row { seq: s, pos: p, token: t[p] });
                }
            }
        }
        let logits = be.to_host(&model.forward(be, &batch(&[&seqs[0], &seqs[1]], &rows), &mut kv));
        for (row, l) in rows.iter().zip(logits.chunks(model.vocab_size())) {
            out[row.seq].push(l.to_vec());
        }
        start += chunk;
    }
    out
}

/// A committed prefix of `prefix` positions filled in one chunk, then the rest as one window whose rows attend the
/// prefix through the block table and each other through `tree` (as a draft verify does).
fn run_window(be: &dyn Backend, model: &dyn Model, tokens: &[u32], prefix: usize) -> Vec<Vec<f32>> {
    let seq = Seq::new(tokens.len(), 2, 3);
    let mut kv = alloc_kv(be, model, seq.max_block() as usize + 1);
    let rows: Vec<Row> = (0..prefix).map(|p| Row { seq: 0, pos: p, token: tokens[p] }).collect();
    let mut out: Vec<Vec<f32>> = be
        .to_host(&model.forward(be, &batch(&[&seq], &rows), &mut kv))
        .chunks(model.vocab_size())
        .map(<[f32]>::to_vec)
        .collect();
    let rows: Vec<Row> = (prefix..tokens.len()).map(|p| Row { seq: 0, pos: p, token: tokens[p] }).collect();
    let mut b = batch(&[&seq], &rows);
    for ra in &mut b.attn.rows {
        ra.ctx = prefix as u32;
        ra.tree = (prefix as u32..=ra.pos).map(|q| (q, seq.slot(q as usize))).collect();
    }
    out.extend(be.to_host(&model.forward(be, &b, &mut kv)).chunks(model.vocab_size()).map(<[f32]>::to_vec));
    out
}

fn exactness(short: &str, precision: Precision) {
    let be = CpuBackend::new(2, precision);
    let model = gguf_model(&be, short);
    let m = model.as_ref();
    let tokens = token_ids(LEN, m.vocab_size(), 1);
    let whole = run_chunked(&be, m, &tokens, &[LEN]);
    let tag = format!("{short} {}", precision.name());
    for chunks in [&[1][..], &[7], &[64], &[1, 7, 64, 3]] {
        assert_same(&format!("{tag}: chunks {chunks:?} vs one chunk"), &run_chunked(&be, m, &tokens, chunks), &whole);
    }
    let other = token_ids(61, m.vocab_size(), 2);
    let other_solo = run_chunked(&be, m, &other, &[other.len()]);
    let [a, b] = run_pair(&be, m, &tokens, &other, 13);
    assert_same(&format!("{tag}: shared calls vs solo (first sequence)"), &a, &whole);
    assert_same(&format!("{tag}: shared calls vs solo (second sequence)"), &b, &other_solo);
    assert_same(&format!("{tag}: tree window vs one chunk"), &run_window(&be, m, &tokens, 90), &whole);
    eprintln!("{tag}: {LEN} positions bit-identical across chunkings, shared calls and a tree window");
}

#[test]
fn smollm2_checkpoint() {
    exactness("smollm2", Precision::Checkpoint);
}

#[test]
fn smollm2_full() {
    exactness("smollm2", Precision::Full);
}

#[test]
fn qwen05_checkpoint() {
    exactness("qwen05", Precision::Checkpoint);
}

#[test]
fn qwen05_full() {
    exactness("qwen05", Precision::Full);
}

#[test]
fn gemma3_checkpoint() {
    exactness("gemma3", Precision::Checkpoint);
}

#[test]
fn gemma3_full() {
    exactness("gemma3", Precision::Full);
}
