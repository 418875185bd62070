//! KV storage types (docs/arithmetic.md "KV storage types"): how K and V rows are rounded when written to the
//! paged cache and read back by attention. `f32` keeps the values as they are; `f16` and `q8_0` round each value
//! when it is written, from that row's own values only (one kv head's `[head_dim]` row for `q8_0`'s blocks), and
//! attention reads the stored values back exactly as f32 and then runs the f32 attention of
//! [`super::ops::attention`] unchanged. Each type is its own arithmetic: its replies differ from f32 KV, and every
//! equality of docs/design.md §2 holds within it.

use super::matmul::quantize_block;
use super::ops::{self, KvLayer};
use tf_core::{AttnMeta, AttnParams, Tensor};

/// Values per `q8_0` block (a kv head's row holds `head_dim / 32` of them).
pub const Q8_0_BLOCK: usize = 32;

/// How K and V values are stored in the paged cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f32: the values as computed.
    #[default]
    F32,
    /// IEEE binary16, rounded to nearest, ties to even.
    F16,
    /// Blocks of 32 values: an f16 scale `d` and 32 `i8` `q`, the value read back as `d · q`.
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// `f32`, `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The type a name (`f32`, `f16`, `q8_0`; any case) gives.
    pub fn parse(s: &str) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// Whether rows of `head_dim` values can be stored (`q8_0` needs whole blocks of 32 per kv head's row).
    pub fn check(self, head_dim: usize) -> Result<(), String> {
        match self {
            KvType::Q8_0 if !head_dim.is_multiple_of(Q8_0_BLOCK) => Err(format!(
                "KV type q8_0 stores blocks of {Q8_0_BLOCK} values of a head's row; head_dim {head_dim} is not a \
                 multiple of {Q8_0_BLOCK}"
            )),
            _ => Ok(()),
        }
    }

    /// Bytes of one stored row of `head_dim` values (one kv head of one slot, K or V): `4·head_dim`,
    /// `2·head_dim`, or `34` per block of 32 for `q8_0` (`head_dim / 32` rounded up).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F32 => 4 * head_dim,
            KvType::F16 => 2 * head_dim,
            KvType::Q8_0 => head_dim.div_ceil(Q8_0_BLOCK) * (2 + Q8_0_BLOCK),
        }
    }

    /// Bytes of K and V for one token over `layers` layers of `kv_heads` heads of `head_dim`.
    pub fn bytes_per_token(self, layers: usize, kv_heads: usize, head_dim: usize) -> usize {
        2 * layers * kv_heads * self.row_bytes(head_dim)
    }
}

/// `x` rounded to f16 (round to nearest, ties to even; beyond the f16 range ±inf; f16 subnormals kept; a NaN
/// stays a NaN): the bits.
#[inline]
pub fn f16_round(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// The f16 `h` as f32 (exact).
#[inline(always)]
pub fn f16_widen(h: u16) -> f32 {
    crate::float::f16_bits_to_f32(h)
}

/// `x` rounded to f16 into `out` (same length).
pub fn encode_f16(x: &[f32], out: &mut [u16]) {
    assert_eq!(x.len(), out.len(), "encode_f16: lengths");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f16_round(v);
    }
}

/// The f16 values `h` as f32 into `out` (same length).
pub fn decode_f16(h: &[u16], out: &mut [f32]) {
    assert_eq!(h.len(), out.len(), "decode_f16: lengths");
    for (o, &v) in out.iter_mut().zip(h) {
        *o = f16_widen(v);
    }
}

/// `x [32·b]` as `b` q8_0 blocks: scales `d [b]` (f16 bits) and `q [32·b]`. Per block, as llama.cpp's
/// `quantize_row_q8_0_ref`: `amax = max |x_i|`, `d = amax / 127` (f32), `id = 1 / d` (0 when `d == 0`),
/// `q_i = round_half_away(x_i · id)` clamped to `-127..=127` (a NaN product gives 0), and the stored scale is `d`
/// rounded to f16 (ties to even) after the `q_i` are computed from the f32 `d`.
pub fn encode_q8_0(x: &[f32], d: &mut [u16], q: &mut [i8]) {
    assert!(
        x.len().is_multiple_of(Q8_0_BLOCK) && q.len() == x.len() && d.len() * Q8_0_BLOCK == x.len(),
        "encode_q8_0: {} values, {} scales, {} quants",
        x.len(),
        d.len(),
        q.len()
    );
    for ((xb, qb), db) in x.chunks_exact(Q8_0_BLOCK).zip(q.chunks_exact_mut(Q8_0_BLOCK)).zip(d) {
        *db = f16_round(quantize_block(xb, qb));
    }
}

/// q8_0 blocks (`d [b]` f16 bits, `q [32·b]`) read back: `out[i] = f16(d) · q_i`, one f32 product.
pub fn decode_q8_0(d: &[u16], q: &[i8], out: &mut [f32]) {
    assert!(
        q.len() == out.len() && d.len() * Q8_0_BLOCK == q.len(),
        "decode_q8_0: {} scales, {} quants, {} outputs",
        d.len(),
        q.len(),
        out.len()
    );
    for ((ob, qb), &db) in out.chunks_exact_mut(Q8_0_BLOCK).zip(q.chunks_exact(Q8_0_BLOCK)).zip(d) {
        let s = f16_widen(db);
        for (o, &v) in ob.iter_mut().zip(qb) {
            *o = s * v as f32;
        }
    }
}

