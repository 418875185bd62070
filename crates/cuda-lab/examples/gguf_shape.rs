//! Writes a GGUF checkpoint with random weights and the tensor names, shapes and metadata of a Hugging Face
//! `config.json` (qwen2 and llama layouts), streamed through `tf_loader::gguf_writer::GgufWriter` so 7B files need
//! no memory of their size. TensorFold and llama.cpp load the same file, so their speeds compare on one input.
//!
//! usage: gguf_shape CONFIG.json TYPE OUT.gguf      TYPE: bf16 | q8_0 | q4_k | q4_k_m
//!
//! `q4_k_m` follows llama.cpp's Q4_K_M choice per tensor: `output` Q6_K; `attn_v` and `ffn_down` Q6_K in the
//! layers `use_more_bits` picks (the first and last eighth, then every third), Q4_K elsewhere. Norms and biases
//! are F32. The vocabulary is byte-level BPE (`gpt2`) with the 256 byte tokens, one merge and filler tokens, so
//! both tokenizers load it; the text it decodes to is noise, the speed is real.

use std::io::{BufWriter, Write};
use std::thread;
use tf_core::DType;
use tf_loader::gguf::{GgufArray, GgufValue};
use tf_loader::gguf_writer::GgufWriter;
use tf_loader::hf_config::HfConfig;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: gguf_shape CONFIG.json bf16|q8_0|q4_k|q4_k_m OUT.gguf");
        std::process::exit(2);
    }
    let cfg = HfConfig::from_file(&args[1]).unwrap_or_else(|e| panic!("{e}"));
    let kind = args[2].as_str();
    let base = match kind {
        "bf16" => DType::BF16,
        "q8_0" => DType::Q8_0,
        "q4_k" | "q4_k_m" => DType::Q4K,
        other => panic!("unknown type {other}"),
    };
    let arch = match cfg.model_type.as_str() {
        "qwen2" => "qwen2",
        "llama" => "llama",
        other => panic!("model_type {other}: only qwen2 and llama"),
    };
    let (h, f, layers) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers);
    let (nq, nkv, dh) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let v = cfg.vocab_size;
    let k = |key: &str| format!("{arch}.{key}");
    let u = |x: u64| GgufValue::U32(x as u32);
    let mut w = GgufWriter::new()
        .kv("general.architecture", GgufValue::String(arch.into()))
        .kv("general.name", GgufValue::String(format!("random {} {kind}", args[1])))
        .kv(&k("block_count"), u(layers))
        .kv(&k("context_length"), u(cfg.max_position_embeddings.unwrap_or(32768)))
        .kv(&k("embedding_length"), u(h))
        .kv(&k("feed_forward_length"), u(f))
        .kv(&k("attention.head_count"), u(nq))
        .kv(&k("attention.head_count_kv"), u(nkv))
        .kv(&k("rope.freq_base"), GgufValue::F32(cfg.rope_theta.unwrap_or(10000.0) as f32))
        .kv(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(cfg.rms_norm_eps.unwrap_or(1e-6) as f32));
    w = vocab(w, v as usize, arch, &cfg);

    let more_bits = |i: u64| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
    let q6_if = |i: u64| if kind == "q4_k_m" && more_bits(i) { DType::Q6K } else { base };
    let small = DType::F32;
    // (name, dtype, ne innermost first)
    let mut t: Vec<(String, DType, Vec<u64>)> = vec![("token_embd.weight".into(), base, vec![h, v])];
    for i in 0..layers {
        let p = format!("blk.{i}.");
        t.push((format!("{p}attn_norm.weight"), small, vec![h]));
        t.push((format!("{p}attn_q.weight"), base, vec![h, nq * dh]));
        t.push((format!("{p}attn_k.weight"), base, vec![h, nkv * dh]));
        t.push((format!("{p}attn_v.weight"), q6_if(i), vec![h, nkv * dh]));
        if arch == "qwen2" {
            t.push((format!("{p}attn_q.bias"), small, vec![nq * dh]));
            t.push((format!("{p}attn_k.bias"), small, vec![nkv * dh]));
            t.push((format!("{p}attn_v.bias"), small, vec![nkv * dh]));
        }
        t.push((format!("{p}attn_output.weight"), base, vec![nq * dh, h]));
        t.push((format!("{p}ffn_norm.weight"), small, vec![h]));
        t.push((format!("{p}ffn_gate.weight"), base, vec![h, f]));
        t.push((format!("{p}ffn_up.weight"), base, vec![h, f]));
        t.push((format!("{p}ffn_down.weight"), q6_if(i), vec![f, h]));
    }
    t.push(("output_norm.weight".into(), small, vec![h]));
    if !cfg.tie_word_embeddings {
        let out = if kind == "q4_k_m" { DType::Q6K } else { base };
        t.push(("output.weight".into(), out, vec![h, v]));
    }
    for (name, dtype, ne) in &t {
        w = w.tensor(name, *dtype, ne, Vec::new());
    }
    let file = std::fs::File::create(&args[3]).unwrap_or_else(|e| panic!("{}: {e}", args[3]));
    let mut out = BufWriter::with_capacity(64 << 20, file);
    let start = std::time::Instant::now();
    w.write_streamed(&mut out, |i, buf| {
        let (name, dtype, _) = &t[i];
        let norm = name.ends_with("norm.weight");
        fill_parallel(*dtype, norm, i as u64, buf);
    })
    .unwrap_or_else(|e| panic!("{}: {e}", args[3]));
    out.flush().unwrap();
    let bytes = std::fs::metadata(&args[3]).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({:.2} GB, {} tensors) in {:.1}s",
        args[3],
        bytes as f64 / 1e9,
        t.len(),
        start.elapsed().as_secs_f64()
    );
}

