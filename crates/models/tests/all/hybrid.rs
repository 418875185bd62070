//! The hybrid family (`nemotron_h`: Mamba-2 + attention + squared-ReLU MLP layers) on its tiny random checkpoint
//! (`fixtures/tiny/nemotron_h/`, written by `tools/reference/tiny_hybrid.py`):
//! - logits within 1e-4 × max|logit| of transformers' fp32 forward (its chunked scan), greedy tokens equal;
//! - chunked == whole, bitwise, in both precisions (the state crosses chunks through registers);
//! - a sequence's bits do not depend on other sequences sharing the call (each has its own state);
//! - a verify window that keeps one state per row, resumed from any row's register, equals the serial run.

use crate::common::{
    argmax, batch, first_bit_difference, hf_model, run_with_states as run_chunked, state_cache as cache,
    state_chain as chain, Row, Seq,
};
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision, StateIo, StateSrc};

fn dir() -> std::path::PathBuf {
    tf_testkit::repo_root().join("fixtures/tiny/nemotron_h")
}

/// The fixture's input ids, transformers' logits at every position and its greedy tokens.
fn reference() -> (Vec<u32>, Vec<Vec<f32>>, Vec<u32>) {
    let g = crate::goldens::golden("nemotron_h");
    (g.ids, g.logits, g.greedy)
}

#[test]
fn nemotron_h_matches_transformers() {
    let (ids, want, greedy) = reference();
    let be = CpuBackend::new(2, Precision::Full);
    let model = hf_model(&be, &dir());
    assert_eq!(model.family(), "nemotron_h");
    let ours = run_chunked(&be, model.as_ref(), &ids, &[ids.len()]);
    let mut worst = 0f32;
    for (p, (a, b)) in ours.iter().zip(&want).enumerate() {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        worst = a.iter().zip(b).fold(worst, |w, (x, y)| w.max((x - y).abs() / scale));
        assert_eq!(argmax(a), argmax(b), "argmax at position {p}");
    }
    eprintln!("nemotron_h: worst logit error {worst:.2e} × max|logit|");
    assert!(worst <= 1e-4, "nemotron_h: logits off by {worst:.2e} × max|logit|");

    // Greedy: the prompt in one chunk, then one row per step, each from the register the last one wrote.
    let mut tokens = ids.clone();
    let mut got = Vec::new();
    let seq = Seq::new(ids.len() + greedy.len(), 1, 1);
    let mut kv = cache(&be, model.as_ref(), seq.max_block() as usize + 1, 2);
    let (mut start, mut w) = (0, 0u32);
    for _ in 0..greedy.len() {
        let rows: Vec<Row> = (start..tokens.len()).map(|p| Row { seq: 0, pos: p, token: tokens[p] }).collect();
        let mut b = batch(&[&seq], &rows);
        b.states = chain(start, rows.len(), w);
        b.logit_rows = vec![rows.len() - 1];
        let next = argmax(&be.to_host(&model.forward(&be, &b, &mut kv))) as u32;
        got.push(next);
        start = tokens.len();
        tokens.push(next);
        w = 1 - w;
    }
    assert_eq!(got, greedy, "greedy tokens");
}

#[test]
fn nemotron_h_chunked_equals_whole() {
    let (ids, _, _) = reference();
    for precision in [Precision::Full, Precision::Checkpoint] {
        let be = CpuBackend::new(2, precision);
        let model = hf_model(&be, &dir());
        let whole = run_chunked(&be, model.as_ref(), &ids, &[ids.len()]);
        for chunks in [&[1][..], &[5], &[3, 1, 7]] {
            let got = run_chunked(&be, model.as_ref(), &ids, chunks);
            assert_eq!(first_bit_difference(&got, &whole), None, "{}: chunks {chunks:?}", precision.name());
        }
    }
}

/// Two sequences in one call (their rows interleaved, each chaining its own state) give each the bits it has
/// alone.
#[test]
fn nemotron_h_sequences_do_not_share_state() {
    let (ids, _, _) = reference();
    let be = CpuBackend::new(2, Precision::Full);
    let model = hf_model(&be, &dir());
    let other: Vec<u32> = ids.iter().rev().map(|t| (t * 7 + 3) % 256).collect();
    let alone = run_chunked(&be, model.as_ref(), &ids, &[ids.len()]);
    let (a, b) = (Seq::new(ids.len(), 1, 2), Seq::new(other.len(), 2, 2));
    let mut kv = cache(&be, model.as_ref(), 2 * ids.len().div_ceil(16) + 3, 2);
    let mut rows = Vec::new();
    let mut io = Vec::new();
    for p in 0..ids.len() {
        for (s, toks) in [(0, &ids), (1, &other)] {
            rows.push(Row { seq: s, pos: p, token: toks[p] });
            let src = if p == 0 { StateSrc::Zero } else { StateSrc::Row(io.len() - 2) };
            io.push(StateIo { src, dst: None });
        }
    }
    let mut bt = batch(&[&a, &b], &rows);
    bt.states = io;
    let host = be.to_host(&model.forward(&be, &bt, &mut kv));
    let shared: Vec<Vec<f32>> = host.chunks(model.vocab_size()).step_by(2).map(<[f32]>::to_vec).collect();
    assert_eq!(first_bit_difference(&shared, &alone), None);
}

/// A verify window: the prompt's first `n` tokens, then `w` rows in one call each writing its own register. For
/// every accepted count `j`, continuing from row `j`'s register gives the serial run's bits (rollback of the
/// rejected rows is simply not reading their registers).
#[test]
fn nemotron_h_window_rows_keep_their_states() {
    let (ids, _, _) = reference();
    let be = CpuBackend::new(2, Precision::Full);
    let model = hf_model(&be, &dir());
    let serial = run_chunked(&be, model.as_ref(), &ids, &[1]);
    let (n, w) = (10, 6);
    for j in 0..w {
        let seq = Seq::new(ids.len(), 1, 1);
        let mut kv = cache(&be, model.as_ref(), seq.max_block() as usize + 1, 2 + w);
        let vocab = model.vocab_size();
        // The prefix, then the window (rows n..n+w, registers 2..2+w), then the rest from row j's register.
        let rows = |a: usize, b: usize| (a..b).map(|p| Row { seq: 0, pos: p, token: ids[p] }).collect::<Vec<_>>();
        let mut b = batch(&[&seq], &rows(0, n));
        b.states = chain(0, n, 0);
        model.forward(&be, &b, &mut kv);
        let mut b = batch(&[&seq], &rows(n, n + w));
        b.states = (0..w)
            .map(|r| StateIo {
                src: if r == 0 { StateSrc::Reg(0) } else { StateSrc::Row(r - 1) },
                dst: Some(2 + r as u32),
            })
            .collect();
        let window = be.to_host(&model.forward(&be, &b, &mut kv));
        for (r, row) in window.chunks(vocab).enumerate() {
            assert_eq!(first_bit_difference(&[row.to_vec()], &[serial[n + r].clone()]), None, "window row {r}");
        }
        let at = n + j + 1;
        let mut b = batch(&[&seq], &rows(at, ids.len()));
        b.states = chain(at, ids.len() - at, 1);
        b.states[0].src = StateSrc::Reg(2 + j as u32);
        let rest: Vec<Vec<f32>> =
            be.to_host(&model.forward(&be, &b, &mut kv)).chunks(vocab).map(<[f32]>::to_vec).collect();
        assert_eq!(first_bit_difference(&rest, &serial[at..]), None, "resumed after window row {j}");
    }
}
