//! Running ahead (`ahead.rs`) through real model code: the tiny llama, qwen2 and gemma3 fixtures on the CPU backend
//! behind a wrapper that claims to queue ids and defers each argmax until it is fed or taken. The forwards fed by
//! queued ids go through the models' own embedding (`layers::embed` with `Batch::fed`); greedy replies equal those
//! of the same generator without running ahead and of the plain CPU backend.

#[allow(dead_code)]
#[macro_use]
mod fake;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision, QueuedIds, Tensor, Weight};
use tf_engine::{Flow, GenOutput, GenRequest, Generator, SamplingParams};
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Model};

/// The CPU backend with argmaxes that are computed only when fed to a forward or taken.
struct Deferring {
    inner: CpuBackend,
    fed: AtomicUsize,
}

/// A deferred argmax: the logits it is computed from.
struct Logits(Tensor);

impl Backend for Deferring {
    forward_backend_to_inner!();
    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        self.inner.to_host(x)
    }
    fn queues_ids(&self) -> bool {
        true
    }
    fn argmax_rows_queued(&self, x: &Tensor) -> QueuedIds {
        QueuedIds { rows: x.rows, host: None, device: Some(Arc::new(Logits(x.clone()))) }
    }
    fn take_ids(&self, ids: &QueuedIds) -> Vec<u32> {
        let l = ids.device.as_ref().and_then(|d| d.downcast_ref::<Logits>()).expect("ids this backend queued");
        self.inner.argmax_rows(&l.0)
    }
    fn embed_queued(&self, table: &Weight, ids: &QueuedIds) -> Tensor {
        self.fed.fetch_add(1, Ordering::SeqCst);
        self.inner.embed(table, &self.take_ids(ids))
    }
}

fn load(be: &dyn Backend, name: &str) -> Box<dyn Model> {
    let dir: PathBuf = tf_testkit::repo_root().join("fixtures/tiny").join(name);
    let cfg = HfConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    load_model(be, &st, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn greedy(be: &dyn Backend, model: &dyn Model, ahead: bool, req: &GenRequest) -> GenOutput {
    let mut g = Generator::new(be, model, 32, 16).unwrap_or_else(|e| panic!("{e}"));
    g.set_run_ahead(ahead);
    g.generate(req, &mut |_| Flow::Continue).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn real_models_fed_by_queued_ids_give_the_serial_reply() {
    let plain = CpuBackend::new(2, Precision::Full);
    let deferring = Deferring { inner: CpuBackend::new(2, Precision::Full), fed: AtomicUsize::new(0) };
    for name in ["llama", "qwen2", "gemma3"] {
        let (pm, dm) = (load(&plain, name), load(&deferring, name));
        let vocab = pm.vocab_size() as u32;
        let prompt: Vec<u32> = (0..11u32).map(|t| (t * 37 + 5) % vocab).collect();
        let mut req = GenRequest::new(prompt, SamplingParams::greedy(), 24);
        req.logprobs = false;
        let reference = greedy(&plain, pm.as_ref(), true, &req);
        let serial = greedy(&deferring, dm.as_ref(), false, &req);
        deferring.fed.store(0, Ordering::SeqCst);
        let ahead = greedy(&deferring, dm.as_ref(), true, &req);
        assert_eq!(serial.tokens, reference.tokens, "{name}: the wrapper without running ahead");
        assert_eq!(ahead.tokens, reference.tokens, "{name}: running ahead");
        // 24 tokens: the first from the prompt, 23 decode steps, all but the first fed by the previous one's ids.
        assert_eq!(deferring.fed.load(Ordering::SeqCst), 22, "{name}: forwards fed by queued ids");
    }
}
