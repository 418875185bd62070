//! Checkpoint mode with NEON for the 256-element K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K).
//!
//! Per super-block and lane, the exact integers of the reference: the block's 256 values are unpacked to signed
//! bytes in element order, 16 per register, with the type's offset already taken off (Q3_K `−4`, Q6_K `−32`), so
//! that register `j` is exactly 16-element group `j`; `S = Σ_j sc_j · Σ_{i∈j} q_i·qx_i` takes one exact 16-element
//! dot per group ([`dot16_i8`]) and one i32 multiply-accumulate by the group's scale (`mla`; the 32-element
//! sub-blocks of Q4_K/Q5_K give both their groups the same scale). The mins term of Q2_K/Q4_K/Q5_K is
//! `M = Σ_g min_g · bsum[g]` over the 16 groups (for Q4_K/Q5_K `min_g = m_{g/2}`, which is the reference's
//! `Σ_j m_j·(bsum[2j] + bsum[2j+1])`) by `smull`/`smlal` on i16. Every integer stays far below 2^31 (|S| ≤
//! 256·31·127·63 for Q5_K). The eight lanes' vectors are reduced at once ([`reduce8`]), then every lane runs the
//! reference's float update: `acc = fma(dw * dx, S, acc)` and, with mins, `acc = fma(-(dmin * dx), M, acc)`.

use std::arch::aarch64::*;

use tf_core::DType;
use tf_quant::{q3k_scales, q4k_scale_min};

use super::act::ActQ;
use super::neon::{by_rows, dot16_i8, dot_acc, f16_lanes, f32_lanes, lanes, mul, pattern_f32, reduce8, update};
use super::QuantKernel;

/// The NEON kernel of a K-quant `dtype`, if there is one.
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::Q2K => entry::<Q2K>,
        DType::Q3K => entry::<Q3K>,
        DType::Q4K => entry::<Q4K>,
        DType::Q5K => entry::<Q5K>,
        DType::Q6K => entry::<Q6K>,
        DType::Q8K => entry::<Q8K>,
        _ => return None,
    })
}

/// A K-quant layout.
trait KQuant {
    const BYTES: usize;
    /// Byte offset of the f16 `d` (an f32 when `D_F32`).
    const D_AT: usize;
    const D_F32: bool = false;
    /// Byte offset of the f16 `dmin`, for the types with mins.
    const DMIN_AT: Option<usize> = None;
    /// Every group's scale is 1 (Q8_K): the dots are summed without `mla`.
    const UNSCALED: bool = false;
    /// The 256 values of the block at `blk` as signed bytes, register `j` = elements `16 j .. 16 j + 16`, offset
    /// subtracted.
    ///
    /// # Safety
    /// NEON; `blk` points at a whole block.
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16];
    /// The scale of each 16-element group.
    ///
    /// # Safety
    /// `blk` points at a whole block.
    unsafe fn scales(_blk: *const u8) -> [i32; 16] {
        [1; 16]
    }
    /// The min of each 16-element group (types with `DMIN_AT`).
    ///
    /// # Safety
    /// `blk` points at a whole block.
    unsafe fn mins(_blk: *const u8) -> [i16; 16] {
        [0; 16]
    }
}

/// `(v >> shift) & mask` per byte.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn field(v: uint8x16_t, shift: usize, mask: u8) -> uint8x16_t {
    // A negative left shift is a right shift.
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(shift as i8))), vdupq_n_u8(mask))
}

/// The 2-bit field of group `j` in the Q2_K / Q3_K `qs` layout (element `128 h + 32 s + l` is
/// `(qs[32 h + l] >> 2 s) & 3`): `h = j / 8`, `s = (j % 8) / 2`, `l` from `16 (j % 2)`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn crumbs(qs: *const u8, j: usize) -> uint8x16_t {
    field(vld1q_u8(qs.add(32 * (j / 8) + 16 * (j % 2))), 2 * ((j % 8) / 2), 3)
}