/// The GPT-2 byte-to-character map (printable bytes as themselves, the rest from U+0100 on).
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// Byte-level BPE vocabulary of `n` tokens: the 256 byte tokens, "Ġt" with its one merge, filler tokens, and the
/// config's BOS/EOS ids as control tokens.
fn vocab(w: GgufWriter, n: usize, arch: &str, cfg: &HfConfig) -> GgufWriter {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    tokens.push("\u{0120}t".into());
    let mut types = vec![1i32; n];
    let bos = cfg.bos_token_id.as_ref().and_then(|b| b.first()).unwrap_or(0) as usize;
    let eos = cfg.eos_token_id.as_ref().and_then(|b| b.first()).unwrap_or(0) as usize;
    while tokens.len() < n {
        let i = tokens.len();
        tokens.push(if i == bos || i == eos { format!("<|special_{i}|>") } else { format!("[tok{i}]") });
    }
    for id in [bos, eos] {
        if id < n && id > 256 {
            types[id] = 3;
        }
    }
    let pre = if arch == "qwen2" { "qwen2" } else { "llama-bpe" };
    w.kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", GgufValue::String(pre.into()))
        .kv("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(tokens)))
        .kv("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(types)))
        .kv("tokenizer.ggml.merges", GgufValue::Array(GgufArray::String(vec!["\u{0120} t".into()])))
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(bos as u32))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(eos as u32))
        .kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(false))
}

/// Fills `buf` on all cores, 16 MiB pieces each seeded by (tensor, piece).
fn fill_parallel(dtype: DType, norm: bool, tensor: u64, buf: &mut [u8]) {
    let unit = dtype.block_bytes().max(1) * 4096;
    let piece = (16 << 20) / unit * unit;
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(4);
    let chunks: Vec<(usize, &mut [u8])> = buf.chunks_mut(piece.max(unit)).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    thread::scope(|s| {
        for g in groups {
            s.spawn(move || {
                for (j, c) in g {
                    let mut r = Rng(mix(tensor << 32 ^ j as u64) | 1);
                    fill(dtype, norm, &mut r, c);
                }
            });
        }
    });
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A small f16 scale (2^-9 .. 2^-6) with random mantissa and sign.
fn f16_scale(r: &mut Rng) -> [u8; 2] {
    let x = r.next();
    let h = (((x % 4) as u16 + 6) << 10) | ((x >> 8) as u16 & 0x3ff) | ((x >> 30) as u16 & 0x8000);
    h.to_le_bytes()
}

/// Random values as `tf_loader::dummy` draws them: bf16 matrices with exponents 2^-8 .. 2^-5, F32 norms near 1
/// and biases near 0, quant blocks of random bytes with small f16 scales at the scale fields.
fn fill(dtype: DType, norm: bool, r: &mut Rng, out: &mut [u8]) {
    match dtype {
        DType::BF16 => {
            for c in out.chunks_exact_mut(8) {
                let x = r.next();
                for (i, h) in c.chunks_exact_mut(2).enumerate() {
                    let y = x >> (16 * i);
                    let b = (((y % 4) as u16 + 119) << 7) | ((y >> 2) as u16 & 0x7f) | (((y >> 9) & 1) as u16) << 15;
                    h.copy_from_slice(&b.to_le_bytes());
                }
            }
        }
        DType::F32 => {
            for c in out.chunks_exact_mut(4) {
                let s = (r.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                let v = if norm { 1.0 + 0.5 * s } else { 0.05 * s };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for c in out.chunks_mut(8) {
                let v = r.next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
            let fields: &[usize] = match dtype {
                DType::Q8_0 => &[0],
                DType::Q4K => &[0, 2],
                DType::Q6K => &[208],
                other => panic!("no generator for {other}"),
            };
            for blk in out.chunks_exact_mut(dtype.block_bytes()) {
                for &at in fields {
                    blk[at..at + 2].copy_from_slice(&f16_scale(r));
                }
            }
        }
    }
}
