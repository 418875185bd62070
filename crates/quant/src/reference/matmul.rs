//! The scalar reference of the matmul (docs/arithmetic.md, "matmul"): `y[r][n] = x[r] · w[n] (+ bias[n])` for a
//! weight `w [out, in]` of any supported type, in both precision modes. Plain, slow, and the definition: every
//! fast kernel must reproduce these bits.
//!
//! Orders defined here:
//! - [`dot16`] / [`sum16`]: 16 lane accumulators (`i % 16`), then the fixed tree of [`tree16`].
//! - `full` mode: `dot16(x[r], dequantize(w[n]))`, then `+ bias[n]`.
//! - `checkpoint` mode: the activation row is quantized block by block ([`quantize_block`]); each weight block's
//!   integer dot with its activation block (exact, any order) is scaled and folded into one f32 accumulator,
//!   block after block in increasing order ([`CheckpointBlock::update`]); then `+ bias[n]`.

// The per-type decoders index like the field docs they follow, on purpose.
#![allow(clippy::needless_range_loop)]

use tf_core::{DType, Precision};

use crate::{
    cast_blocks, dequantize, e8m0_to_f32_half, f16_to_f32, iq4xs_scales, q3k_scales, q4k_scale_min, BlockIQ1S,
    BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K,
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    QuantBlock, KVALUES_IQ4NL, KVALUES_MXFP4,
};

/// Lanes of the canonical f32 reduction.
pub const LANES: usize = 16;

/// The fixed tree over 16 lane accumulators: `t8[j] = acc[j] + acc[j+8]`, `t4[j] = t8[j] + t8[j+4]`,
/// `t2[j] = t4[j] + t4[j+2]`, result `t2[0] + t2[1]`.
pub fn tree16(acc: &[f32; LANES]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|j| acc[j] + acc[j + 8]);
    let t4: [f32; 4] = std::array::from_fn(|j| t8[j] + t8[j + 4]);
    let t2: [f32; 2] = std::array::from_fn(|j| t4[j] + t4[j + 2]);
    t2[0] + t2[1]
}

/// The canonical f32 dot product: `acc[i % 16] = fma(a[i], b[i], acc[i % 16])` for `i` increasing from lanes at
/// `+0.0`, then [`tree16`]. Elements past the length add nothing (not even `+0.0`). Panics on unequal lengths.
pub fn dot16(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot16: lengths differ");
    let mut acc = [0f32; LANES];
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        acc[i % LANES] = x.mul_add(y, acc[i % LANES]);
    }
    tree16(&acc)
}

/// The canonical f32 sum: `acc[i % 16] = acc[i % 16] + a[i]`, then [`tree16`].
pub fn sum16(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, &x) in a.iter().enumerate() {
        acc[i % LANES] += x;
    }
    tree16(&acc)
}

/// Quantizes one activation block (32 or 256 values) into `q` (same length) and returns its scale `d`.
///
/// `amax = max |x_i|` (starting at `+0.0`, a NaN is never larger, so NaNs are ignored); `d = amax / 127`;
/// `id = 1 / d` if `d != 0`, else `0`; `q_i = clamp(round_half_away(x_i * id), -127, 127)` where a NaN product
/// gives `0` (Rust's `as i8`). The clamp only acts when `1 / d` overflows (`amax < 2^-121`); it keeps every
/// `q_i` in `-127..=127`, which the SIMD kernels rely on.
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_block: lengths differ");
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
        }
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id).round() as i8).max(-127);
    }
    d
}

/// Elements summed into one entry of [`QuantRow::sums`] for a block size: the whole block for 32-element blocks,
/// groups of 16 for 256-element blocks.
pub fn sum_group(block: usize) -> usize {
    if block == 256 {
        16
    } else {
        block
    }
}

/// One activation row quantized to blocks of `block` (32 or 256) elements.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRow {
    pub block: usize,
    /// `[in]`: the quantized values, in element order.
    pub qs: Vec<i8>,
    /// `[in / block]`: the per-block scales.
    pub d: Vec<f32>,
    /// `[in / sum_group(block)]`: `Σ q` over each group ([`sum_group`]); `|sum| <= 32 * 127` fits i16.
    pub sums: Vec<i16>,
}