/// The 4-bit field of group `j` in the Q4_K / Q5_K `qs` layout (element `64 c + 32 n + l` is
/// `(qs[32 c + l] >> 4 n) & 15`): `c = j / 4`, `n = (j % 4) / 2`, `l` from `16 (j % 2)`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles(qs: *const u8, j: usize) -> uint8x16_t {
    field(vld1q_u8(qs.add(32 * (j / 4) + 16 * (j % 2))), 4 * ((j % 4) / 2), 15)
}

/// `(bits[e % 32] >> (e / 32)) & 1` for the elements `e` of group `j` (Q3_K's `hmask`, Q5_K's `qh`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn high_bit(bits: *const u8, j: usize) -> uint8x16_t {
    field(vld1q_u8(bits.add(16 * (j % 2))), j / 2, 1)
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;
struct Q8K;

/// `scales[16]` (scale low nibble, min high nibble), `qs[64]`, `d`, `dmin`.
impl KQuant for Q2K {
    const BYTES: usize = 84;
    const D_AT: usize = 80;
    const DMIN_AT: Option<usize> = Some(82);
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| vreinterpretq_s8_u8(crumbs(blk.add(16), j)))
    }
    unsafe fn scales(blk: *const u8) -> [i32; 16] {
        std::array::from_fn(|j| (*blk.add(j) & 15) as i32)
    }
    unsafe fn mins(blk: *const u8) -> [i16; 16] {
        std::array::from_fn(|j| (*blk.add(j) >> 4) as i16)
    }
}

/// `hmask[32]`, `qs[64]`, `scales[12]`, `d`; values `crumb + 4·hbit − 4`.
impl KQuant for Q3K {
    const BYTES: usize = 110;
    const D_AT: usize = 108;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| {
            let q = vorrq_u8(crumbs(blk.add(32), j), vshlq_n_u8::<2>(high_bit(blk, j)));
            vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(4))
        })
    }
    unsafe fn scales(blk: *const u8) -> [i32; 16] {
        q3k_scales(&*(blk.add(96) as *const [u8; 12])).map(|s| s as i32)
    }
}

/// `d`, `dmin`, `scales[12]`, `qs[128]`.
impl KQuant for Q4K {
    const BYTES: usize = 144;
    const D_AT: usize = 0;
    const DMIN_AT: Option<usize> = Some(2);
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| vreinterpretq_s8_u8(nibbles(blk.add(16), j)))
    }
    unsafe fn scales(blk: *const u8) -> [i32; 16] {
        let (sc, _) = q4k_scale_min(&*(blk.add(4) as *const [u8; 12]));
        std::array::from_fn(|j| sc[j / 2] as i32)
    }
    unsafe fn mins(blk: *const u8) -> [i16; 16] {
        let (_, mn) = q4k_scale_min(&*(blk.add(4) as *const [u8; 12]));
        std::array::from_fn(|j| mn[j / 2] as i16)
    }
}

/// `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`; values `nibble | fifth bit << 4`.
impl KQuant for Q5K {
    const BYTES: usize = 176;
    const D_AT: usize = 0;
    const DMIN_AT: Option<usize> = Some(2);
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| {
            vreinterpretq_s8_u8(vorrq_u8(nibbles(blk.add(48), j), vshlq_n_u8::<4>(high_bit(blk.add(16), j))))
        })
    }
    unsafe fn scales(blk: *const u8) -> [i32; 16] {
        Q4K::scales(blk)
    }
    unsafe fn mins(blk: *const u8) -> [i16; 16] {
        Q4K::mins(blk)
    }
}

/// `ql[128]`, `qh[64]`, `scales[16]` (i8), `d`; values `(low | high << 4) − 32`.
impl KQuant for Q6K {
    const BYTES: usize = 210;
    const D_AT: usize = 208;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| {
            // Element 128 h + 32 t + l: low nibble of ql[64 h + 32 (t % 2) + l] at shift 4 (t / 2), high bits
            // (qh[32 h + l] >> 2 t) & 3.
            let (h, t, l0) = (j / 8, (j % 8) / 2, 16 * (j % 2));
            let low = field(vld1q_u8(blk.add(64 * h + 32 * (t % 2) + l0)), 4 * (t / 2), 15);
            let high = field(vld1q_u8(blk.add(128 + 32 * h + l0)), 2 * t, 3);
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8::<4>(high))), vdupq_n_s8(32))
        })
    }
    unsafe fn scales(blk: *const u8) -> [i32; 16] {
        std::array::from_fn(|j| *(blk.add(192 + j) as *const i8) as i32)
    }
}

