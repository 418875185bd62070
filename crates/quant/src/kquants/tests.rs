//! K-quant tests: a second decoder written from GGML's C reference loops (`dequantize_row_q*_K`), which walk
//! the raw bytes and emit elements in order, compared bit for bit with the block methods; plus hand values.

// The reference decoders index like the C loops they follow, on purpose.
#![allow(clippy::needless_range_loop)]

use super::*;
use crate::dequantize_to_vec;

/// Reads the f16 at byte `at` with the `half` crate (not our NumPy-compatible conversion).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// GGML's `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn ref_q2k(b: &[u8]) -> Vec<f32> {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut y = Vec::with_capacity(QK_K);
    let mut is = 0;
    for n in 0..2 {
        let q = &qs[32 * n..];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xf) as f32, dmin * (sc >> 4) as f32);
                for l in 16 * half..16 * half + 16 {
                    y.push(dl * ((q[l] >> shift) & 3) as f32 - ml);
                }
            }
        }
    }
    y
}

fn ref_q3k(b: &[u8]) -> Vec<f32> {
    let (hm, qs) = (&b[0..32], &b[32..96]);
    let d_all = f16_at(b, 108);
    // GGML's unpacking through four u32 words and the masks 0x03030303 / 0x0f0f0f0f.
    let w = |i: usize| u32::from_le_bytes(b[96 + 4 * i..100 + 4 * i].try_into().unwrap());
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let aux = [
        (a0 & k2) | ((tmp & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let scales: Vec<i8> = aux.iter().flat_map(|a| a.to_le_bytes()).map(|x| x as i8).collect();
    let mut y = Vec::with_capacity(QK_K);
    let (mut is, mut m) = (0, 1u8);
    for n in 0..2 {
        let q = &qs[32 * n..];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let v = ((q[l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                    y.push(dl * v as f32);
                }
            }
            m = m.wrapping_shl(1);
        }
    }
    y
}

/// Q4_K when `qh` is `None`, Q5_K otherwise.
fn ref_q45k(b: &[u8], five_bits: bool) -> Vec<f32> {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    let (qh, qs) = if five_bits { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
    let mut y = Vec::with_capacity(QK_K);
    let (mut u1, mut u2) = (1u8, 2u8);
    for (c, ql) in qs.chunks(32).enumerate() {
        let (sc, m) = scale_min_k4(2 * c, scales);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        let (sc, m) = scale_min_k4(2 * c + 1, scales);
        let (d2, m2) = (d * sc as f32, dmin * m as f32);
        let hi = |l: usize, u: u8| if five_bits && qh[l] & u != 0 { 16 } else { 0 };
        for l in 0..32 {
            y.push(d1 * ((ql[l] & 0xf) + hi(l, u1)) as f32 - m1);
        }
        for l in 0..32 {
            y.push(d2 * ((ql[l] >> 4) + hi(l, u2)) as f32 - m2);
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
    y
}

fn ref_q6k(b: &[u8]) -> Vec<f32> {
    let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
    let mut y = vec![0f32; QK_K];
    for n in 0..2 {
        let (ql, qh, sc, y) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..], &mut y[128 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
    y
}

fn ref_q8k(b: &[u8]) -> Vec<f32> {
    let d = f32::from_le_bytes(b[0..4].try_into().unwrap());
    b[4..260].iter().map(|&q| d * (q as i8) as f32).collect()
}

/// Byte offsets of the f16 fields of each type (the f32 scale of Q8_K at 0).
fn f16_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        _ => &[],
    }
}

#[test]
fn matches_reference_decoder() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for dtype in [DType::Q2K, DType::Q3K, DType::Q4K, DType::Q5K, DType::Q6K, DType::Q8K] {
        for _ in 0..100 {
            let mut b = vec![0u8; dtype.block_bytes()];
            rng.fill(&mut b[..]);
            for &at in f16_fields(dtype) {
                b[at + 1] &= 0xbf; // finite f16 (the reference uses `half`, which differs on NaN payloads)
            }
            if dtype == DType::Q8K {
                b[3] &= 0xbf; // finite f32 scale
            }
            let expect = match dtype {
                DType::Q2K => ref_q2k(&b),
                DType::Q3K => ref_q3k(&b),
                DType::Q4K => ref_q45k(&b, false),
                DType::Q5K => ref_q45k(&b, true),
                DType::Q6K => ref_q6k(&b),
                DType::Q8K => ref_q8k(&b),
                _ => unreachable!(),
            };
            let fast = dequantize_to_vec(dtype, &b, QK_K).unwrap();
            for (i, (x, r)) in fast.iter().zip(&expect).enumerate() {
                assert_eq!(x.to_bits(), r.to_bits(), "{dtype} element {i}, seed {seed}, block {b:02x?}");
            }
        }
    }
}

#[test]
fn scale_unpacking_matches_ggml() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..1000 {
        let packed: [u8; 12] = rng.gen();
        let (sc, mn) = q4k_scale_min(&packed);
        for j in 0..8 {
            assert_eq!((sc[j], mn[j]), scale_min_k4(j, &packed));
        }
    }
}

#[test]
fn q4k_hand_values() {
    // Scale j = j + 1, min j = 2 j (all 6-bit, so set through the packed layout by hand).
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = (j as u8 + 1) | (((j as u8 + 5) >> 4) << 6);
        scales[j + 4] = (2 * j as u8) | (((2 * (j as u8 + 4)) >> 4) << 6);
        scales[j + 8] = ((j as u8 + 5) & 0xf) | (((2 * (j as u8 + 4)) & 0xf) << 4);
    }
    // qs: element 64 c + l gets l % 16, element 64 c + 32 + l gets 15 - l % 16.
    let qs = std::array::from_fn(|i| (i % 16) as u8 | ((15 - (i % 16) as u8) << 4));
    let block = BlockQ4K { d: f16::from_f32(0.5), dmin: f16::from_f32(0.25), scales, qs };
    let mut out = [0f32; QK_K];
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        let j = i / 32;
        let q = if j % 2 == 0 { i % 16 } else { 15 - i % 16 };
        assert_eq!(x, 0.5 * (j + 1) as f32 * q as f32 - 0.25 * (2 * j) as f32, "element {i}");
    }
}

#[test]
fn q6k_hand_values() {
    // All low nibbles 5, high bits 2 (q = 5 | 32 = 37, so q - 32 = 5); scales j - 8.
    let block = BlockQ6K {
        ql: [0x55; 128],
        qh: [0xaa; 64],
        scales: std::array::from_fn(|j| j as i8 - 8),
        d: f16::from_f32(2.0),
    };
    let mut out = [0f32; QK_K];
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, 2.0 * ((i / 16) as f32 - 8.0) * 5.0, "element {i}");
    }
}

