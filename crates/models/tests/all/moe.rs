//! Mixture-of-experts routing is row-exact, on the tiny Qwen3-MoE, Mixtral and gpt-oss checkpoints (fixtures/tiny/): a
//! sequence's logits at every position are bitwise the same whether its prompt runs alone or in one call with 1 to
//! 63 rows of other sequences, which choose other experts (random tokens) or the same ones (the same tokens at
//! other places in the cache), in both precisions.

use crate::common::{alloc_kv, batch, first_bit_difference, hf_model, run_chunked, token_ids, Row, Seq};
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision};

const LEN: usize = 20;

/// The target's logits when its `LEN` rows share one call with `others` rows of other sequences (at most 8 rows
/// each), rows interleaved. `same` gives the others the target's own tokens (so they choose the same experts).
fn shared(be: &CpuBackend, model: &dyn tf_models::Model, target: &[u32], others: usize, same: bool) -> Vec<Vec<f32>> {
    let mut lens = Vec::new();
    let mut left = others;
    while left > 0 {
        let n = left.min(8);
        lens.push(n);
        left -= n;
    }
    let mut seqs = vec![Seq::new(LEN, 0, lens.len() as u32 + 1)];
    let mut toks = vec![target.to_vec()];
    for (i, &n) in lens.iter().enumerate() {
        seqs.push(Seq::new(n, i as u32 + 1, lens.len() as u32 + 1));
        toks.push(if same { target[..n].to_vec() } else { token_ids(n, model.vocab_size(), 100 + i as u64) });
    }
    let blocks = seqs.iter().map(Seq::max_block).max().unwrap() as usize + 1;
    let mut kv = alloc_kv(be, model, blocks);
    let mut rows = Vec::new();
    for p in 0..LEN {
        for (s, t) in toks.iter().enumerate() {
            if p < t.len() {
                rows.push(Row { seq: s, pos: p, token: t[p] });
            }
        }
    }
    let refs: Vec<&Seq> = seqs.iter().collect();
    let logits = be.to_host(&model.forward(be, &batch(&refs, &rows), &mut kv));
    rows.iter().zip(logits.chunks(model.vocab_size())).filter(|(r, _)| r.seq == 0).map(|(_, l)| l.to_vec()).collect()
}

fn check(family: &str) {
    let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
    for precision in [Precision::Full, Precision::Checkpoint] {
        let be = CpuBackend::new(2, precision);
        let model = hf_model(&be, &dir);
        let target = token_ids(LEN, model.vocab_size(), 7);
        let alone = run_chunked(&be, model.as_ref(), &target, &[LEN]);
        for others in [1, 2, 5, 16, 40, 63] {
            for same in [false, true] {
                let got = shared(&be, model.as_ref(), &target, others, same);
                assert_eq!(
                    first_bit_difference(&got, &alone),
                    None,
                    "{family} {}: with {others} other rows (same experts: {same})",
                    precision.name()
                );
            }
        }
    }
}

#[test]
fn qwen3moe_routing_is_row_exact() {
    check("qwen3moe");
}

#[test]
fn mixtral_routing_is_row_exact() {
    check("mixtral");
}

/// gpt-oss: a router with a bias, experts with biases and the clamped SwiGLU, attention sinks and windows of 4.
#[test]
fn gpt_oss_routing_is_row_exact() {
    check("gpt_oss");
}
