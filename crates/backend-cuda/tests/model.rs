//! Whole models: the logits of the tiny fixture checkpoints (llama, qwen2, gemma3, qwen3moe, mixtral: f32 safetensors, and the llama
//! re-encoded to Q8_0 and Q4_0 blocks) on CUDA equal the CPU backend's bit for bit at every position, in both
//! precision modes, filled in chunks of mixed sizes; and on CUDA, chunked filling equals one token at a time.
//! In the tensor arithmetic (the llama re-encoded to BF16 and F16): logits equal across every window size and
//! close to the CPU's. Needs a CUDA device.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::{Arithmetic, CudaBackend};
use tf_core::{AttnMeta, Backend, DType, KvCache, Precision, RowAttn, TensorInfo, WeightSource, WeightsError};
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Batch, Model};

const BLOCK: usize = 16;

/// A tiny fixture checkpoint; `TF_REPO_ROOT` overrides the compiled-in repository root (binaries built here run
/// from another checkout on the device machine).
fn fixture(name: &str) -> PathBuf {
    let root = std::env::var_os("TF_REPO_ROOT").map(PathBuf::from).unwrap_or_else(tf_testkit::repo_root);
    root.join("fixtures/tiny").join(name)
}

/// The checkpoint's tensors with every 2-D f32 weight (other than the embedding) re-encoded to `dtype` (Q8_0 or
/// Q4_0, quantized the plain GGML way: `d = amax / 127` or `amax / -8`; or BF16 / F16, rounded to nearest even),
/// so the checkpoint path of the matmul, or the tensor arithmetic's, runs through a real model.
struct Quantized {
    infos: Vec<TensorInfo>,
    data: Vec<Vec<u8>>,
}

fn f16_bits(x: f32) -> u16 {
    // Round-to-nearest-even f32 → f16 for the normal range the scales live in.
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if x == 0.0 || e <= 0 {
        return sign;
    }
    let m = b & 0x7f_ffff;
    let mut h = ((e as u32) << 10) | (m >> 13);
    let rest = m & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

fn quantize(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        // Round to nearest even (the fixtures hold no NaN).
        DType::BF16 => {
            return values
                .iter()
                .flat_map(|v| {
                    let b = v.to_bits();
                    (((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16).to_le_bytes()
                })
                .collect()
        }
        DType::F16 => return values.iter().flat_map(|&v| f16_bits(v).to_le_bytes()).collect(),
        _ => {}
    }
    let mut out = Vec::new();
    for blk in values.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        match dtype {
            DType::Q8_0 => {
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16_bits(d).to_le_bytes());
                out.extend(blk.iter().map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
            }
            DType::Q4_0 => {
                let d = amax / 8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16_bits(d).to_le_bytes());
                let q: Vec<u8> = blk.iter().map(|v| ((v * id).round() + 8.0).clamp(0.0, 15.0) as u8).collect();
                out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            }
            _ => unreachable!(),
        }
    }
    out
}

impl Quantized {
    fn new(src: &dyn WeightSource, dtype: DType) -> Quantized {
        let (mut infos, mut data) = (Vec::new(), Vec::new());
        for t in src.tensors() {
            let bytes = src.bytes(&t.name).unwrap();
            let matrix = t.shape.len() == 2 && t.dtype == DType::F32 && !t.name.contains("embed");
            if matrix && t.shape[1] % 32 == 0 {
                let v: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                infos.push(TensorInfo { name: t.name.clone(), dtype, shape: t.shape.clone() });
                data.push(quantize(&v, dtype));
            } else {
                infos.push(t.clone());
                data.push(bytes.to_vec());
            }
        }
        Quantized { infos, data }
    }
}

impl WeightSource for Quantized {
    fn format(&self) -> &str {
        "safetensors (re-encoded)"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let i = self
            .infos
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| WeightsError::new("q", Some(name), "missing"))?;
        Ok(&self.data[i])
    }
}

