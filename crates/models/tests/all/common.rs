//! Helpers: opening checkpoints, building batches over a paged KV cache, comparing logits.

use tf_core::{AttnMeta, Backend, KvCache, RowAttn, StateIo, StateSrc};
use tf_loader::gguf::GgufFile;
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Batch, Model};

pub const BLOCK: usize = 16;

/// Opens a real GGUF model by its testkit short name and loads it on `be`.
pub fn gguf_model(be: &dyn Backend, short: &str) -> Box<dyn Model> {
    let file = GgufFile::open(tf_testkit::model_path(short)).unwrap_or_else(|e| panic!("{e}"));
    load_model(be, &file, &file).unwrap_or_else(|e| panic!("{short}: {e}"))
}

/// Opens a Hugging Face directory (config.json + safetensors) and loads it on `be`.
pub fn hf_model(be: &dyn Backend, dir: &std::path::Path) -> Box<dyn Model> {
    let cfg = HfConfig::from_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    let st = SafetensorsModel::open_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    load_model(be, &st, &cfg).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A sequence's place in the paged cache: its block table (deliberately not the identity, so paging is real).
#[derive(Clone)]
pub struct Seq {
    pub table: Vec<u32>,
}

impl Seq {
    /// Blocks `first, first + stride, ...` for `len` positions.
    pub fn new(len: usize, first: u32, stride: u32) -> Seq {
        Seq { table: (0..len.div_ceil(BLOCK) as u32).map(|i| first + i * stride).collect() }
    }

    pub fn slot(&self, pos: usize) -> u32 {
        self.table[pos / BLOCK] * BLOCK as u32 + (pos % BLOCK) as u32
    }

    /// Blocks this table touches (for sizing the pool).
    pub fn max_block(&self) -> u32 {
        *self.table.iter().max().unwrap()
    }
}

/// One row of a batch: sequence `seq` (index into the call's sequences), its token at `pos`, causal.
pub struct Row {
    pub seq: usize,
    pub pos: usize,
    pub token: u32,
}

/// A batch of causal rows over `seqs`, asking logits for every row.
pub fn batch(seqs: &[&Seq], rows: &[Row]) -> Batch {
    Batch {
        tokens: rows.iter().map(|r| r.token).collect(),
        positions: rows.iter().map(|r| r.pos as u32).collect(),
        slots: rows.iter().map(|r| seqs[r.seq].slot(r.pos)).collect(),
        attn: AttnMeta {
            block_tables: seqs.iter().map(|s| s.table.clone()).collect(),
            rows: rows
                .iter()
                .map(|r| RowAttn { pos: r.pos as u32, seq: r.seq, ctx: r.pos as u32 + 1, tree: vec![] })
                .collect(),
        },
        logit_rows: (0..rows.len()).collect(),
        fed: None,
        states: Vec::new(),
    }
}

pub fn alloc_kv(be: &dyn Backend, model: &dyn Model, blocks: usize) -> KvCache {
    be.alloc_kv(model.kv_spec(blocks, BLOCK)).expect("kv cache")
}

/// Logits of every position of `tokens`, filled in chunks of the given sizes (cycled), as one sequence.
pub fn run_chunked(be: &dyn Backend, model: &dyn Model, tokens: &[u32], chunks: &[usize]) -> Vec<Vec<f32>> {
    let seq = Seq::new(tokens.len(), 3, 2);
    let mut kv = alloc_kv(be, model, seq.max_block() as usize + 1);
    let vocab = model.vocab_size();
    let mut out = Vec::with_capacity(tokens.len());
    let (mut start, mut i) = (0, 0);
    while start < tokens.len() {
        let end = (start + chunks[i % chunks.len()]).min(tokens.len());
        let rows: Vec<Row> = (start..end).map(|p| Row { seq: 0, pos: p, token: tokens[p] }).collect();
        let logits = model.forward(be, &batch(&[&seq], &rows), &mut kv);
        let host = be.to_host(&logits);
        assert_eq!(host.len(), (end - start) * vocab);
        out.extend(host.chunks(vocab).map(<[f32]>::to_vec));
        start = end;
        i += 1;
    }
    out
}

/// A KV cache with `registers` state registers.
pub fn state_cache(be: &dyn Backend, model: &dyn Model, blocks: usize, registers: usize) -> KvCache {
    let mut kv = alloc_kv(be, model, blocks);
    let spec = model.state_spec().expect("a hybrid model has recurrent state");
    kv.states = Some(be.alloc_states(spec.with_registers(registers)).expect("state registers"));
    kv
}

/// Logits of every position of `tokens` for a model with recurrent state, as one sequence filled in chunks
/// (cycled sizes) and chained through its state: a chunk's first row reads the register the previous chunk's last
/// row wrote (registers 0 and 1 alternate), every other row the row before it.
pub fn run_with_states(be: &dyn Backend, model: &dyn Model, tokens: &[u32], chunks: &[usize]) -> Vec<Vec<f32>> {
    let seq = Seq::new(tokens.len(), 3, 2);
    let mut kv = state_cache(be, model, seq.max_block() as usize + 1, 2);
    let vocab = model.vocab_size();
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while start < tokens.len() {
        let end = (start + chunks[i % chunks.len()]).min(tokens.len());
        let rows: Vec<Row> = (start..end).map(|p| Row { seq: 0, pos: p, token: tokens[p] }).collect();
        let mut b = batch(&[&seq], &rows);
        b.states = state_chain(start, end - start, (i % 2) as u32);
        out.extend(be.to_host(&model.forward(be, &b, &mut kv)).chunks(vocab).map(<[f32]>::to_vec));
        start = end;
        i += 1;
    }
    out
}

/// States of a chain of `len` rows starting at `start`: the first reads register `1 - w` (or zeros at position
/// 0), the last writes register `w`.
pub fn state_chain(start: usize, len: usize, w: u32) -> Vec<StateIo> {
    (0..len)
        .map(|j| StateIo {
            src: match j {
                0 if start == 0 => StateSrc::Zero,
                0 => StateSrc::Reg(1 - w),
                _ => StateSrc::Row(j - 1),
            },
            dst: (j + 1 == len).then_some(w),
        })
        .collect()
}

/// Logits at `positions` of `tokens` filled as one chunk.
pub fn run_one_chunk(be: &dyn Backend, model: &dyn Model, tokens: &[u32], positions: &[usize]) -> Vec<Vec<f32>> {
    let seq = Seq::new(tokens.len(), 1, 1);
    let mut kv = alloc_kv(be, model, seq.max_block() as usize + 1);
    let rows: Vec<Row> = tokens.iter().enumerate().map(|(p, &t)| Row { seq: 0, pos: p, token: t }).collect();
    let mut b = batch(&[&seq], &rows);
    b.logit_rows = positions.to_vec();
    let host = be.to_host(&model.forward(be, &b, &mut kv));
    host.chunks(model.vocab_size()).map(<[f32]>::to_vec).collect()
}

/// The first position and column where two logit sets differ bitwise, if any.
pub fn first_bit_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> Option<(usize, usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    for (p, (ra, rb)) in a.iter().zip(b).enumerate() {
        if let Some(c) = ra.iter().zip(rb).position(|(x, y)| x.to_bits() != y.to_bits()) {
            return Some((p, c, ra[c], rb[c]));
        }
    }
    None
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// ~`n` deterministic pseudo-random token ids below `vocab` (a fixed LCG; no shared RNG state).
pub fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}
