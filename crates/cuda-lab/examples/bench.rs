//! Decode timings of real model shapes with random weights on the CUDA backend (the weights cannot travel to the
//! device machine; the arithmetic per byte is the same for any values).
//!
//! `bench [SHAPE] [DTYPE] [PRECISION] [ARITHMETIC]`: SHAPE `qwen2.5-0.5b` | `qwen2.5-1.5b` | `qwen2.5-7b`, DTYPE
//! `bf16` | `f16` | `q8_0` | `q4_0` | `q4_k` | `q6_k` (matrices; norms and biases take float matrix types, else
//! f32), PRECISION `checkpoint` | `full`, ARITHMETIC `portable` | `tensor`. The weights are `tf_loader::dummy` (what `tensorfold --load-format dummy` loads), seed 0.
//! Prints one line per measurement: prefill of 64 tokens, single-row decode steps and 16-row windows (medians of
//! timed steps after warm-ups, each step ending with the logits on the host, as the engine reads them), and for
//! float types the MLP matmuls alone at 1..2048 rows (TFLOP/s and weight GB/s), in the portable arithmetic for both
//! weight layouts (unpermuted and interleaved). The backend runs the tuning of the environment
//! (`CudaTuning::from_env`: `TF_CUDA_INTERLEAVE=0` loads the model's float matrices unpermuted, for an A/B of whole
//! steps; `TF_CUDA_DEFINES` compiles the kernels with other defines). `TF_BENCH_BOUNDARY=1` and `TF_BENCH_CHAIN=1`
//! measure one launch boundary and one dependent one-row matmul alone, launched and in one persistent launch (the
//! lab's probes, see their functions).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tf_backend_cuda::device::Mark;
use tf_backend_cuda::{Arithmetic, CudaBackend, CudaTuning, KernelDefine};
use tf_core::{
    AttnMeta, AttnParams, Backend, BackendError, DType, GluAct, KvCache, KvSpec, Precision, Rope, RopeKv, RowAttn,
    Tensor, TensorInfo, Weight,
};
use tf_cuda_lab::probes::Probes;
use tf_loader::dummy::DummyWeights;
use tf_loader::hf_config::HfConfig;
use tf_models::{load_model, Batch, Model};