impl QuantRow {
    /// Block `b` of the row.
    pub fn block(&self, b: usize) -> ActBlock<'_> {
        let g = self.block / sum_group(self.block);
        ActBlock {
            qs: &self.qs[b * self.block..(b + 1) * self.block],
            d: self.d[b],
            sums: &self.sums[b * g..(b + 1) * g],
        }
    }
}

/// Quantizes an activation row into blocks of `block` elements (`x.len()` a multiple of `block`).
pub fn quantize_row(x: &[f32], block: usize) -> QuantRow {
    assert!(block == 32 || block == 256, "activation blocks are 32 or 256 elements");
    assert_eq!(x.len() % block, 0, "quantize_row: {} values are not whole blocks of {block}", x.len());
    let mut qs = vec![0i8; x.len()];
    let d = x.chunks_exact(block).zip(qs.chunks_exact_mut(block)).map(|(x, q)| quantize_block(x, q)).collect();
    let sums = qs.chunks_exact(sum_group(block)).map(|g| g.iter().map(|&q| q as i16).sum()).collect();
    QuantRow { block, qs, d, sums }
}

/// One quantized activation block as the checkpoint dot products see it.
#[derive(Clone, Copy, Debug)]
pub struct ActBlock<'a> {
    /// `[block]` quantized values.
    pub qs: &'a [i8],
    /// The block scale.
    pub d: f32,
    /// `[1]` (32-element blocks) or `[16]` (256-element blocks): the sums of [`QuantRow::sums`].
    pub sums: &'a [i16],
}

/// A weight block type with a checkpoint-mode dot product.
pub trait CheckpointBlock: QuantBlock {
    /// Activation block size: 32 for the legacy types, IQ4_NL and MXFP4, 256 for the K-quants and the other
    /// i-quants.
    const ACT_BLOCK: usize;
    /// Folds this block's dot with `a` into `acc` (docs/arithmetic.md, per-block float update).
    fn update(&self, a: &ActBlock, acc: f32) -> f32;
}

/// The activation block size of `dtype` in checkpoint mode, or `None` if it uses the full path (F32/F16/BF16).
pub fn checkpoint_block(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5_1
        | DType::Q8_0
        | DType::Q8_1
        | DType::IQ4NL
        | DType::MXFP4 => Some(32),
        DType::Q2K
        | DType::Q3K
        | DType::Q4K
        | DType::Q5K
        | DType::Q6K
        | DType::Q8K
        | DType::IQ4XS
        | DType::IQ3S
        | DType::IQ3XXS
        | DType::IQ2XXS
        | DType::IQ2XS
        | DType::IQ1S
        | DType::IQ2S => Some(256),
        _ => None,
    }
}

/// Σ a_i·b_i of a weight value sequence with activation values, in i32 (exact).
fn isum(w: impl Iterator<Item = i32>, x: &[i8]) -> i32 {
    w.zip(x).map(|(w, &x)| w * x as i32).sum()
}

/// Element `i` (< 32) of a legacy 4-bit nibble array: `qs[i % 16]`, low nibble for `i < 16`, high otherwise.
fn nibble32(qs: &[u8; 16], i: usize) -> i32 {
    if i < 16 {
        (qs[i] & 15) as i32
    } else {
        (qs[i - 16] >> 4) as i32
    }
}

/// Bit `i` of a Q5 `qh` (little-endian u32).
fn bit32(qh: &[u8; 4], i: usize) -> i32 {
    ((u32::from_le_bytes(*qh) >> i) & 1) as i32
}

impl CheckpointBlock for BlockQ4_0 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ (q - 8)·qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| nibble32(&self.qs, i) - 8), a.qs);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockQ4_1 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ q·qx, acc)`, then `acc = fma(mw * dx, Σ qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| nibble32(&self.qs, i)), a.qs);
        let acc = (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc);
        (f16_to_f32(self.m) * a.d).mul_add(a.sums[0] as f32, acc)
    }
}