/// `d` (f32), `qs[256]` (i8), `bsums[16]` (unused).
impl KQuant for Q8K {
    const BYTES: usize = 292;
    const D_AT: usize = 0;
    const D_F32: bool = true;
    const UNSCALED: bool = true;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn values(blk: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|j| vld1q_s8(blk.add(4 + 16 * j) as *const i8))
    }
}

fn entry<T: KQuant>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(act.block == 256 && r0 + rt <= act.rows, "K-quant tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "K-quant tile: weight rows");
    assert!(act.d_t.len() == act.rows * act.nb && act.sums.len() == act.rows * act.nb * 16, "K-quant tile: ActQ");
    // SAFETY: this kernel is only picked for `Isa::Neon`, which `matmul` checks against the CPU; the asserts above
    // bound every pointer the kernel forms.
    unsafe { by_rows!(rt, tile::<T>(cols, act, r0)) }
}

#[target_feature(enable = "neon")]
unsafe fn tile<T: KQuant, const C: usize, const RT: usize>(cols: &[&[u8]; 8], act: &ActQ, r0: usize) -> [f32; 8] {
    let (k, rows, nb) = (act.k, act.rows, act.nb);
    // Lanes 0..4 and 4..8.
    let mut acc = [vdupq_n_f32(0.0); 2];
    for b in 0..nb {
        // `[RT]` activation blocks of `[256]` values and their `[16]` bsums.
        let x: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b));
        let bs: [*const i16; RT] = std::array::from_fn(|r| act.sums.as_ptr().add(((r0 + r) * nb + b) * 16));
        // `[C · RT]` i32x4 partials of `S` and of `M`, lane `c · RT + r`.
        let mut s = [vdupq_n_s32(0); 8];
        let mut m = [vdupq_n_s32(0); 8];
        for c in 0..C {
            let blk = cols[c].as_ptr().add(b * T::BYTES);
            // `[16]` registers of 16 values, `[16]` group scales.
            let v = T::values(blk);
            let sc = T::scales(blk);
            for r in 0..RT {
                let mut sr = vdupq_n_s32(0);
                for j in 0..16 {
                    let xv = vld1q_s8(x[r].add(16 * j));
                    sr = if T::UNSCALED { dot_acc(sr, v[j], xv) } else { vmlaq_n_s32(sr, dot16_i8(v[j], xv), sc[j]) };
                }
                s[c * RT + r] = sr;
            }
            if T::DMIN_AT.is_some() {
                // `[16]` group mins as two i16x8.
                let mn = T::mins(blk);
                let (m0, m1) = (vld1q_s16(mn.as_ptr()), vld1q_s16(mn.as_ptr().add(8)));
                for r in 0..RT {
                    let (b0, b1) = (vld1q_s16(bs[r]), vld1q_s16(bs[r].add(8)));
                    let t = vmlal_high_s16(vmull_s16(vget_low_s16(b0), vget_low_s16(m0)), b0, m0);
                    m[c * RT + r] = vmlal_high_s16(vmlal_s16(t, vget_low_s16(b1), vget_low_s16(m1)), b1, m1);
                }
            }
        }
        let at = b * T::BYTES + T::D_AT;
        let dw = if T::D_F32 { f32_lanes::<C, RT>(cols, at) } else { f16_lanes::<C, RT>(cols, at) };
        let dx = pattern_f32::<RT>(act.d_t.as_ptr().add(b * rows + r0));
        acc = update(acc, mul(dw, dx), reduce8(&s));
        if let Some(dmin_at) = T::DMIN_AT {
            // `-(dmin * dx)`: the rounded product, negated.
            let p = mul(f16_lanes::<C, RT>(cols, b * T::BYTES + dmin_at), dx);
            acc = update(acc, [vnegq_f32(p[0]), vnegq_f32(p[1])], reduce8(&m));
        }
    }
    lanes(acc)
}
