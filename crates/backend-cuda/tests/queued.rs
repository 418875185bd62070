//! Queued argmax ids on CUDA (src/host_ids.rs, backend/queued.rs) and the engine's run-ahead decoding on them
//! (crates/engine/src/ahead.rs):
//! - `argmax_rows_queued` then `take_ids` (downloaded, or after a fed embedding's event) equals `argmax_rows` and
//!   the CPU's argmax, for 1..16 rows with ties, NaN and infinities; `embed_queued` equals `embed` of those ids
//!   bit for bit, also with more work queued behind it before the host takes the ids;
//! - greedy replies of real tiny models running ahead equal the same generator's without running ahead and the
//!   CPU backend's (portable arithmetic), ending at `max_tokens` and at a stop id.
//!
//! Needs a CUDA device: without one these tests fail (they never pass vacuously).
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::CudaBackend;
use tf_core::{argmax_rows_of, Backend, DType, Precision, Tensor, TensorInfo, Weight};
use tf_engine::{Flow, GenOutput, GenRequest, Generator, SamplingParams};
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Model};

fn cuda() -> CudaBackend {
    CudaBackend::new(0, Precision::Full).unwrap_or_else(|e| panic!("no CUDA backend: {e}"))
}

/// Logits rows with the cases an argmax must order: ties at the maximum (the first wins), NaN (skipped), +∞ twice,
/// a row of −∞ only.
fn logits(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
    let mut v: Vec<f32> = (0..rows * cols)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 20011) as f32 / 1000.0 - 10.0)
        .collect();
    for r in 0..rows {
        let row = &mut v[r * cols..(r + 1) * cols];
        match r % 5 {
            1 => {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row[cols / 3] = m;
                row[cols / 2] = m;
            }
            2 => {
                row[7] = f32::NAN;
                row[cols - 1] = f32::INFINITY;
                row[cols / 4] = f32::INFINITY;
            }
            3 => row.fill(f32::NEG_INFINITY),
            _ => {}
        }
    }
    v
}

fn upload(be: &dyn Backend, t: &Tensor) -> Tensor {
    // A device copy of a host tensor: the rows of an f32 table, in order.
    be.embed(&table(be, t.rows, t.cols, &t.host), &(0..t.rows as u32).collect::<Vec<_>>())
}

fn table(be: &dyn Backend, rows: usize, cols: usize, values: &[f32]) -> Weight {
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let info = TensorInfo { name: "table".into(), dtype: DType::F32, shape: vec![rows as u64, cols as u64] };
    be.upload(&info, &bytes).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn queued_ids_equal_the_argmax_and_feed_the_same_embedding() {
    let g = cuda();
    let (vocab, hidden) = (5003, 96);
    let emb_values: Vec<f32> = (0..vocab * hidden).map(|i| ((i * 37 % 1009) as f32 - 504.0) / 256.0).collect();
    let emb = table(&g, vocab, hidden, &emb_values);
    for (rows, seed) in [(1, 1u32), (3, 2), (5, 3), (16, 4)] {
        let host = logits(rows, vocab, seed);
        let want = argmax_rows_of(&host, rows, vocab);
        let x = upload(&g, &Tensor::host(rows, vocab, host));
        assert_eq!(g.argmax_rows(&x), want, "{rows} rows: argmax_rows");
        // Not fed: downloaded.
        let q = g.argmax_rows_queued(&x);
        assert!(q.host.is_none(), "the CUDA backend queues its ids");
        assert_eq!(g.take_ids(&q), want, "{rows} rows: taken without a fed forward");
        // Fed, with more work queued behind the embedding before the ids are taken.
        let q = g.argmax_rows_queued(&x);
        let e = g.embed_queued(&emb, &q);
        let mut later = g.embed_queued(&emb, &q); // fed twice: the ids go to the host once
        for _ in 0..200 {
            g.scale(&mut later, 1.0);
        }
        assert_eq!(g.take_ids(&q), want, "{rows} rows: taken after a fed embedding");
        let direct = g.embed(&emb, &want);
        let bits = |t: &Tensor| g.to_host(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&e), bits(&direct), "{rows} rows: embed_queued vs embed");
        assert_eq!(bits(&later), bits(&direct), "{rows} rows: the second fed embedding");
        // Taken again: the same ids.
        assert_eq!(g.take_ids(&q), want);
    }
}

fn fixture(name: &str) -> PathBuf {
    let root = std::env::var_os("TF_REPO_ROOT").map(PathBuf::from).unwrap_or_else(tf_testkit::repo_root);
    root.join("fixtures/tiny").join(name)
}

fn load(be: &dyn Backend, name: &str) -> Box<dyn Model> {
    let dir = fixture(name);
    let cfg = HfConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    load_model(be, &st, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn greedy(be: &dyn Backend, model: &dyn Model, ahead: bool, req: &GenRequest) -> GenOutput {
    let mut g = Generator::new(be, model, 64, 16).unwrap_or_else(|e| panic!("{e}"));
    g.set_run_ahead(ahead);
    g.generate(req, &mut |_| Flow::Continue).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn greedy_replies_running_ahead_equal_serial_decoding_and_the_cpu() {
    let g = cuda();
    let cpu = CpuBackend::new(4, Precision::Full);
    for name in ["llama", "qwen2", "gemma3"] {
        let (gm, cm) = (load(&g, name), load(&cpu, name));
        let vocab = gm.vocab_size() as u32;
        for (i, len) in [1usize, 7, 40].into_iter().enumerate() {
            let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 31 + 7 * i as u32 + 1) % vocab).collect();
            let mut req = GenRequest::new(prompt, SamplingParams::greedy(), 48);
            req.logprobs = false;
            let serial = greedy(&g, gm.as_ref(), false, &req);
            let ahead = greedy(&g, gm.as_ref(), true, &req);
            let host = greedy(&cpu, cm.as_ref(), false, &req);
            assert_eq!(ahead.tokens.len(), 48, "{name}: runs to max_tokens");
            assert_eq!(ahead.tokens, serial.tokens, "{name} prompt {i}: running ahead vs serial on CUDA");
            assert_eq!(ahead.tokens, host.tokens, "{name} prompt {i}: CUDA vs CPU");
            // A stop id in the middle: the reply ends there with one step wasted past it.
            let mut stopped = req.clone();
            stopped.stop_ids = vec![serial.tokens[20]];
            let want = greedy(&g, gm.as_ref(), false, &stopped);
            let got = greedy(&g, gm.as_ref(), true, &stopped);
            assert_eq!((got.tokens, got.finish_reason), (want.tokens, want.finish_reason), "{name}: stop id");
        }
    }
}
