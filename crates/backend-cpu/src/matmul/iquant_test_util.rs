//! Test helpers of the AVX-512 grid i-quant kernels (`avx512_iquant`, `avx512_iquant2`, `avx512_iquant_rows`):
//! seeded random numbers, weight blocks (random, or at the bounds of the integer sums), activations, and
//! comparisons of tile kernels, chunk kernels and the whole matmul with the reference, bit for bit.

use rand::{Rng, SeedableRng};
use tf_core::{DType, Precision, Tensor, TensorInfo};
use tf_quant::reference::matmul::matmul_ref;
use tf_quant::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

use super::act::ActQ;
use super::{matmul, ChunkKernel, CpuWeight, Out, QuantKernel};
use crate::isa::Isa;
use crate::Pool;

/// A random generator seeded from `TF_SEED` (else a random seed), and the seed; the seed is printed so that a
/// failure can be rerun.
pub(super) fn seeded() -> (u64, rand::rngs::StdRng) {
    let seed: u64 = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("TF_SEED={seed}");
    (seed, rand::rngs::StdRng::seed_from_u64(seed))
}

/// `[rows * k]` activations: random, all 1 (`extreme` 1, 2), or rows alternately all 1 and all −1 (3).
pub(super) fn activations(rng: &mut impl Rng, rows: usize, k: usize, extreme: usize) -> Vec<f32> {
    (0..rows * k)
        .map(|i| match extreme {
            0 => rng.gen_range(-1.0f32..1.0),
            3 if (i / k) % 2 == 1 => -1.0,
            _ => 1.0,
        })
        .collect()
}

/// The sum of a grid entry's bytes taken as i8.
fn entry_sum(g: u64) -> i32 {
    g.to_le_bytes().iter().map(|&b| b as i8 as i32).sum()
}

/// The index of a grid entry with the largest sum (the last of equal sums).
fn largest(grid: &[u64]) -> usize {
    (0..grid.len()).max_by_key(|&i| entry_sum(grid[i])).unwrap()
}