impl CheckpointBlock for BlockQ5_0 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ (q - 16)·qx, acc)` with `q = nibble | bit << 4`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| nibble32(&self.qs, i) + 16 * bit32(&self.qh, i) - 16), a.qs);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockQ5_1 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ q·qx, acc)`, then `acc = fma(mw * dx, Σ qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| nibble32(&self.qs, i) + 16 * bit32(&self.qh, i)), a.qs);
        let acc = (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc);
        (f16_to_f32(self.m) * a.d).mul_add(a.sums[0] as f32, acc)
    }
}

impl CheckpointBlock for BlockQ8_0 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ q·qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum(self.qs.iter().map(|&q| q as i32), a.qs);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockQ8_1 {
    const ACT_BLOCK: usize = 32;
    /// As Q8_0 (`s` is ignored): `acc = fma(dw * dx, Σ q·qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum(self.qs.iter().map(|&q| q as i32), a.qs);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

/// Element `i` (< 32) of a 32-element run of IQ4 indices, through the table: `kvalues[nibble32(qs, i)]`.
fn iq4(qs: &[u8; 16], i: usize) -> i32 {
    KVALUES_IQ4NL[nibble32(qs, i) as usize] as i32
}

impl CheckpointBlock for BlockIQ4NL {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ kvalues[q]·qx, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| iq4(&self.qs, i)), a.qs);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockMXFP4 {
    const ACT_BLOCK: usize = 32;
    /// `acc = fma(dw * dx, Σ kvalues[q]·qx, acc)` with `dw = e8m0_to_f32_half(e)` (doubled E2M1 values, halved
    /// scale, as dequantization).
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum((0..32).map(|i| KVALUES_MXFP4[nibble32(&self.qs, i) as usize] as i32), a.qs);
        (e8m0_to_f32_half(self.e) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ4XS {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (ls_j - 32) · Σ kvalues[q]·qx` over 8 sub-blocks of 32; `acc = fma(dw * dx, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] = std::array::from_fn(|e| {
            let qs: &[u8; 16] = self.qs[16 * (e / 32)..16 * (e / 32) + 16].try_into().unwrap();
            iq4(qs, e % 32)
        });
        let sc = iq4xs_scales(self.scales_h, &self.scales_l);
        let s = scaled_isum(&q, a.qs, 32, |j| sc[j] as i32);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ3S {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (1 + 2 sc_j) · Σ ±grid·qx` over 8 sub-blocks of 32; `acc = fma(dw * dx, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q = signed_grid(|e| (self.grid_value(e) as i32, self.negative(e)));
        let s = scaled_isum(&q, a.qs, 32, |j| 1 + 2 * self.scale(j) as i32);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ3XXS {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (2 sc_j + 1) · Σ ±grid·qx` over 8 sub-blocks of 32; `acc = fma((dw * dx) * 0.25, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q = signed_grid(|e| (self.grid_value(e) as i32, self.negative(e)));
        let s = scaled_isum(&q, a.qs, 32, |j| 1 + 2 * self.scale(j) as i32);
        ((f16_to_f32(self.d) * a.d) * 0.25).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ2XXS {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (2 sc_j + 1) · Σ ±grid·qx` over 8 sub-blocks of 32; `acc = fma((dw * dx) * 0.125, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q = signed_grid(|e| (self.grid_value(e) as i32, self.negative(e)));
        let s = scaled_isum(&q, a.qs, 32, |j| 1 + 2 * self.scale(j) as i32);
        ((f16_to_f32(self.d) * a.d) * 0.125).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ2XS {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (2 sc_j + 1) · Σ ±grid·qx` over 16 sub-blocks of 16; `acc = fma((dw * dx) * 0.125, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q = signed_grid(|e| (self.grid_value(e) as i32, self.negative(e)));
        let s = scaled_isum(&q, a.qs, 16, |j| 1 + 2 * self.scale(j) as i32);
        ((f16_to_f32(self.d) * a.d) * 0.125).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ2S {
    const ACT_BLOCK: usize = 256;
    /// As IQ2_XS (10-bit grid index, one sign bit per element): `S = Σ_j (2 sc_j + 1) · Σ ±grid·qx` over 16
    /// sub-blocks of 16; `acc = fma((dw * dx) * 0.125, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q = signed_grid(|e| (self.grid_value(e) as i32, self.negative(e)));
        let s = scaled_isum(&q, a.qs, 16, |j| 1 + 2 * self.scale(j) as i32);
        ((f16_to_f32(self.d) * a.d) * 0.125).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockIQ1S {
    const ACT_BLOCK: usize = 256;
    /// The element values times 8 are the integers `8 grid ± 1`: `S = Σ_j (2 sc_j + 1) · Σ (8 grid ± 1)·qx` over 8
    /// sub-blocks of 32; `acc = fma((dw * dx) * 0.125, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] = std::array::from_fn(|e| {
            let delta = if self.delta_negative(e / 32) { -1 } else { 1 };
            8 * self.grid_value(e) as i32 + delta
        });
        let s = scaled_isum(&q, a.qs, 32, |j| 1 + 2 * self.scale(j) as i32);
        ((f16_to_f32(self.d) * a.d) * 0.125).mul_add(s as f32, acc)
    }
}

/// A super-block's 256 signed grid values: `-g` where `value(e)` says element `e` is negative, else `g`.
fn signed_grid(value: impl Fn(usize) -> (i32, bool)) -> [i32; 256] {
    std::array::from_fn(|e| match value(e) {
        (g, true) => -g,
        (g, false) => g,
    })
}

/// Σ_j scale_j · Σ_{i in sub-block j} q_i·qx_i over sub-blocks of `sub` elements.
fn scaled_isum(q: &[i32; 256], x: &[i8], sub: usize, scale: impl Fn(usize) -> i32) -> i32 {
    (0..256 / sub).map(|j| scale(j) * isum(q[sub * j..sub * (j + 1)].iter().copied(), &x[sub * j..])).sum()
}

/// The 2-bit field of element `e` in the Q2_K / Q3_K `qs` layout: `(qs[32 (e / 128) + e % 32] >> 2 ((e % 128) / 32)) & 3`.
fn crumb(qs: &[u8; 64], e: usize) -> i32 {
    ((qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) as i32
}

/// The 4-bit field of element `e` in the Q4_K / Q5_K `qs` layout: `(qs[32 (e / 64) + e % 32] >> 4 ((e % 64) / 32)) & 15`.
fn nibble256(qs: &[u8; 128], e: usize) -> i32 {
    ((qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 15) as i32
}

/// Final update of the K-quants with mins: `acc = fma(dw * dx, S, acc)`, then `acc = fma(-(dmin * dx), M, acc)`.
fn update_sm(d: f32, dmin: f32, dx: f32, s: i32, m: i32, acc: f32) -> f32 {
    let acc = (d * dx).mul_add(s as f32, acc);
    (-(dmin * dx)).mul_add(m as f32, acc)
}

impl CheckpointBlock for BlockQ2K {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (sc_j & 15) · Σ q·qx`, `M = Σ_j (sc_j >> 4) · bsum[j]` over 16 sub-blocks of 16.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] = std::array::from_fn(|e| crumb(&self.qs, e));
        let s = scaled_isum(&q, a.qs, 16, |j| (self.scales[j] & 15) as i32);
        let m: i32 = (0..16).map(|j| (self.scales[j] >> 4) as i32 * a.sums[j] as i32).sum();
        update_sm(f16_to_f32(self.d), f16_to_f32(self.dmin), a.d, s, m, acc)
    }
}

impl CheckpointBlock for BlockQ3K {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j (sc_j - 32) · Σ q·qx` with `q = crumb + 4·hbit - 4` (−4..=3); `acc = fma(dw * dx, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] =
            std::array::from_fn(|e| crumb(&self.qs, e) + 4 * ((self.hmask[e % 32] >> (e / 32)) & 1) as i32 - 4);
        let sc = q3k_scales(&self.scales);
        let s = scaled_isum(&q, a.qs, 16, |j| sc[j] as i32);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockQ4K {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j sc_j · Σ q·qx`, `M = Σ_j m_j · (bsum[2j] + bsum[2j+1])` over 8 sub-blocks of 32.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] = std::array::from_fn(|e| nibble256(&self.qs, e));
        let (sc, mn) = q4k_scale_min(&self.scales);
        let s = scaled_isum(&q, a.qs, 32, |j| sc[j] as i32);
        let m: i32 = (0..8).map(|j| mn[j] as i32 * (a.sums[2 * j] as i32 + a.sums[2 * j + 1] as i32)).sum();
        update_sm(f16_to_f32(self.d), f16_to_f32(self.dmin), a.d, s, m, acc)
    }
}

impl CheckpointBlock for BlockQ5K {
    const ACT_BLOCK: usize = 256;
    /// As Q4_K with `q = nibble | ((qh[e % 32] >> (e / 32)) & 1) << 4`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] =
            std::array::from_fn(|e| nibble256(&self.qs, e) + 16 * ((self.qh[e % 32] >> (e / 32)) & 1) as i32);
        let (sc, mn) = q4k_scale_min(&self.scales);
        let s = scaled_isum(&q, a.qs, 32, |j| sc[j] as i32);
        let m: i32 = (0..8).map(|j| mn[j] as i32 * (a.sums[2 * j] as i32 + a.sums[2 * j + 1] as i32)).sum();
        update_sm(f16_to_f32(self.d), f16_to_f32(self.dmin), a.d, s, m, acc)
    }
}

impl CheckpointBlock for BlockQ6K {
    const ACT_BLOCK: usize = 256;
    /// `S = Σ_j sc_j · Σ (q - 32)·qx` over 16 sub-blocks of 16; `acc = fma(dw * dx, S, acc)`.
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let q: [i32; 256] = std::array::from_fn(|e| {
            let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = (self.ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
            let high = (self.qh[32 * h + l] >> (2 * t)) & 3;
            (low | (high << 4)) as i32 - 32
        });
        let s = scaled_isum(&q, a.qs, 16, |j| self.scales[j] as i32);
        (f16_to_f32(self.d) * a.d).mul_add(s as f32, acc)
    }
}

impl CheckpointBlock for BlockQ8K {
    const ACT_BLOCK: usize = 256;
    /// `acc = fma(dw * dx, Σ q·qx, acc)` (`dw` is an f32 here).
    fn update(&self, a: &ActBlock, acc: f32) -> f32 {
        let s = isum(self.qs.iter().map(|&q| q as i32), a.qs);
        (self.d * a.d).mul_add(s as f32, acc)
    }
}

/// The checkpoint-mode dot of one weight row (`w`: raw bytes of `in / B::BLOCK` blocks) with a quantized row.
pub fn row_dot<B: CheckpointBlock>(w: &[u8], x: &QuantRow) -> f32 {
    assert_eq!(x.block, B::ACT_BLOCK, "activation block size");
    let blocks = cast_blocks::<B>(w).expect("whole blocks");
    assert_eq!(blocks.len() * B::BLOCK, x.qs.len(), "row_dot: weight row and activation row lengths differ");
    blocks.iter().enumerate().fold(0f32, |acc, (b, blk)| blk.update(&x.block(b), acc))
}

/// [`row_dot`] for a runtime `dtype` (a quantized type of [`checkpoint_block`]).
pub fn row_dot_dyn(dtype: DType, w: &[u8], x: &QuantRow) -> f32 {
    match dtype {
        DType::Q4_0 => row_dot::<BlockQ4_0>(w, x),
        DType::Q4_1 => row_dot::<BlockQ4_1>(w, x),
        DType::Q5_0 => row_dot::<BlockQ5_0>(w, x),
        DType::Q5_1 => row_dot::<BlockQ5_1>(w, x),
        DType::Q8_0 => row_dot::<BlockQ8_0>(w, x),
        DType::Q8_1 => row_dot::<BlockQ8_1>(w, x),
        DType::Q2K => row_dot::<BlockQ2K>(w, x),
        DType::Q3K => row_dot::<BlockQ3K>(w, x),
        DType::Q4K => row_dot::<BlockQ4K>(w, x),
        DType::Q5K => row_dot::<BlockQ5K>(w, x),
        DType::Q6K => row_dot::<BlockQ6K>(w, x),
        DType::Q8K => row_dot::<BlockQ8K>(w, x),
        DType::IQ4NL => row_dot::<BlockIQ4NL>(w, x),
        DType::IQ4XS => row_dot::<BlockIQ4XS>(w, x),
        DType::IQ3S => row_dot::<BlockIQ3S>(w, x),
        DType::IQ3XXS => row_dot::<BlockIQ3XXS>(w, x),
        DType::MXFP4 => row_dot::<BlockMXFP4>(w, x),
        DType::IQ2XXS => row_dot::<BlockIQ2XXS>(w, x),
        DType::IQ2XS => row_dot::<BlockIQ2XS>(w, x),
        DType::IQ1S => row_dot::<BlockIQ1S>(w, x),
        DType::IQ2S => row_dot::<BlockIQ2S>(w, x),
        _ => panic!("{dtype} has no checkpoint-mode dot product"),
    }
}

/// The reference matmul: `x` is `[rows, in_dim]` row-major, `w` the raw bytes of a `[out_dim, in_dim]` weight of
/// type `dtype`, `bias` `[out_dim]`. Returns `[rows, out_dim]` row-major.
///
/// `full` mode (and float weights in either mode): `y = dot16(x[r], dequantize(w[n]))`. `checkpoint` mode with a
/// quantized weight: each row quantized once ([`quantize_row`]), `y = row_dot(w[n], xq[r])`. Then `y + bias[n]`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_ref(
    precision: Precision,
    x: &[f32],
    rows: usize,
    dtype: DType,
    w: &[u8],
    out_dim: usize,
    in_dim: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    assert_eq!(x.len(), rows * in_dim, "matmul_ref: x is not [rows, in_dim]");
    assert_eq!(in_dim % dtype.block_size(), 0, "matmul_ref: in_dim is not whole blocks");
    let row_bytes = in_dim / dtype.block_size() * dtype.block_bytes();
    assert_eq!(w.len(), out_dim * row_bytes, "matmul_ref: weight bytes are not [out_dim, in_dim]");
    if let Some(b) = bias {
        assert_eq!(b.len(), out_dim, "matmul_ref: bias length");
    }
    let act_block = checkpoint_block(dtype).filter(|_| precision == Precision::Checkpoint);
    let mut y = vec![0f32; rows * out_dim];
    match act_block {
        None => {
            let mut wrow = vec![0f32; in_dim];
            for n in 0..out_dim {
                dequantize(dtype, &w[n * row_bytes..(n + 1) * row_bytes], &mut wrow).expect("supported type");
                for r in 0..rows {
                    y[r * out_dim + n] = dot16(&x[r * in_dim..(r + 1) * in_dim], &wrow);
                }
            }
        }
        Some(block) => {
            let xq: Vec<QuantRow> = x.chunks_exact(in_dim.max(1)).take(rows).map(|r| quantize_row(r, block)).collect();
            for n in 0..out_dim {
                let wrow = &w[n * row_bytes..(n + 1) * row_bytes];
                for (r, xq) in xq.iter().enumerate() {
                    y[r * out_dim + n] = row_dot_dyn(dtype, wrow, xq);
                }
            }
        }
    }
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(out_dim.max(1)) {
            for (y, &b) in row.iter_mut().zip(b) {
                *y += b;
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn dot16_follows_the_lane_order_and_tree() {
        // Lane 0 gets 1e8 then -1e8 (i = 0, 16), lane 1 gets 1.0: an ordered sum would lose the 1.0 differently.
        let mut a = vec![0f32; 20];
        let b = vec![1f32; 20];
        a[0] = 1e8;
        a[16] = -1e8;
        a[1] = 1.0;
        a[17] = 3.0;
        assert_eq!(dot16(&a, &b), 4.0);
        // Tree: lanes j and j + 8 meet first. 2^24 + 1 + 1 in the wrong order rounds differently.
        let mut a = [0f32; 16];
        a[0] = 16777216.0;
        a[8] = 1.0;
        a[4] = 1.0;
        // t8[0] = 2^24 + 1 = 2^24 (ties to even), t8[4] = 1, t4[0] = 2^24 + 1 = 2^24.
        assert_eq!(dot16(&a, &[1.0; 16]), 16777216.0);
        assert_eq!(sum16(&a), 16777216.0);
        // A sign survives the tree only through fma(-0) lanes at +0.0: an empty dot is +0.
        assert_eq!(dot16(&[], &[]).to_bits(), 0);
    }

    #[test]
    fn quantize_block_rule() {
        let x = [1.0f32, -0.5, 0.25, 0.0];
        let mut q = [0i8; 4];
        let d = quantize_block(&x, &mut q);
        assert_eq!(d, 1.0 / 127.0);
        assert_eq!(q, [127, -64, 32, 0]); // -63.5 rounds away from zero
        let d = quantize_block(&[0.0; 4], &mut q);
        assert_eq!((d, q), (0.0, [0; 4]));
        let d = quantize_block(&[f32::NAN, 2.0, -2.0, 1.0], &mut q);
        assert_eq!(d, 2.0 / 127.0);
        assert_eq!(q, [0, 127, -127, 64]);
        // 1/d overflows: the clamp keeps -127.
        let tiny = f32::from_bits(2 << 23); // 2^-125: d is subnormal, 1/d is +inf
        let d = quantize_block(&[tiny, -tiny, 0.0, 0.0], &mut q);
        assert!(d > 0.0 && (1.0 / d).is_infinite());
        assert_eq!(q, [127, -127, 0, 0]);
        let row = quantize_row(&[1.0; 256], 256);
        assert_eq!(row.sums, vec![16 * 127; 16]);
    }

    fn random_weight(dtype: DType, out: usize, inn: usize, rng: &mut impl Rng) -> Vec<u8> {
        let bb = dtype.block_bytes();
        let mut w = vec![0u8; out * inn / dtype.block_size() * bb];
        rng.fill(&mut w[..]);
        // Finite, modest f16 scales: exponent field forced to 8..14 (2^-7..2^-1).
        let f16_fields: &[usize] = match dtype {
            DType::Q4_0
            | DType::Q5_0
            | DType::Q8_0
            | DType::IQ4NL
            | DType::IQ4XS
            | DType::IQ3S
            | DType::IQ3XXS
            | DType::IQ2XXS
            | DType::IQ2XS
            | DType::IQ1S
            | DType::IQ2S => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => &[0, 2],
            DType::Q2K => &[80, 82],
            DType::Q3K => &[108],
            DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q6K => &[208],
            _ => &[],
        };
        for blk in w.chunks_exact_mut(bb) {
            for &at in f16_fields {
                let h = (rng.gen_range(8u16..15) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000);
                blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
            if dtype == DType::Q8K {
                blk[0..4].copy_from_slice(&rng.gen_range(-0.01f32..0.01).to_le_bytes());
            }
            // E8M0 scales 2^-128..2^32: subnormal to large, never overflowing a row's sum.
            if dtype == DType::MXFP4 {
                blk[0] = rng.gen_range(0..=160);
            }
        }
        w
    }

    /// Checkpoint mode is the exact dot of dequantized weights with the dequantized activation blocks (each
    /// product exact in f64), up to the f32 rounding of the per-block updates: a wrong decomposition fails.
    #[test]
    fn checkpoint_equals_dequantized_activation_dot() {
        let seed: u64 = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q8_1,
            DType::Q2K,
            DType::Q3K,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
            DType::Q8K,
            DType::IQ4NL,
            DType::IQ4XS,
            DType::IQ3S,
            DType::IQ3XXS,
            DType::MXFP4,
            DType::IQ2XXS,
            DType::IQ2XS,
            DType::IQ1S,
            DType::IQ2S,
        ] {
            let (out, inn) = (3, 512);
            let w = random_weight(dtype, out, inn, &mut rng);
            let x: Vec<f32> = (0..inn).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let y = matmul_ref(Precision::Checkpoint, &x, 1, dtype, &w, out, inn, None);
            let xq = quantize_row(&x, checkpoint_block(dtype).unwrap());
            let wd = crate::dequantize_to_vec(dtype, &w, out * inn).unwrap();
            for n in 0..out {
                let (mut exact, mut mag) = (0f64, 0f64);
                for i in 0..inn {
                    let xv = xq.qs[i] as f64 * xq.d[i / xq.block] as f64;
                    exact += wd[n * inn + i] as f64 * xv;
                    mag += (wd[n * inn + i] as f64 * xv).abs();
                }
                let err = (y[n] as f64 - exact).abs();
                assert!(err <= 1e-5 * mag + 1e-30, "{dtype} n={n}: {} vs {exact} (mag {mag}), seed {seed}", y[n]);
            }
        }
    }

    #[test]
    fn full_mode_is_dot16_of_dequantized_rows_plus_bias() {
        let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let x = [1.0f32, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 1.0];
        let y = matmul_ref(Precision::Checkpoint, &x, 2, DType::F32, &w, 2, 4, Some(&[0.5, -0.5]));
        assert_eq!(y, vec![10.5, 1.0, 6.5, -0.5]);
    }
}