#[test]
fn q3k_and_q2k_hand_values() {
    // Q3_K: every scale byte pattern giving scale 33 (= +1 after the bias), d = 1.
    // low nibbles 1 (bytes 0..8: 0x11), high bits 2 (bytes 8..12: 0b10101010).
    let block = BlockQ3K {
        hmask: [0xff; 32],
        qs: [0b11_10_01_00; 64],
        scales: [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xaa, 0xaa, 0xaa, 0xaa],
        d: f16::from_f32(1.0),
    };
    assert_eq!(q3k_scales(&block.scales), [1; 16]);
    let mut out = [0f32; QK_K];
    block.dequantize(&mut out);
    // All high bits set: q = low 2 bits, which is s for element 128 h + 32 s + l.
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, ((i % 128) / 32) as f32, "element {i}");
    }
    let block = BlockQ3K { hmask: [0; 32], ..block };
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, ((i % 128) / 32) as f32 - 4.0, "element {i}");
    }

    // Q2_K: scale 3, min 1 everywhere; d = 1, dmin = 0.5.
    let block =
        BlockQ2K { scales: [0x13; 16], qs: [0b11_10_01_00; 64], d: f16::from_f32(1.0), dmin: f16::from_f32(0.5) };
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, 3.0 * ((i % 128) / 32) as f32 - 0.5, "element {i}");
    }
}

#[test]
fn q5k_and_q8k_hand_values() {
    let mut scales = [0u8; 12];
    scales[..4].fill(1); // scales 0..4 = 1, mins 0..4 = 0
    scales[8..].fill(0x01); // scales 4..8 = 1, mins 4..8 = 0
    let block = BlockQ5K {
        d: f16::from_f32(1.0),
        dmin: f16::from_f32(7.0),
        scales,
        qh: [0b1010_1010; 32], // odd sub-blocks get the 5th bit
        qs: [0x00; 128],
    };
    let mut out = [0f32; QK_K];
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, if (i / 32) % 2 == 1 { 16.0 } else { 0.0 }, "element {i}");
    }
    let block = BlockQ8K { d: 0.5, qs: std::array::from_fn(|i| (i as i32 - 128) as i8), bsums: [0; 16] };
    block.dequantize(&mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, (i as f32 - 128.0) * 0.5);
    }
}