fn load(be: &dyn Backend, name: &str, quant: Option<DType>) -> Box<dyn Model> {
    let dir = fixture(name);
    let cfg = HfConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    match quant {
        None => load_model(be, &st, &cfg),
        Some(d) => load_model(be, &Quantized::new(&st, d), &cfg),
    }
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Logits of every position of `tokens`, filled in chunks of the given sizes (cycled) over a scrambled block table.
fn run_chunked(be: &dyn Backend, model: &dyn Model, tokens: &[u32], chunks: &[usize]) -> Vec<Vec<f32>> {
    let table: Vec<u32> = (0..tokens.len().div_ceil(BLOCK) as u32).map(|i| 3 + 2 * i).collect();
    let blocks = *table.iter().max().unwrap() as usize + 1;
    let mut kv: KvCache = be.alloc_kv(model.kv_spec(blocks, BLOCK)).expect("kv cache");
    let slot = |p: usize| table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32;
    let vocab = model.vocab_size();
    let (mut out, mut start, mut i) = (Vec::new(), 0, 0);
    while start < tokens.len() {
        let end = (start + chunks[i % chunks.len()]).min(tokens.len());
        let batch = Batch {
            tokens: tokens[start..end].to_vec(),
            positions: (start as u32..end as u32).collect(),
            slots: (start..end).map(slot).collect(),
            attn: AttnMeta {
                block_tables: vec![table.clone()],
                rows: (start..end)
                    .map(|p| RowAttn { pos: p as u32, seq: 0, ctx: p as u32 + 1, tree: vec![] })
                    .collect(),
            },
            logit_rows: (0..end - start).collect(),
            fed: None,
            states: Vec::new(),
        };
        let host = be.to_host(&model.forward(be, &batch, &mut kv));
        assert_eq!(host.len(), (end - start) * vocab);
        out.extend(host.chunks(vocab).map(<[f32]>::to_vec));
        start = end;
        i += 1;
    }
    out
}

fn first_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> Option<(usize, usize, f32, f32)> {
    for (p, (ra, rb)) in a.iter().zip(b).enumerate() {
        if let Some(c) = ra.iter().zip(rb).position(|(x, y)| x.to_bits() != y.to_bits()) {
            return Some((p, c, ra[c], rb[c]));
        }
    }
    None
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn check(name: &str, quant: Option<DType>, precision: Precision) {
    let gpu = CudaBackend::new(0, precision).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let cpu = CpuBackend::new(4, precision);
    let (mg, mc) = (load(&gpu, name, quant), load(&cpu, name, quant));
    let toks = tokens(100, mg.vocab_size());
    let g = run_chunked(&gpu, mg.as_ref(), &toks, &[7, 1, 16, 33]);
    let c = run_chunked(&cpu, mc.as_ref(), &toks, &[64, 5]);
    let what = format!("{name} {quant:?} {}", precision.name());
    assert!(g.iter().flatten().all(|v| v.is_finite()), "{what}: non-finite logits");
    if let Some((p, col, a, b)) = first_difference(&g, &c) {
        panic!("{what}: cuda vs cpu differ at position {p}, logit {col}: {a:e} vs {b:e}");
    }
    let serial = run_chunked(&gpu, mg.as_ref(), &toks, &[1]);
    if let Some((p, col, a, b)) = first_difference(&g, &serial) {
        panic!("{what}: cuda chunked vs one token at a time differ at position {p}, logit {col}: {a:e} vs {b:e}");
    }
    eprintln!("{what}: {} positions × {} logits equal", g.len(), g[0].len());
}

#[test]
fn tiny_llama_f32_both_precisions() {
    check("llama", None, Precision::Checkpoint);
    check("llama", None, Precision::Full);
}

/// The portable arithmetic on the llama re-encoded to BF16 and F16. With interleaving on (the default) float matrices whose
/// rows are whole 128-element blocks (the MLP down-projection) are stored interleaved, the rest unpermuted (and the
/// f32 fixtures interleave every matrix with rows of 64 elements, the gemma3 one including its tied embedding).
#[test]
fn tiny_llama_bf16_and_f16_portable() {
    for q in [DType::BF16, DType::F16] {
        check("llama", Some(q), Precision::Full);
    }
}

#[test]
fn tiny_llama_q8_0_and_q4_0_checkpoint_and_full() {
    for q in [DType::Q8_0, DType::Q4_0] {
        check("llama", Some(q), Precision::Checkpoint);
        check("llama", Some(q), Precision::Full);
    }
}

/// The tensor arithmetic on the llama re-encoded to `dtype` (BF16 or F16): the logits of every position are the
/// same bits for windows of 1, 7, 16, 33 and 100 rows in any mix, and within 5% of the logit range of the CPU's
/// full precision on the same weights (activations are rounded to the weight type before each matmul).
fn check_tensor(dtype: DType) {
    let gpu = CudaBackend::with_arithmetic(0, Precision::Full, Arithmetic::Tensor)
        .unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let cpu = CpuBackend::new(4, Precision::Full);
    let (mg, mc) = (load(&gpu, "llama", Some(dtype)), load(&cpu, "llama", Some(dtype)));
    let toks = tokens(100, mg.vocab_size());
    let serial = run_chunked(&gpu, mg.as_ref(), &toks, &[1]);
    assert!(serial.iter().flatten().all(|v| v.is_finite()), "{dtype}: non-finite logits");
    for chunks in [&[7, 1, 16, 33][..], &[100], &[16], &[33, 2, 64]] {
        let g = run_chunked(&gpu, mg.as_ref(), &toks, chunks);
        if let Some((p, col, a, b)) = first_difference(&g, &serial) {
            panic!("{dtype} tensor: windows {chunks:?} vs one token at a time differ at position {p}, logit {col}: {a:e} vs {b:e}");
        }
    }
    let c = run_chunked(&cpu, mc.as_ref(), &toks, &[64, 36]);
    let range = c.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let worst = serial.iter().flatten().zip(c.iter().flatten()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "{dtype} tensor: {} positions equal in every window; max |tensor - cpu| = {worst:e} (max |logit| {range:e})",
        serial.len()
    );
    assert!(worst <= 0.05 * range, "{dtype} tensor: logits {worst:e} from the CPU's (max |logit| {range:e})");
}

#[test]
fn tiny_llama_bf16_and_f16_tensor_arithmetic() {
    check_tensor(DType::BF16);
    check_tensor(DType::F16);
}

#[test]
fn tiny_qwen2_and_gemma3() {
    check("qwen2", None, Precision::Full);
    check("gemma3", None, Precision::Full);
    check("qwen2", Some(DType::Q8_0), Precision::Checkpoint);
}

/// Mixture-of-experts layers (router on the host, experts through row-exact matmuls, `add_rows_scaled`): the
/// tiny Qwen3-MoE (a dense layer between two sparse ones) and Mixtral equal the CPU bit for bit, chunked and one
/// token at a time, in f32 and re-encoded to Q8_0.
#[test]
fn tiny_qwen3moe_and_mixtral() {
    for name in ["qwen3moe", "mixtral"] {
        check(name, None, Precision::Full);
        check(name, Some(DType::Q8_0), Precision::Checkpoint);
    }
}

/// tiny gpt-oss (attention sinks, sliding windows of 4, YaRN, biased experts with the clamped SwiGLU) equals the
/// CPU bit for bit, chunked and one token at a time, in both precisions.
#[test]
fn tiny_gpt_oss() {
    check("gpt_oss", None, Precision::Full);
    check("gpt_oss", None, Precision::Checkpoint);
}