/// (name, hidden, intermediate, layers, heads, kv_heads, vocab, tied embeddings)
type Shape = (&'static str, usize, usize, usize, usize, usize, usize, bool);

const SHAPES: [Shape; 3] = [
    ("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, true),
    ("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936, true),
    ("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, false),
];

const BLOCK: usize = 16;

fn config(shape: &Shape) -> HfConfig {
    let &(_, hidden, inter, layers, heads, kv_heads, vocab, tied) = shape;
    let json = format!(
        r#"{{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": {hidden},
        "intermediate_size": {inter}, "num_hidden_layers": {layers}, "num_attention_heads": {heads},
        "num_key_value_heads": {kv_heads}, "vocab_size": {vocab}, "tie_word_embeddings": {tied},
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151645, "sliding_window": null, "use_sliding_window": false}}"#
    );
    HfConfig::from_json_str(&json, "config.json").unwrap_or_else(|e| panic!("{e}"))
}

/// One forward over rows at `positions` (causal), logits of every row to the host; returns the seconds taken.
fn step(be: &dyn Backend, m: &dyn Model, kv: &mut KvCache, table: &[u32], positions: std::ops::Range<usize>) -> f64 {
    let t = Instant::now();
    let n = positions.len();
    let batch = batch(table, positions);
    let y = m.forward(be, &batch, kv);
    HOST.with(|h| h.set(t.elapsed().as_secs_f64()));
    fetch(be, &y, n, m.vocab_size());
    t.elapsed().as_secs_f64()
}

/// What a step brings back to the host: each row's argmax id ([`IDS_ONLY`]) or all `n` rows of logits.
fn fetch(be: &dyn Backend, y: &Tensor, n: usize, vocab: usize) {
    if IDS_ONLY.with(|c| c.get()) {
        assert_eq!(be.argmax_rows(y).len(), n);
    } else {
        assert_eq!(be.to_host(y).len(), n * vocab);
    }
}

thread_local! {
    /// Whether [`step`] fetches only each row's argmax id (`Backend::argmax_rows`, what the engine does for greedy
    /// requests) instead of downloading the logits.
    static IDS_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Seconds from the start of the last step until its forward returned (the host's side: op calls, launches;
    /// the GPU may still be running), to tell a step bound by the host from one bound by the kernels.
    static HOST: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

fn last_host() -> f64 {
    HOST.with(|h| h.get())
}

fn batch(table: &[u32], positions: std::ops::Range<usize>) -> Batch {
    let n = positions.len();
    Batch {
        tokens: positions.clone().map(|p| (p * 7919 % 150_000) as u32).collect(),
        positions: positions.clone().map(|p| p as u32).collect(),
        slots: positions.clone().map(|p| table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32).collect(),
        attn: AttnMeta {
            block_tables: vec![table.to_vec()],
            rows: positions.map(|p| RowAttn { pos: p as u32, seq: 0, ctx: p as u32 + 1, tree: vec![] }).collect(),
        },
        logit_rows: (0..n).collect(),
        fed: None,
        states: Vec::new(),
    }
}

/// Times every op: waits for the queue before and after each, so each op's time is its launch plus its kernel;
/// or, with `gpu`, records events around each op without waiting (GPU time from the end of the previous op to the
/// end of this one, read after the step). Without `timing` it only passes the ops on; without `fuse` it runs
/// `add_rms_norm`, `matmul_glu`, `rope_kv_write`, `matmul_add`, `norm_matmul_many`, `norm_qkv_rope_kv_write` and
/// `norm_matmul_glu` as the trait's defaults (separate ops), for an A/B of the fused kernels.
struct Timed<'a> {
    be: &'a CudaBackend,
    timing: bool,
    fuse: bool,
    /// op → (calls, seconds)
    times: Mutex<BTreeMap<&'static str, (usize, f64)>>,
    gpu: bool,
    marks: Mutex<Vec<(&'static str, Mark, Mark)>>,
}

impl Timed<'_> {
    fn new(be: &CudaBackend, gpu: bool) -> Timed<'_> {
        Timed { be, timing: true, fuse: true, times: Mutex::new(BTreeMap::new()), gpu, marks: Mutex::new(Vec::new()) }
    }

    /// Passes every op on untimed; `fuse: false` splits the fused ops into their parts.
    fn plain(be: &CudaBackend, fuse: bool) -> Timed<'_> {
        Timed { timing: false, fuse, ..Timed::new(be, false) }
    }

    /// Adds the GPU times of the marked ops (call after a synchronization).
    fn collect(&self) {
        self.be.synchronize();
        let mut m = self.times.lock().unwrap();
        for (op, a, b) in self.marks.lock().unwrap().drain(..) {
            let e = m.entry(op).or_default();
            e.0 += 1;
            e.1 += self.be.device().elapsed_ms(&a, &b) as f64 / 1e3;
        }
    }

    fn time<T>(&self, op: &'static str, f: impl FnOnce() -> T) -> T {
        if !self.timing {
            return f();
        }
        if self.gpu {
            let a = self.be.device().mark();
            let r = f();
            let b = self.be.device().mark();
            self.marks.lock().unwrap().push((op, a, b));
            if op == "to_host" {
                self.collect();
            }
            return r;
        }
        self.be.synchronize();
        let t = Instant::now();
        let r = f();
        self.be.synchronize();
        let mut m = self.times.lock().unwrap();
        let e = m.entry(op).or_default();
        e.0 += 1;
        e.1 += t.elapsed().as_secs_f64();
        r
    }
}

impl Backend for Timed<'_> {
    fn describe(&self) -> String {
        self.be.describe()
    }
    fn precision(&self) -> Precision {
        self.be.precision()
    }
    fn upload(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Weight, BackendError> {
        self.be.upload(info, bytes)
    }
    fn upload_f32(&self, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, BackendError> {
        self.be.upload_f32(name, shape, values)
    }
    fn embed(&self, table: &Weight, ids: &[u32]) -> Tensor {
        self.time("embed", || self.be.embed(table, ids))
    }
    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Tensor {
        let op = if w.out_dim() > 100_000 { "matmul lm_head" } else { "matmul layers" };
        self.time(op, || self.be.matmul(x, w, bias))
    }
    fn matmul_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        self.time("matmul layers", || self.be.matmul_many(x, ws))
    }
    fn matmul_glu(&self, x: &Tensor, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        if !self.fuse {
            let [g, u]: [Tensor; 2] = self.matmul_many(x, &[(gate, None), (up, None)]).try_into().expect("two");
            return self.glu(&g, &u, act);
        }
        self.time("matmul layers + glu", || self.be.matmul_glu(x, gate, up, act))
    }
    fn rope_kv_write(&self, q: &mut Tensor, k: &mut Tensor, v: &Tensor, kv: &mut KvCache, layer: usize, at: &RopeKv) {
        if !self.fuse {
            self.rope(q, at.positions, at.head_dim, at.rope);
            self.rope(k, at.positions, at.head_dim, at.rope);
            return self.kv_write(kv, layer, k, v, at.slots);
        }
        self.time("rope + kv_write", || self.be.rope_kv_write(q, k, v, kv, layer, at))
    }
    fn rms_norm(&self, x: &Tensor, w: &Weight, group: usize, eps: f32) -> Tensor {
        self.time("rms_norm", || self.be.rms_norm(x, w, group, eps))
    }
    fn rope(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope) {
        self.time("rope", || self.be.rope(x, positions, head_dim, rope))
    }
    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError> {
        self.be.alloc_kv(spec)
    }
    fn kv_write(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) {
        self.time("kv_write", || self.be.kv_write(kv, layer, k, v, slots))
    }
    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]) {
        self.time("kv_copy", || self.be.kv_copy(kv, src, dst))
    }
    fn attention(&self, q: &Tensor, kv: &KvCache, layer: usize, meta: &AttnMeta, p: &AttnParams) -> Tensor {
        self.time("attention", || self.be.attention(q, kv, layer, meta, p))
    }
    fn glu(&self, gate: &Tensor, up: &Tensor, act: GluAct) -> Tensor {
        self.time("glu", || self.be.glu(gate, up, act))
    }
    fn add(&self, a: &mut Tensor, b: &Tensor) {
        self.time("add", || self.be.add(a, b))
    }
    fn add_rms_norm(&self, a: &mut Tensor, b: &Tensor, w: &Weight, eps: f32) -> Tensor {
        if !self.fuse {
            self.add(a, b);
            return self.rms_norm(a, w, a.cols, eps);
        }
        self.time("add_rms_norm", || self.be.add_rms_norm(a, b, w, eps))
    }
    fn matmul_add(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, acc: &mut Tensor) {
        if !self.fuse {
            let y = self.matmul(x, w, bias);
            return self.add(acc, &y);
        }
        self.time("matmul layers + add", || self.be.matmul_add(x, w, bias, acc))
    }
    fn norm_matmul_many(&self, x: &Tensor, norm: &Weight, eps: f32, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        if !self.fuse {
            return self.matmul_many(&self.rms_norm(x, norm, x.cols, eps), ws);
        }
        self.time("rms_norm + matmul layers", || self.be.norm_matmul_many(x, norm, eps, ws))
    }
    fn norm_qkv_rope_kv_write(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        ws: &[(&Weight, Option<&Weight>); 3],
        kv: &mut KvCache,
        layer: usize,
        at: &RopeKv,
    ) -> [Tensor; 3] {
        if !self.fuse {
            return tf_core::norm_qkv_then_rope_kv_write(self, x, norm, eps, ws, kv, layer, at);
        }
        self.time("rms_norm + matmul layers + rope + kv_write", || {
            self.be.norm_qkv_rope_kv_write(x, norm, eps, ws, kv, layer, at)
        })
    }
    fn norm_matmul_glu(&self, x: &Tensor, norm: &Weight, eps: f32, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        if !self.fuse {
            return self.matmul_glu(&self.rms_norm(x, norm, x.cols, eps), gate, up, act);
        }
        self.time("rms_norm + matmul layers + glu", || self.be.norm_matmul_glu(x, norm, eps, gate, up, act))
    }
    fn scale(&self, x: &mut Tensor, s: f32) {
        self.time("scale", || self.be.scale(x, s))
    }
    fn select_rows(&self, x: &Tensor, rows: &[usize]) -> Tensor {
        self.time("select_rows", || self.be.select_rows(x, rows))
    }
    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        self.time("to_host", || self.be.to_host(x))
    }
    fn argmax_rows(&self, x: &Tensor) -> Vec<u32> {
        self.time("argmax_rows", || self.be.argmax_rows(x))
    }
}