/// `[count]` blocks of the grid i-quant `dtype` (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S or IQ1_S): random bytes with
/// `d` in `1.0..2.0` (f16), or (`extreme` 1, 2, 3) every group the grid entry of the largest values, every scale
/// the largest, all signs positive (1) or negative (2, 3); IQ1_S: all +1 with delta +1 (1) or the entry of the
/// smallest values, all −1, with delta −1 (2, 3), every value ±9.
pub(super) fn blocks(rng: &mut impl Rng, dtype: DType, count: usize, extreme: usize) -> Vec<u8> {
    let bytes = dtype.block_bytes();
    let mut w = vec![0u8; count * bytes];
    rng.fill(&mut w[..]);
    let u32s = |g: &[u32]| -> Vec<u64> { g.iter().map(|&v| v as u64).collect() };
    // The grid index every group takes in the extreme blocks.
    let max = match (dtype, extreme) {
        (_, 0) => 0,
        (DType::IQ3S, _) => largest(&u32s(&IQ3S_GRID)),
        (DType::IQ3XXS, _) => largest(&u32s(&IQ3XXS_GRID)),
        (DType::IQ2XXS, _) => largest(&IQ2XXS_GRID),
        (DType::IQ2XS, _) => largest(&IQ2XS_GRID),
        (DType::IQ2S, _) => largest(&IQ2S_GRID),
        (DType::IQ1S, 1) => largest(&IQ1S_GRID),
        // The first entry of the smallest sum: all −1.
        (DType::IQ1S, _) => (0..2048).min_by_key(|&i| entry_sum(IQ1S_GRID[i])).unwrap(),
        _ => unreachable!("{dtype} is not a grid i-quant"),
    };
    for blk in w.chunks_exact_mut(bytes) {
        blk[..2].copy_from_slice(&(0x3c00u16 + rng.gen_range(0..0x400)).to_le_bytes());
        if extreme == 0 {
            continue;
        }
        let sign = if extreme == 1 { 0x00 } else { 0xff };
        // IQ3_XXS and IQ2_XXS: scale 15, sign fields all 0 or all 127 (`KSIGNS_IQ2XS[127]` = 0xff).
        let aux = 0xf000_0000u32 | if sign == 0 { 0 } else { 0x0fff_ffff };
        match dtype {
            DType::IQ3S => {
                blk[2..66].fill(max as u8);
                blk[66..74].fill(if max >= 256 { 0xff } else { 0 });
                blk[74..106].fill(sign);
                blk[106..110].fill(0xff);
            }
            DType::IQ3XXS => {
                for j in 0..8 {
                    blk[2 + 8 * j..10 + 8 * j].fill(max as u8);
                    blk[66 + 4 * j..70 + 4 * j].copy_from_slice(&aux.to_le_bytes());
                }
            }
            DType::IQ2XXS => {
                for j in 0..8 {
                    blk[2 + 8 * j..6 + 8 * j].fill(max as u8);
                    blk[6 + 8 * j..10 + 8 * j].copy_from_slice(&aux.to_le_bytes());
                }
            }
            DType::IQ2XS => {
                let q = max as u16 | if sign == 0 { 0 } else { 127 << 9 };
                for g in 0..32 {
                    blk[2 + 2 * g..4 + 2 * g].copy_from_slice(&q.to_le_bytes());
                }
                blk[66..74].fill(0xff);
            }
            DType::IQ2S => {
                blk[2..34].fill(max as u8);
                blk[34..66].fill(sign);
                blk[66..74].fill(((max >> 8) as u8) * 0b0101_0101);
                blk[74..82].fill(0xff);
            }
            _ => {
                blk[2..34].fill(max as u8);
                // The index's high bits for each of the 4 groups, scale 7, the delta's sign.
                let high = ((max >> 8) as u16) * 0b10_0100_1001;
                let h = high | (7 << 12) | if sign == 0 { 0 } else { 0x8000 };
                for j in 0..8 {
                    blk[34 + 2 * j..36 + 2 * j].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    w
}

/// The reference checkpoint output `[rows][out]` of `x [rows][k]` against `w` (`out` rows of `dtype`).
pub(super) fn reference(x: &[f32], rows: usize, dtype: DType, w: &[u8], out: usize, k: usize) -> Vec<f32> {
    matmul_ref(Precision::Checkpoint, x, rows, dtype, w, out, k, None)
}

/// `w` (`out` rows of `dtype`, `k` columns) as a weight.
pub(super) fn weight(dtype: DType, w: &[u8], out: usize, k: usize) -> CpuWeight {
    let info = TensorInfo { name: "w".into(), dtype, shape: vec![out as u64, k as u64] };
    CpuWeight::from_bytes(&info, w).unwrap()
}

/// The whole checkpoint matmul on AVX-512 of `x [rows][k]` against `w` equals `want` bit for bit (`what` names the
/// case in a failure).
pub(super) fn assert_matmul(dtype: DType, w: &[u8], out: usize, x: &[f32], rows: usize, want: &[f32], what: &str) {
    let k = x.len() / rows;
    let wt = weight(dtype, w, out, k);
    let got = matmul(&Pool::new(2), Isa::Avx512, Precision::Checkpoint, &Tensor::host(rows, k, x.to_vec()), &wt, None);
    assert_eq!(got.host.len(), want.len());
    for (i, (g, e)) in got.host.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), e.to_bits(), "{dtype} {what} rows {rows} element {i}");
    }
}

/// Every tile shape (1, 2, 4 and 8 activation rows, as many whole row groups as `act` holds) of the tile kernel
/// `kernel` over the `out` weight rows `w` equals `want` (`[rows][out]`) bit for bit.
pub(super) fn assert_tiles(
    kernel: QuantKernel,
    dtype: DType,
    w: &[u8],
    out: usize,
    act: &ActQ,
    want: &[f32],
    what: &str,
) {
    let (rows, rb) = (act.rows, w.len() / out);
    let row = |c: usize| &w[c * rb..(c + 1) * rb];
    for rt in [1, 2, 4, 8] {
        for r0 in (0..rows - rows % rt).step_by(rt) {
            for s0 in (0..out).step_by(8 / rt) {
                let cols: [&[u8]; 8] = std::array::from_fn(|i| row((s0 + i).min(out - 1)));
                let got = kernel(&cols, act, r0, rt);
                for ci in 0..(8 / rt).min(out - s0) {
                    for ri in 0..rt {
                        let want = want[(r0 + ri) * out + s0 + ci];
                        assert_eq!(
                            got[ci * rt + ri].to_bits(),
                            want.to_bits(),
                            "{dtype} {what} rt={rt} row {} col {}",
                            r0 + ri,
                            s0 + ci
                        );
                    }
                }
            }
        }
    }
}

/// The chunk kernel `kernel` over output columns `c0..c1` of the `out` weight rows `w` equals `want`
/// (`[rows][out]`) bit for bit there and leaves the other columns alone.
#[allow(clippy::too_many_arguments)]
pub(super) fn assert_chunk(
    kernel: ChunkKernel,
    dtype: DType,
    w: &[u8],
    out: usize,
    act: &ActQ,
    (c0, c1): (usize, usize),
    want: &[f32],
    what: &str,
) {
    let wt = weight(dtype, w, out, act.k);
    let mut y = vec![f32::NAN; act.rows * out];
    let o = Out { ptr: crate::pool::SendPtr(y.as_mut_ptr()), rows: act.rows, stride: out };
    kernel(&wt, act, c0, c1, &o);
    for r in 0..act.rows {
        for c in 0..out {
            let (g, e) = (y[r * out + c], want[r * out + c]);
            if (c0..c1).contains(&c) {
                assert_eq!(g.to_bits(), e.to_bits(), "{dtype} {what} rows {} ({r}, {c}) of {c0}..{c1}", act.rows);
            } else {
                assert!(g.is_nan(), "{dtype} {what}: column {c} outside {c0}..{c1} written");
            }
        }
    }
}

/// Row-exactness: each of `rows` activation rows against `out` random weight rows of `nb` blocks gives the
/// reference's bits whether the call has 1, 2, …, `rows` rows.
pub(super) fn assert_rows_exact(rng: &mut impl Rng, seed: u64, dtype: DType, nb: usize, out: usize, rows: usize) {
    let k = 256 * nb;
    let w = blocks(rng, dtype, out * nb, 0);
    let x = activations(rng, rows, k, 0);
    let want = reference(&x, rows, dtype, &w, out, k);
    let wt = weight(dtype, &w, out, k);
    for r in 1..=rows {
        let xt = Tensor::host(r, k, x[..r * k].to_vec());
        let got = matmul(&Pool::new(2), Isa::Avx512, Precision::Checkpoint, &xt, &wt, None);
        for (i, (g, e)) in got.host.iter().zip(&want[..r * out]).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{dtype} {r} rows: element {i} (TF_SEED={seed})");
        }
    }
}
