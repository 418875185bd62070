//! Checkpoint mode with NEON for the 32-element GGUF types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1).
//!
//! Per block and lane: the weight block's 32 values as signed bytes with the type's offset already taken off
//! (`q - 8` for Q4_0, `q - 16` for Q5_0, in −16..=15; the `_1` types' `0..=31`; Q8's −128..=127), their exact
//! integer dot with the activation block ([`dot_acc`]: `smull`/`smlal2` + `sadalp`), the eight lanes' partials
//! reduced at once ([`reduce8`]), then the reference's float update on all lanes: `acc = fma(dw * dx, S, acc)`
//! (and `acc = fma(mw * dx, Σqx, acc)` for the `_1` types, `Σqx` from `ActQ::s_t`). `dw`/`mw` of the lanes'
//! weight rows are read from the blocks and converted exactly ([`f16_lanes`]). The structure follows
//! `avx2_legacy.rs` (same tile shapes and lane order); no software prefetch (aarch64's prefetch intrinsics are
//! not stable in Rust), which changes no value.

use std::arch::aarch64::*;

use tf_core::DType;

use super::act::ActQ;
use super::neon::{by_rows, dot16_i8, dot_acc, f16_lanes, lanes, mul, pattern_f32, pattern_i32, reduce8, update};
use super::QuantKernel;

/// A legacy block layout.
trait Legacy {
    /// Bytes per block.
    const BYTES: usize;
    /// Whether the block has an offset `m` (an f16 at byte 2, right after `d` at byte 0).
    const HAS_MIN: bool;
    /// The 32 values of the block at `blk` as signed bytes in element order (elements 0..16, 16..32), with the
    /// type's offset subtracted.
    ///
    /// # Safety
    /// NEON; `blk` points at a whole block.
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2];
}

/// 16 bytes of nibbles at `qs` → elements 0..16 (low nibbles) and 16..32 (high nibbles), each minus `off`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles(qs: *const u8, off: i8) -> [int8x16_t; 2] {
    let q = vld1q_u8(qs);
    let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
    [vsubq_s8(lo, vdupq_n_s8(off)), vsubq_s8(hi, vdupq_n_s8(off))]
}

/// 16 (0x10) in byte `i` (elements 0..16, then 16..32) where bit `i` of the little-endian u32 at `qh` is set,
/// else 0.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn high_bits(qh: *const u8) -> [int8x16_t; 2] {
    let bytes = vreinterpretq_u8_u32(vdupq_n_u32((qh as *const u32).read_unaligned()));
    // Byte i of the result gets byte i / 8 of the word (0..16: bytes 0, 1; 16..32: bytes 2, 3) and tests bit i % 8.
    const LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bit = vld1q_u8(BIT.as_ptr());
    let sixteen = vdupq_n_u8(0x10);
    let lo = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(LO.as_ptr())), bit), sixteen);
    let hi = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(HI.as_ptr())), bit), sixteen);
    [vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)]
}

/// Q5 values: `nibble | high bit << 4`, minus `off`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn five_bits(qh: *const u8, qs: *const u8, off: i8) -> [int8x16_t; 2] {
    let [lo, hi] = nibbles(qs, 0);
    let [hlo, hhi] = high_bits(qh);
    [vsubq_s8(vorrq_s8(lo, hlo), vdupq_n_s8(off)), vsubq_s8(vorrq_s8(hi, hhi), vdupq_n_s8(off))]
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;
struct Q8_1;

/// `d`, then 16 bytes of nibbles; values `q - 8`.
impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        nibbles(blk.add(2), 8)
    }
}

/// `d`, `m`, then 16 bytes of nibbles; values `q`.
impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        nibbles(blk.add(4), 0)
    }
}

/// `d`, `qh` (4 bytes), 16 bytes of nibbles; values `q - 16`.
impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        five_bits(blk.add(2), blk.add(6), 16)
    }
}

/// `d`, `m`, `qh` (4 bytes), 16 bytes of nibbles; values `q`.
impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        five_bits(blk.add(4), blk.add(8), 0)
    }
}

/// `d`, then 32 signed bytes.
impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        [vld1q_s8(blk.add(2) as *const i8), vld1q_s8(blk.add(18) as *const i8)]
    }
}

/// Q8_1 weights: as Q8_0 (`d`, the unused `s`, then 32 signed bytes).
impl Legacy for Q8_1 {
    const BYTES: usize = 36;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 2] {
        [vld1q_s8(blk.add(4) as *const i8), vld1q_s8(blk.add(20) as *const i8)]
    }
}

/// The NEON kernel of a legacy `dtype`, if there is one.
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::Q4_0 => entry::<Q4_0>,
        DType::Q4_1 => entry::<Q4_1>,
        DType::Q5_0 => entry::<Q5_0>,
        DType::Q5_1 => entry::<Q5_1>,
        DType::Q8_0 => entry::<Q8_0>,
        DType::Q8_1 => entry::<Q8_1>,
        _ => return None,
    })
}

fn entry<T: Legacy>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(act.block == 32 && r0 + rt <= act.rows, "legacy tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "legacy tile: weight rows");
    assert!(act.d_t.len() == act.rows * act.nb && act.s_t.len() == act.rows * act.nb, "legacy tile: ActQ tables");
    // SAFETY: this kernel is only picked for `Isa::Neon`, which `matmul` checks against the CPU; the asserts above
    // bound every pointer the kernel forms.
    unsafe { by_rows!(rt, tile::<T>(cols, act, r0)) }
}

#[target_feature(enable = "neon")]
unsafe fn tile<T: Legacy, const C: usize, const RT: usize>(cols: &[&[u8]; 8], act: &ActQ, r0: usize) -> [f32; 8] {
    let (k, rows) = (act.k, act.rows);
    // `[RT]` rows of `[k]` quantized activations.
    let xq: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k));
    // Lanes 0..4 and 4..8.
    let mut acc = [vdupq_n_f32(0.0); 2];
    for b in 0..act.nb {
        // `[C · RT]` i32x4 partial sums, lane `c · RT + r`.
        let mut p = [vdupq_n_s32(0); 8];
        for c in 0..C {
            let [w0, w1] = T::values(cols[c].as_ptr().add(b * T::BYTES));
            for r in 0..RT {
                let x = xq[r].add(32 * b);
                p[c * RT + r] = dot_acc(dot16_i8(w0, vld1q_s8(x)), w1, vld1q_s8(x.add(16)));
            }
        }
        let at = b * rows + r0;
        let dx = pattern_f32::<RT>(act.d_t.as_ptr().add(at));
        acc = update(acc, mul(f16_lanes::<C, RT>(cols, b * T::BYTES), dx), reduce8(&p));
        if T::HAS_MIN {
            let sx = pattern_i32::<RT>(act.s_t.as_ptr().add(at));
            acc = update(acc, mul(f16_lanes::<C, RT>(cols, b * T::BYTES + 2), dx), sx);
        }
    }
    lanes(acc)
}