/// The gate/up (`[inter, hidden]`) and down (`[hidden, inter]`) matmuls alone, random weights of `dtype`, at 1 to
/// 2048 rows: median of 10 synchronized calls after 2 warm-ups. In the portable arithmetic, for the weight stored
/// unpermuted and interleaved (`CudaWeight::interleaved`), then one row by GPU time (events, median of 20) for each
/// layout and for the interleaved kernel's block widths. `interleave`: the model's setting, restored.
fn matmul_rates(be: &CudaBackend, dtype: DType, hidden: usize, inter: usize, interleave: bool) {
    let layouts: &[bool] = if be.arithmetic() == Arithmetic::Portable { &[false, true] } else { &[false] };
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (n, k, what) in [(inter, hidden, "gate/up"), (hidden, inter, "down")] {
        // Random 16-bit weights with exponents near 1 (bf16 or f16 bit patterns, sign random).
        let bytes: Vec<u8> = (0..n * k)
            .flat_map(|_| {
                let r = next();
                let h = match dtype {
                    DType::F16 => 0x3000 | (r as u16 & 0x83ff),
                    _ => 0x3e00 | (r as u16 & 0x807f),
                };
                h.to_le_bytes()
            })
            .collect();
        let info = TensorInfo { name: "w".into(), dtype, shape: vec![n as u64, k as u64] };
        let x1: Vec<f32> = (0..k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
        let x1 = be.select_rows(&Tensor::host(1, k, x1), &[0]);
        let gpu_us = |w: &Weight| {
            let mut times = Vec::new();
            for i in 0..23 {
                let a = be.device().mark();
                let y = be.matmul(&x1, w, None);
                let b = be.device().mark();
                be.synchronize();
                if i >= 3 {
                    times.push(be.device().elapsed_ms(&a, &b) as f64 * 1e3);
                }
                drop(y);
            }
            let us = median(times);
            format!("{us:.1} µs = {:.0} GB/s", (2 * n * k) as f64 / us / 1e3)
        };
        let mut one = Vec::new();
        for &il in layouts {
            be.tune(|t| {
                t.interleave = il;
                t.il_cols = 0;
            });
            let w = be.upload(&info, &bytes).unwrap_or_else(|e| panic!("{e}"));
            let layout = if !layouts.contains(&true) {
                ""
            } else if il {
                " interleaved"
            } else {
                " unpermuted"
            };
            let mut parts = Vec::new();
            for rows in [1usize, 16, 64, 256, 2048] {
                let host: Vec<f32> = (0..rows * k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let xd = be.select_rows(&Tensor::host(rows, k, host), &(0..rows).collect::<Vec<_>>());
                let mut times = Vec::new();
                for i in 0..12 {
                    be.synchronize();
                    let t = Instant::now();
                    let y = be.matmul(&xd, &w, None);
                    be.synchronize();
                    if i >= 2 {
                        times.push(t.elapsed().as_secs_f64());
                    }
                    drop(y);
                }
                let s = median(times);
                parts.push(format!(
                    "{rows} rows {:.3} ms = {:.1} TFLOP/s, {:.0} GB/s",
                    s * 1e3,
                    2.0 * (rows * n * k) as f64 / s / 1e12,
                    (2 * n * k) as f64 / s / 1e9
                ));
            }
            println!("  matmul {what} [{n}, {k}] {dtype}{layout}: {}", parts.join(" | "));
            if !il {
                one.push(format!("unpermuted {}", gpu_us(&w)));
                continue;
            }
            one.push(format!("interleaved (by shape) {}", gpu_us(&w)));
            for cols in [2, 8, 16] {
                be.tune(|t| {
                    t.interleave = true;
                    t.il_cols = cols;
                });
                one.push(format!("{cols} cols {}", gpu_us(&w)));
            }
            be.tune(|t| {
                t.interleave = true;
                t.il_cols = 0;
            });
        }
        println!("  matmul {what} [{n}, {k}] {dtype} 1 row, GPU time: {}", one.join(" | "));
    }
    be.tune(|t| {
        t.interleave = interleave;
        t.il_cols = 0;
    });
}

/// Attention alone (GPU time between events, median of 20 after 3 warm-ups) for 1 row and a 16-row window at
/// several context lengths, head_dim 128: separates its fixed latency from its cost per 256-position chunk.
fn attention_rates(be: &CudaBackend, heads: usize, kv_heads: usize) {
    let (hd, block) = (128, 16);
    let spec = KvSpec { layers: 1, blocks: 128, block_size: block, kv_heads, head_dim: hd };
    let mut kv = be.alloc_kv(spec).expect("kv");
    let slots = spec.blocks * block;
    let kvals: Vec<f32> = (0..slots * kv_heads * hd).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 1000.0).collect();
    let k = Tensor::host(slots, kv_heads * hd, kvals.clone());
    be.kv_write(&mut kv, 0, &k, &k, &(0..slots as u32).collect::<Vec<_>>());
    let p = AttnParams { heads, kv_heads, head_dim: hd, scale: 0.088, window: None, softcap: None, sinks: None };
    let mut parts = Vec::new();
    for (cap, rows) in [(0usize, 1usize), (0, 16), (7, 1), (7, 16), (1, 1), (1, 16)] {
        be.tune(|t| t.attn_heads = cap);
        for ctx in [16usize, 256, 600, 2048] {
            let q = Tensor::host(rows, heads * hd, kvals[..rows * heads * hd].to_vec());
            let qd = be.select_rows(&q, &(0..rows).collect::<Vec<_>>());
            let meta = AttnMeta {
                block_tables: vec![(0..spec.blocks as u32).collect()],
                rows: (0..rows)
                    .map(|i| {
                        let c = ctx - rows + 1 + i;
                        RowAttn { pos: c as u32 - 1, seq: 0, ctx: c as u32, tree: vec![] }
                    })
                    .collect(),
            };
            let mut times = Vec::new();
            for i in 0..23 {
                let a = be.device().mark();
                let y = be.attention(&qd, &kv, 0, &meta, &p);
                let b = be.device().mark();
                be.synchronize();
                if i >= 3 {
                    times.push(be.device().elapsed_ms(&a, &b) as f64);
                }
                drop(y);
            }
            parts.push(format!("{rows} row(s) ctx {ctx} {:.1} µs", median(times) * 1e3));
        }
        parts.push(format!("[heads per block: {}]", if cap == 0 { "auto".to_string() } else { format!("≤ {cap}") }));
    }
    be.tune(|t| t.attn_heads = 0);
    println!("  attention alone ({heads} heads, {kv_heads} kv heads, GPU time): {}", parts.join(" | "));
}

/// `TF_BENCH_VARIANTS="base;IL_PIPE=1;IL_PIPE=1 IL_DEPTH=4"`: one backend per variant (its kernels compiled with
/// those defines, `base` = none), each with the model and its own KV cache, then one-row steps (`TF_BENCH_ROWS`:
/// row counts, default 1) of every variant in turn at the same positions, argmax ids back; prints each variant's
/// median and its ratio to the first. The variants' logits of a prefill, a 1-row and a 16-row step must be
/// bitwise equal (the knobs change speed only); a difference panics.
fn variants(list: &str, shape: &str, cfg: &HfConfig, src: &DummyWeights, precision: Precision, arith: Arithmetic) {
    let names: Vec<&str> = list.split(';').map(str::trim).filter(|v| !v.is_empty()).collect();
    let rows: Vec<usize> = std::env::var("TF_BENCH_ROWS")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        .map(|v| v.trim().parse().expect("TF_BENCH_ROWS: row counts"))
        .collect();
    let table: Vec<u32> = (0..128).collect();
    let mut runs = Vec::new();
    let t0 = Instant::now();
    for name in &names {
        let defines =
            if *name == "base" { vec![] } else { KernelDefine::parse_list(name).unwrap_or_else(|e| panic!("{e}")) };
        let tuning = CudaTuning { defines, ..CudaTuning::default() };
        let be = CudaBackend::with_tuning(0, precision, arith, tuning).unwrap_or_else(|e| panic!("{e}"));
        let model = load_model(&be, src, cfg).unwrap_or_else(|e| panic!("{e}"));
        let mut kv = be.alloc_kv(model.kv_spec(128, BLOCK)).expect("kv");
        // The prefill's logits and those of one-row and 16-row steps after it.
        let mut logits = Vec::new();
        for range in [0..64, 64..65, 65..81] {
            let y = model.forward(&be, &batch(&table, range), &mut kv);
            logits.extend(be.to_host(&y));
        }
        println!("# variant {name:?} ready at {:.0} s", t0.elapsed().as_secs_f64());
        runs.push((name.to_string(), be, model, kv, logits));
    }
    for r in &runs[1..] {
        let same = r.4.iter().zip(&runs[0].4).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "variant {:?}: logits differ from {:?}", r.0, runs[0].0);
    }
    println!("# the variants' logits are bitwise equal (prefill of 64, a 1-row and a 16-row step)");
    IDS_ONLY.with(|c| c.set(true));
    let steps = 100;
    let mut times = vec![vec![Vec::new(); rows.len()]; runs.len()];
    let mut pos = 81;
    for _ in 0..steps {
        for (i, &r) in rows.iter().enumerate() {
            if pos + r > table.len() * BLOCK {
                pos = 64;
            }
            for (v, run) in runs.iter_mut().enumerate() {
                times[v][i].push(step(&run.1, run.2.as_ref(), &mut run.3, &table, pos..pos + r));
            }
            pos += r;
        }
    }
    println!("# {shape}: {} variants, {steps} steps of each row count, alternated, argmax ids", runs.len());
    let base: Vec<f64> = times[0].iter().map(|t| median(t.clone())).collect();
    for (run, t) in runs.iter().zip(times) {
        let parts: Vec<String> = rows
            .iter()
            .zip(t)
            .zip(&base)
            .map(|((r, t), b)| {
                let m = median(t);
                format!("{r} row(s) {:.3} ms ({:.3}×)", m * 1e3, m / b)
            })
            .collect();
        println!("variant {:<28} {}", run.0, parts.join(" | "));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `TF_BENCH_BOUNDARY=1`: what one programmatic launch boundary costs alone ([`Probes::boundary`]): for
/// grids of 1 block to 8 per SM (H200) and spins of 2 and 5 µs, GPU µs per launch with and without programmatic
/// dependence, medians of 5 chains of 200; the boundary is the time over the spin. Then the same grids and spins
/// with a grid barrier in global memory instead of a launch (one launch of 200 rounds): what a persistent kernel
/// would pay per phase.
fn boundary(arithmetic: Arithmetic) {
    let be = CudaBackend::with_arithmetic(0, Precision::Full, arithmetic).unwrap_or_else(|e| panic!("{e}"));
    let probes = Probes::new(&be).unwrap_or_else(|e| panic!("{e}"));
    probes.boundary(50, 132, 128, 2000, true); // warm-up
    println!("boundary: blocks, spin µs; µs per launch with programmatic dependence (over the spin), plain (over)");
    for blocks in [1u32, 132, 528, 1056] {
        for spin in [2000, 5000] {
            let med = |pdl: bool| median((0..5).map(|_| probes.boundary(200, blocks, 128, spin, pdl)).collect());
            let (p, q, s) = (med(true), med(false), spin as f64 / 1e3);
            println!("  {blocks:5} {s:4.1}  {p:6.2} ({:+.2})  {q:6.2} ({:+.2})", p - s, q - s);
        }
    }
    // The same warps in fewer, larger blocks: whether a boundary's cost follows the blocks or the warps.
    println!("boundary by block size (2 µs spin, programmatic): blocks × threads, µs per launch (over the spin)");
    for (blocks, threads) in [(2112, 64), (1056, 128), (528, 256), (264, 512), (132, 1024), (1152, 64), (288, 256)] {
        let m = median((0..5).map(|_| probes.boundary(200, blocks, threads, 2000, true)).collect());
        println!("  {blocks:5} × {threads:4}  {m:6.2} ({:+.2})", m - 2.0);
    }
    println!("grid barrier in one launch: blocks, spin µs; µs per round (over the spin)");
    for blocks in [1u32, 132, 528, 1056] {
        for spin in [2000, 5000] {
            let v: Vec<f64> = (0..5).filter_map(|_| probes.barrier(200, blocks, spin)).collect();
            if v.is_empty() {
                println!("  {blocks:5}: more blocks than the GPU holds at once");
                continue;
            }
            let (m, s) = (median(v), spin as f64 / 1e3);
            println!("  {blocks:5} {s:4.1}  {m:6.2} ({:+.2})", m - s);
        }
    }
}

/// `TF_BENCH_CHAIN=1`: what a dependent one-row matmul costs beyond its bytes. Chains of 200 `matmul_add` of one
/// row against square interleaved bf16 weights [K, K], each reading the residual row the previous one wrote (two rows
/// taking turns: a += b · W, then b += a · W'), launched as the decode chain launches them (programmatic), behind a
/// 3 ms spin so that the host is never what the GPU waits on. Enough distinct weights that the chain reads ≥ 256 MB
/// before it reuses one (none is in L2 when it runs). For each K: GPU µs per launch (median of 5 chains) with the
/// kernel the backend picks, `_il1_add` and `_il1_add_d` forced, and GB/s; the time beyond the bytes at the copy
/// bandwidth is what each dependent kernel costs. Then the picked kernel again with only two weights taking turns
/// (2 · K² · 2 bytes, in L2 for K ≤ 3,584): what the same dependent step costs when its weights need no DRAM, so
/// how much of the time beyond the bytes an earlier copy of the weights into L2 could take away.
fn chain() {
    let be = CudaBackend::with_arithmetic(0, Precision::Full, Arithmetic::Portable).unwrap_or_else(|e| panic!("{e}"));
    let probes = Probes::new(&be).unwrap_or_else(|e| panic!("{e}"));
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    println!("chain: K, MB per weight, µs per launch (GB/s): picked, _il1_add, _il1_add_d; picked, 2 weights (L2)");
    for k in [1024usize, 1536, 2048, 3072, 3584, 4096, 6144, 8192] {
        let wbytes = 2 * k * k;
        let m = (256_000_000usize.div_ceil(wbytes)).max(2);
        let info = TensorInfo { name: "w".into(), dtype: DType::BF16, shape: vec![k as u64, k as u64] };
        let ws: Vec<Weight> = (0..m)
            .map(|_| {
                // The rows grow along a chain and may reach inf or NaN; an fma costs the same on any value, so the
                // timing does not depend on them.
                let bytes = tf_cuda_lab::timing_bf16_bytes(k * k, next());
                be.upload(&info, &bytes).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        let row = |next: &mut dyn FnMut() -> u64| {
            let h: Vec<f32> = (0..k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            be.select_rows(&Tensor::host(1, k, h), &[0])
        };
        let (mut a, mut b) = (row(&mut next), row(&mut next));
        let mut run = |forced: Option<bool>, m: usize| {
            be.tune(|t| t.add_deep = forced);
            let mut times = Vec::new();
            for rep in 0..6 {
                probes.spin(3_000_000);
                let t0 = be.device().mark();
                for i in 0..200 {
                    let w = &ws[i % m];
                    if i % 2 == 0 {
                        be.matmul_add(&b, w, None, &mut a);
                    } else {
                        be.matmul_add(&a, w, None, &mut b);
                    }
                }
                let t1 = be.device().mark();
                be.synchronize();
                if rep > 0 {
                    times.push(be.device().elapsed_ms(&t0, &t1) as f64 * 1e3 / 200.0);
                }
            }
            let us = median(times);
            format!("{us:7.2} ({:5.0})", wbytes as f64 / us / 1e3)
        };
        let (picked, plain, deep, hot) = (run(None, m), run(Some(false), m), run(Some(true), m), run(None, 2));
        be.tune(|t| t.add_deep = None);
        println!("  {k:5} {:7.1}  {picked}  {plain}  {deep}  {hot}", wbytes as f64 / 1e6);
    }
    // The same dependent steps in one persistent launch (`Probes::chain_persist`): a grid barrier per step
    // and each column's next weight row in flight across it; what a persistent decode kernel would pay per step.
    println!("chain, one persistent launch: K, threads, mode (1: x in shared memory, 2: flag barrier, 4: y in");
    println!(
        "  registers, 8: no barrier, each word its own flag), µs per step (GB/s): distinct weights, 2 weights (L2)"
    );
    for k in [1024usize, 1536, 2048] {
        let wbytes = 2 * k * k;
        let m = (256_000_000usize.div_ceil(wbytes)).max(2);
        for (threads, mode) in [(256u32, 5), (128, 13), (256, 13), (512, 13)] {
            let cell = |m: usize| match probes.chain_persist(k, m, 200, threads, mode) {
                Some(us) => format!("{us:7.2} ({:5.0})", wbytes as f64 / us / 1e3),
                None => "      -        ".to_string(),
            };
            println!("  {k:5} {threads:4} {mode}  {}  {}", cell(m), cell(2));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let shape_name = args.get(1).map_or("qwen2.5-1.5b", String::as_str);
    let dtype = match args.get(2).map_or("bf16", String::as_str) {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q4_k" => DType::Q4K,
        "q6_k" => DType::Q6K,
        d => panic!("unknown dtype {d}"),
    };
    let precision = Precision::parse(args.get(3).map_or("checkpoint", String::as_str)).expect("precision");
    let arithmetic = Arithmetic::parse(args.get(4).map_or("portable", String::as_str)).expect("arithmetic");
    if std::env::var_os("TF_BENCH_BOUNDARY").is_some() {
        boundary(arithmetic);
        return;
    }
    if std::env::var_os("TF_BENCH_CHAIN").is_some() {
        chain();
        return;
    }
    let shape = SHAPES.iter().find(|s| s.0 == shape_name).unwrap_or_else(|| panic!("unknown shape {shape_name}"));
    let t = Instant::now();
    let cfg = config(shape);
    let src = DummyWeights::new(&cfg, dtype, 0).unwrap_or_else(|e| panic!("{e}"));
    let gen_s = t.elapsed().as_secs_f64();
    if let Ok(list) = std::env::var("TF_BENCH_VARIANTS") {
        variants(&list, shape_name, &cfg, &src, precision, arithmetic);
        return;
    }
    let tuning = CudaTuning::from_env().unwrap_or_else(|e| panic!("{e}"));
    let interleave = tuning.interleave;
    let be = CudaBackend::with_tuning(0, precision, arithmetic, tuning).unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let model = load_model(&be, &src, &cfg).unwrap_or_else(|e| panic!("{e}"));
    be.synchronize();
    let load_s = t.elapsed().as_secs_f64();
    let table: Vec<u32> = (0..128).collect();
    let mut kv = be.alloc_kv(model.kv_spec(128, BLOCK)).expect("kv");
    let gb = src.total_bytes() as f64 / 1e9;
    println!(
        "# {shape_name} {dtype} {} on {}: {gb:.2} GB of weights (random), generated {gen_s:.1} s, uploaded {load_s:.1} s{}",
        precision.name(),
        be.describe(),
        if interleave { ", float matrices interleaved" } else { ", float matrices unpermuted (TF_CUDA_INTERLEAVE=0)" }
    );
    if std::env::var_os("TF_BENCH_DECODE_ONLY").is_some() {
        // For a profiler: a 64-row prefill, then steps of TF_BENCH_ROWS rows (a list: "1,16" runs 40 steps of each,
        // alternating; default 100 one-row steps), each downloading the logits (TF_BENCH_IDS=1: fetching the argmax
        // ids, the engine's greedy path), and nothing else.
        let list = std::env::var("TF_BENCH_ROWS").unwrap_or_else(|_| "1".into());
        let rows: Vec<usize> = list.split(',').map(|v| v.trim().parse().expect("TF_BENCH_ROWS: row counts")).collect();
        let steps = if rows == [1] { 100 } else { 40 };
        step(&be, model.as_ref(), &mut kv, &table, 0..64);
        let ids = std::env::var_os("TF_BENCH_IDS").is_some();
        IDS_ONLY.with(|c| c.set(ids));
        let (mut times, mut host) = (vec![Vec::new(); rows.len()], vec![Vec::new(); rows.len()]);
        let mut pos = 64;
        for _ in 0..steps {
            for (i, &r) in rows.iter().enumerate() {
                if pos + r > table.len() * BLOCK {
                    pos = 64; // stay inside the cache: later steps overwrite earlier positions
                }
                let s = step(&be, model.as_ref(), &mut kv, &table, pos..pos + r);
                times[i].push(s);
                host[i].push(last_host());
                pos += r;
            }
        }
        let what = if ids { "argmax ids" } else { "logits" };
        for ((r, t), h) in rows.iter().zip(times).zip(host) {
            println!(
                "decode only: {steps} steps of {r} row(s), {what}, median {:.3} ms (host side {:.3} ms)",
                median(t) * 1e3,
                median(h) * 1e3
            );
        }
        return;
    }
    if std::env::var_os("TF_BENCH_ATTN_ONLY").is_some() {
        attention_rates(&be, shape.4, shape.5);
        return;
    }
    if matches!(dtype, DType::BF16 | DType::F16) {
        matmul_rates(&be, dtype, shape.1, shape.2, interleave);
    }
    attention_rates(&be, shape.4, shape.5);
    let prefill = step(&be, model.as_ref(), &mut kv, &table, 0..64);
    let prefill2 = step(&be, model.as_ref(), &mut kv, &table, 64..128);
    let mut pos = 128;
    let (mut one, mut one_host) = (Vec::new(), Vec::new());
    for i in 0..23 {
        let s = step(&be, model.as_ref(), &mut kv, &table, pos..pos + 1);
        pos += 1;
        if i >= 3 {
            one.push(s);
            one_host.push(last_host());
        }
    }
    let mut window = Vec::new();
    let window_at = pos;
    for i in 0..13 {
        let s = step(&be, model.as_ref(), &mut kv, &table, pos..pos + 16);
        pos += 16;
        if i >= 3 {
            window.push(s);
        }
    }
    let (m1, m16) = (median(one), median(window));
    println!("  host side of a 1-row step (until the forward returns): {:.2} ms", median(one_host) * 1e3);
    let mode = format!("{} {}", precision.name(), arithmetic.name());
    // One more set of steps with every op timed on its own (1 row, then 16 rows).
    for (rows, gpu) in [(1, false), (16, false), (1, true), (16, true)] {
        let timed = Timed::new(&be, gpu);
        let steps = 5;
        for _ in 0..steps {
            step(&timed, model.as_ref(), &mut kv, &table, pos..pos + rows);
            pos += rows;
        }
        let times = timed.times.into_inner().unwrap();
        let total: f64 = times.values().map(|v| v.1).sum::<f64>() / steps as f64;
        let parts: Vec<String> = times
            .iter()
            .map(|(op, (n, t))| format!("{op} {:.2} ms ({}×)", t / steps as f64 * 1e3, n / steps))
            .collect();
        let how = if gpu { "GPU time between events, not synchronized" } else { "each op synchronized" };
        println!("  per op, {rows} row(s), {how}: {:.2} ms = {}", total * 1e3, parts.join(", "));
    }
    // A/B of the fused ops (residual add + RMSNorm, gate/up + GLU, RoPE + KV write): alternating steps with and
    // without them (medians of 20 each).
    let mut ab = Vec::new();
    for rows in [1, 16] {
        let (mut fused, mut split) = (Vec::new(), Vec::new());
        for i in 0..44 {
            let fuse = i % 2 == 0;
            let s = step(&Timed::plain(&be, fuse), model.as_ref(), &mut kv, &table, pos..pos + rows);
            pos += rows;
            if i >= 4 {
                if fuse { &mut fused } else { &mut split }.push(s);
            }
        }
        ab.push(format!("{rows} row(s) {:.3} ms fused vs {:.3} ms split", median(fused) * 1e3, median(split) * 1e3));
    }
    println!("  fused ops (add + rms_norm, matmul + glu, rope + kv_write), alternating steps: {}", ab.join(" | "));
    // Greedy steps as the engine runs them: argmax ids instead of the logits, against the logits download at the
    // same positions (the window measurement's; attention grows with the context), alternated: medians of 10.
    let (mut l1, mut i1, mut l16, mut i16) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (rows, logits, ids) in [(1, &mut l1, &mut i1), (16, &mut l16, &mut i16)] {
        let at = window_at;
        for i in 0..24 {
            let only = i % 2 == 1;
            IDS_ONLY.with(|c| c.set(only));
            let s = step(&be, model.as_ref(), &mut kv, &table, at + (i / 2) * rows..at + (i / 2 + 1) * rows);
            if i >= 4 {
                if only { &mut *ids } else { &mut *logits }.push(s);
            }
        }
    }
    IDS_ONLY.with(|c| c.set(false));
    let (l1, i1, l16, i16) = (median(l1), median(i1), median(l16), median(i16));
    println!(
        "  same positions, logits vs argmax ids (greedy): 1 row {:.2} vs {:.2} ms | 16-row window {:.2} vs {:.2} ms \
         = {:.2}x vs {:.2}x one row",
        l1 * 1e3,
        i1 * 1e3,
        l16 * 1e3,
        i16 * 1e3,
        l16 / l1,
        i16 / i1
    );
    println!(
        "{shape_name} {dtype} {}: prefill 64 rows {:.1} ms ({:.0} tok/s, first {:.1} ms) | decode 1 row {:.2} ms = {:.1} tok/s \
         ({:.0} GB/s of weights) | 16-row window {:.2} ms = {:.2}x one row",
        mode,
        prefill2 * 1e3,
        64.0 / prefill2,
        prefill * 1e3,
        m1 * 1e3,
        1.0 / m1,
        gb / m1,
        m16 * 1e3,
        m16 / m1
    );
}