/// A layer's stored K (or V) of `[slots, kv_heads, head_dim]` values in one of the types.
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    /// f16 bits, `[slots, kv_heads, head_dim]`.
    F16(&'a [u16]),
    /// Scales `d [slots, kv_heads, head_dim / 32]` (f16 bits) and quants `q [slots, kv_heads, head_dim]`.
    Q8_0 {
        d: &'a [u16],
        q: &'a [i8],
    },
}

impl KvData<'_> {
    pub fn kv_type(&self) -> KvType {
        match self {
            KvData::F32(_) => KvType::F32,
            KvData::F16(_) => KvType::F16,
            KvData::Q8_0 { .. } => KvType::Q8_0,
        }
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        match self {
            KvData::F32(x) => x.len(),
            KvData::F16(x) => x.len(),
            KvData::Q8_0 { q, .. } => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `start .. start + out.len()` read back as f32 into `out` (for `q8_0`, whole blocks: `start` and the
    /// length are multiples of 32).
    #[inline]
    pub fn decode(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            KvData::F32(x) => out.copy_from_slice(&x[start..end]),
            KvData::F16(x) => decode_f16(&x[start..end], out),
            KvData::Q8_0 { d, q } => {
                assert!(
                    start.is_multiple_of(Q8_0_BLOCK) && end.is_multiple_of(Q8_0_BLOCK),
                    "q8_0: values {start}..{end}"
                );
                decode_q8_0(&d[start / Q8_0_BLOCK..end / Q8_0_BLOCK], &q[start..end], out)
            }
        }
    }
}

/// One layer of a paged KV cache in any storage type (K and V of the same type).
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    pub k: KvData<'a>,
    pub v: KvData<'a>,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl<'a> KvView<'a> {
    pub fn kv_type(&self) -> KvType {
        self.k.kv_type()
    }

    /// Number of token slots.
    pub fn slots(&self) -> usize {
        self.k.len() / (self.kv_heads * self.head_dim).max(1)
    }

    /// The f32 layer itself, for an f32 view.
    pub fn as_f32(&self) -> Option<KvLayer<'a>> {
        match (self.k, self.v) {
            (KvData::F32(k), KvData::F32(v)) => {
                Some(KvLayer { k, v, block_size: self.block_size, kv_heads: self.kv_heads, head_dim: self.head_dim })
            }
            _ => None,
        }
    }

    /// K of `slot`, kv head `h` read back into `out [head_dim]`.
    pub fn k_row(&self, slot: u32, h: usize, out: &mut [f32]) {
        self.k.decode((slot as usize * self.kv_heads + h) * self.head_dim, out)
    }

    /// V of `slot`, kv head `h` read back into `out [head_dim]`.
    pub fn v_row(&self, slot: u32, h: usize, out: &mut [f32]) {
        self.v.decode((slot as usize * self.kv_heads + h) * self.head_dim, out)
    }

    /// The whole layer read back: K and V as f32, each `[slots, kv_heads, head_dim]`.
    pub fn decode_all(&self) -> (Vec<f32>, Vec<f32>) {
        assert_eq!(self.k.len(), self.v.len(), "attention: K and V sizes");
        let (mut k, mut v) = (vec![0f32; self.k.len()], vec![0f32; self.v.len()]);
        self.k.decode(0, &mut k);
        self.v.decode(0, &mut v);
        (k, v)
    }
}

/// Attention over a layer of any storage type: the f32 attention ([`ops::attention`]) over the values read back.
pub fn attention(q: &Tensor, kv: &KvView, meta: &AttnMeta, p: &AttnParams) -> Tensor {
    let (k, v) = kv.decode_all();
    let layer = KvLayer { k: &k, v: &v, block_size: kv.block_size, kv_heads: kv.kv_heads, head_dim: kv.head_dim };
    ops::attention(q, &layer, meta, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
        assert_eq!(f16_round(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3·2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
        assert_eq!(f16_round(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f16_round(65520.0), 0x7c00); // halfway to the next power: +inf
        assert_eq!(f16_round(f32::powi(2.0, -24)), 0x0001); // the smallest subnormal
        assert_eq!(f16_round(-0.0), 0x8000);
        for h in [0x0001u16, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0xfbff, 0x8001] {
            assert_eq!(f16_round(f16_widen(h)), h, "f16 {h:#06x} round trip");
        }
    }

    #[test]
    fn q8_0_block_rule() {
        // [32]: amax 127 → d = 1 exactly; 2.5 and -2.5 round away from zero.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49;
        let (mut d, mut q) = ([0u16; 1], [0i8; 32]);
        encode_q8_0(&x, &mut d, &mut q);
        assert_eq!(d[0], 0x3c00);
        assert_eq!(&q[..4], &[127, 3, -3, 0]);
        let mut back = [0f32; 32];
        decode_q8_0(&d, &q, &mut back);
        assert_eq!(&back[..4], &[127.0, 3.0, -3.0, 0.0]);
        // All zeros: d = 0, every q 0.
        encode_q8_0(&[0.0; 32], &mut d, &mut q);
        assert_eq!((d[0], q), (0, [0; 32]));
    }

    #[test]
    fn row_bytes_per_type() {
        assert_eq!(KvType::F32.row_bytes(64), 256);
        assert_eq!(KvType::F16.row_bytes(64), 128);
        assert_eq!(KvType::Q8_0.row_bytes(64), 68);
        assert!(KvType::Q8_0.check(80).is_err() && KvType::Q8_0.check(96).is_ok() && KvType::F16.check(80).is_ok());
        assert_eq!(KvType::parse("Q8_0"), Some(KvType::Q8_0));
        assert_eq!(KvType::parse("q4_0"), None);
    }
}
