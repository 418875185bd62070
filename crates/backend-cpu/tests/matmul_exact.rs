//! The CPU matmul against the scalar reference (`tf_quant::reference::matmul::matmul_ref`), for every weight
//! type, both precision modes and every ISA this CPU has:
//! 1. fast kernels == reference, bit for bit;
//! 2. row-exactness: a row alone == the same row at a random index among R-1 random rows;
//! 3. 1 thread == 2 threads == 3 threads;
//! 4. sanity: within rounding (full) or activation-quantization (checkpoint) error bounds of an f64 dot.
//!
//! Data are random with a fresh seed per run (printed; set `TF_SEED` to replay).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::isa::Isa;
use tf_backend_cpu::matmul::{matmul, matmul_many, CpuWeight};
use tf_backend_cpu::Pool;
use tf_core::{DType, Precision, Tensor, TensorInfo};
use tf_quant::reference::matmul::{checkpoint_block, matmul_ref, quantize_row};

const TYPES: [DType; 24] = [
    DType::F32,
    DType::F16,
    DType::BF16,
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
];

const PRECISIONS: [Precision; 2] = [Precision::Checkpoint, Precision::Full];

/// The run's seed: `TF_SEED` or the clock. Printed so that a failure can be replayed.
fn seed() -> u64 {
    let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("TF_SEED={seed}");
    seed
}

fn pool(threads: usize) -> Pool {
    Pool::new(threads)
}

/// An f16 bit pattern of a finite value of magnitude 2^(e-15) · (1 + m/1024), `e` in `lo..hi`, random sign.
fn f16_bits(rng: &mut StdRng, lo: u16, hi: u16) -> u16 {
    (rng.gen_range(lo..hi) << 10) | rng.gen_range(0..1024) | (rng.gen::<u16>() & 0x8000)
}

/// Random raw bytes of an `[out, inn]` weight of `dtype`: random bytes per block, with finite, modest scales.
fn random_bytes(rng: &mut StdRng, dtype: DType, out: usize, inn: usize) -> Vec<u8> {
    let numel = out * inn;
    match dtype {
        DType::F32 => (0..numel).flat_map(|_| (rng.gen_range(-1.0f32..1.0) * 0.1).to_le_bytes()).collect(),
        DType::F16 => (0..numel).flat_map(|_| f16_bits(rng, 8, 16).to_le_bytes()).collect(),
        DType::BF16 => (0..numel)
            .flat_map(|_| ((rng.gen_range(118u16..128) << 7) | (rng.gen::<u16>() & 0x807f)).to_le_bytes())
            .collect(),
        _ => {
            let bb = dtype.block_bytes();
            let mut w = vec![0u8; numel / dtype.block_size() * bb];
            rng.fill(&mut w[..]);
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
                    blk[at..at + 2].copy_from_slice(&f16_bits(rng, 4, 12).to_le_bytes());
                }
                if dtype == DType::Q8K {
                    blk[0..4].copy_from_slice(&rng.gen_range(-0.01f32..0.01).to_le_bytes());
                }
                // E8M0 scale byte: 2^-16..2^2 (halved as dequantization does).
                if dtype == DType::MXFP4 {
                    blk[0] = rng.gen_range(112..=130);
                }
            }
            w
        }
    }
}

/// A weight, the raw bytes it was built from (the reference reads those), and maybe a bias.
struct Case {
    dtype: DType,
    out: usize,
    inn: usize,
    w: CpuWeight,
    /// The same weight kept in its stored layout (no wide-layout copy): the tile kernels.
    stored: CpuWeight,
    bytes: Vec<u8>,
    bias: Option<Vec<f32>>,
}

impl Case {
    fn new(rng: &mut StdRng, dtype: DType, out: usize, inn: usize) -> Case {
        let bytes = random_bytes(rng, dtype, out, inn);
        Case::with_bytes(rng, dtype, out, inn, bytes)
    }

    /// A case of the given raw `[out, inn]` weight bytes (and maybe a random bias).
    fn with_bytes(rng: &mut StdRng, dtype: DType, out: usize, inn: usize, bytes: Vec<u8>) -> Case {
        let info = TensorInfo { name: format!("w.{dtype}"), dtype, shape: vec![out as u64, inn as u64] };
        let w = CpuWeight::from_bytes(&info, &bytes).unwrap();
        let stored = CpuWeight::from_bytes(&info, &bytes).unwrap().unpacked();
        let bias = rng.gen_bool(0.5).then(|| (0..out).map(|_| rng.gen_range(-1.0f32..1.0)).collect());
        Case { dtype, out, inn, w, stored, bytes, bias }
    }

    fn bias_weight(&self) -> Option<CpuWeight> {
        self.bias.as_ref().map(|b| CpuWeight::from_f32(&[self.out], b.clone()))
    }

    fn run(&self, pool: &Pool, isa: Isa, p: Precision, x: &Tensor) -> Vec<f32> {
        let y = matmul(pool, isa, p, x, &self.w, self.bias_weight().as_ref());
        assert_eq!((y.rows, y.cols), (x.rows, self.out));
        y.host
    }

    /// [`Case::run`], and on AVX-512 and AVX2 also with the weight in its stored layout: `(label, result)` per
    /// layout.
    fn runs(&self, pool: &Pool, isa: Isa, p: Precision, x: &Tensor) -> Vec<(&'static str, Vec<f32>)> {
        let mut v = vec![("", self.run(pool, isa, p, x))];
        if matches!(isa, Isa::Avx512 | Isa::Avx2) {
            let y = matmul(pool, isa, p, x, &self.stored, self.bias_weight().as_ref());
            v.push((" (stored layout)", y.host));
        }
        v
    }

    fn reference(&self, p: Precision, x: &Tensor) -> Vec<f32> {
        matmul_ref(p, &x.host, x.rows, self.dtype, &self.bytes, self.out, self.inn, self.bias.as_deref())
    }

    fn name(&self) -> String {
        format!("{} [{}, {}]{}", self.dtype, self.out, self.inn, if self.bias.is_some() { " +bias" } else { "" })
    }
}

/// Random activations: mostly N(0, 1)-ish, some rows scaled up or down, a few outliers; now and then a row of
/// zeros (block scale 0) or of subnormals (block scale whose inverse overflows: the clamp path).
fn random_x(rng: &mut StdRng, rows: usize, cols: usize) -> Tensor {
    let mut data = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let scale = match rng.gen_range(0..40) {
            0 => 0.0,
            1 => 1e-39,
            2 => 1e-37,
            k => [1.0f32, 0.01, 30.0][k % 3],
        };
        for _ in 0..cols {
            // A cheap bell shape: the product of a uniform and a random power of two.
            let v = rng.gen_range(-1.0f32..1.0) * f32::from_bits((rng.gen_range(124u32..129)) << 23) * scale;
            data.push(if rng.gen_ratio(1, 200) { v * 20.0 } else { v });
        }
    }
    Tensor::host(rows, cols, data)
}

/// Input sizes for `dtype`: random whole blocks plus the real hidden sizes (576, 896, 1536, 640) that are.
fn sizes(rng: &mut StdRng, dtype: DType) -> Vec<(usize, usize)> {
    let bs = dtype.block_size();
    let mut v = Vec::new();
    for _ in 0..3 {
        let inn = if bs == 1 { rng.gen_range(1..300) } else { bs * rng.gen_range(1..(1024 / bs).max(2) + 1) };
        v.push((rng.gen_range(1..150), inn));
    }
    for hidden in [576, 896, 1536, 640] {
        if hidden % bs == 0 {
            v.push((rng.gen_range(1..80), hidden));
        }
    }
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first differing element, for messages.
fn first_diff(a: &[f32], b: &[f32]) -> String {
    match a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        Some(i) => format!("element {i}: {} vs {}", a[i], b[i]),
        None => format!("lengths {} vs {}", a.len(), b.len()),
    }
}

#[test]
fn fast_kernels_equal_the_reference() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    for dtype in TYPES {
        for (out, inn) in sizes(&mut rng, dtype) {
            let case = Case::new(&mut rng, dtype, out, inn);
            let rows = rng.gen_range(1..12);
            let x = random_x(&mut rng, rows, inn);
            for p in PRECISIONS {
                let want = case.reference(p, &x);
                for isa in Isa::available() {
                    for (layout, got) in case.runs(&pool, isa, p, &x) {
                        assert!(
                            bits(&got) == bits(&want),
                            "{} {} {}{layout} rows={}: {} (TF_SEED={seed})",
                            case.name(),
                            p.name(),
                            isa.name(),
                            x.rows,
                            first_diff(&got, &want)
                        );
                    }
                }
            }
        }
    }
}

/// Checkpoint windows of `dtypes` for each of `row_counts`, over column counts that are not multiples of the kernels'
/// 8 or 16 lanes and `blocks` (a range of) input blocks of `block` elements: every ISA == the reference.
fn windows_equal_the_reference(dtypes: &[DType], row_counts: &[usize], block: usize, blocks: std::ops::Range<usize>) {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    for &dtype in dtypes {
        for &rows in row_counts {
            let out = [rng.gen_range(1..16), rng.gen_range(17..48), 16 * rng.gen_range(1..4) + rng.gen_range(1..16)]
                [rows % 3];
            let inn = block * rng.gen_range(blocks.clone());
            let case = Case::new(&mut rng, dtype, out, inn);
            let x = random_x(&mut rng, rows, inn);
            let want = case.reference(Precision::Checkpoint, &x);
            for isa in Isa::available() {
                for (layout, got) in case.runs(&pool, isa, Precision::Checkpoint, &x) {
                    assert!(
                        bits(&got) == bits(&want),
                        "{} {}{layout} rows={rows}: {} (TF_SEED={seed})",
                        case.name(),
                        isa.name(),
                        first_diff(&got, &want)
                    );
                }
            }
        }
    }
}

/// Every row count 1..=64 (every tile shape and mix of row groups; the AVX-512 and AVX2 wide Q4_1/Q5_0/Q8_0 kernels
/// with their groups of 4 rows, and the 8- and 16-lane tiles on the stored layout) for the 32-element types.
#[test]
fn legacy_windows_of_every_size_equal_the_reference() {
    let types = [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1];
    windows_equal_the_reference(&types, &(1..=64).collect::<Vec<_>>(), 32, 1..6);
}

/// The K-quants across the row counts where kernels change (row groups of 8/4/2/1 of the tiles; the AVX-512 and AVX2
/// wide Q4_K/Q6_K kernels with their groups of 4 rows).
#[test]
fn kquant_windows_of_every_size_equal_the_reference() {
    let rows: Vec<usize> = (1..=20).chain([31, 33, 47, 64]).collect();
    windows_equal_the_reference(&[DType::Q4K, DType::Q5K, DType::Q6K], &rows, 256, 1..4);
}

/// The i-quants: IQ4_NL and MXFP4 (32-element blocks, the 8- and 16-lane tiles) at every row count 1..=64,
/// IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ1_S and IQ2_S (256-element blocks) where the K-quant tiles change.
#[test]
fn iquant_windows_of_every_size_equal_the_reference() {
    windows_equal_the_reference(&[DType::IQ4NL, DType::MXFP4], &(1..=64).collect::<Vec<_>>(), 32, 1..6);
    let rows: Vec<usize> = (1..=20).chain([31, 33, 47, 64]).collect();
    windows_equal_the_reference(
        &[DType::IQ4XS, DType::IQ3S, DType::IQ3XXS, DType::IQ2XXS, DType::IQ2XS, DType::IQ1S, DType::IQ2S],
        &rows,
        256,
        1..4,
    );
}

/// MXFP4 with every E8M0 scale byte (0 and 1 subnormal, 255 = 2^127): activation block `b` has magnitude
/// about `2^(128 - c_b)` (within the f32 range) for a band `c_b ± 8` of the weight scale bytes of input block
/// `b`, so the products `dw * dx` are mostly near 1 and every scale byte counts; now and then a block is
/// 2^-60 smaller (products that underflow to subnormals or 0). Checkpoint mode on every ISA and layout, every
/// row count 1..=40, bit-equal to the reference; full mode too, with scale bytes up to 252 (from 253 the larger
/// codes dequantize to ±Inf, whose sums may be NaN).
#[test]
fn mxfp4_every_scale_byte_equals_the_reference() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    for rows in 1..=40 {
        let (out, nb) = (rng.gen_range(1..40), rng.gen_range(1..9));
        let inn = 32 * nb;
        // `[nb]` band centres; input block 0 spans the ends (0 and 255) at least once per three row counts.
        let c: Vec<i32> =
            (0..nb).map(|b| if b == 0 { [0, 255, 128][rows % 3] } else { rng.gen_range(0..=255) }).collect();
        // `[out, nb]` blocks of 17 bytes.
        let mut bytes = vec![0u8; out * nb * 17];
        rng.fill(&mut bytes[..]);
        for (i, blk) in bytes.chunks_exact_mut(17).enumerate() {
            blk[0] = (c[i % nb] + rng.gen_range(-8..=8)).clamp(0, 255) as u8;
        }
        // `[rows, inn]` activations, block `b` of each row scaled by 2^(128 - c_b) (or 2^-60 times that).
        let mut x = random_x(&mut rng, rows, inn);
        for (i, v) in x.host.iter_mut().enumerate() {
            let b = (i % inn) / 32;
            let shift = if (i / 32) % 5 == 3 { -60 } else { 0 };
            *v = (*v / 600.0).clamp(-1.0, 1.0) * 2f32.powi((128 - c[b] + shift).clamp(-120, 120));
        }
        let capped: Vec<u8> = bytes.chunks_exact(17).flat_map(|b| [&[b[0].min(252)], &b[1..]].concat()).collect();
        for (p, bytes) in [(Precision::Checkpoint, bytes), (Precision::Full, capped)] {
            let case = Case::with_bytes(&mut rng, DType::MXFP4, out, inn, bytes);
            let want = case.reference(p, &x);
            assert!(want.iter().all(|y| y.is_finite()), "{} {}: not finite (TF_SEED={seed})", case.name(), p.name());
            for isa in Isa::available() {
                for (layout, got) in case.runs(&pool, isa, p, &x) {
                    assert!(
                        bits(&got) == bits(&want),
                        "{} {} {}{layout} rows={rows}: {} (TF_SEED={seed})",
                        case.name(),
                        p.name(),
                        isa.name(),
                        first_diff(&got, &want)
                    );
                }
            }
        }
    }
}

#[test]
fn rows_are_exact_whatever_their_company() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    for dtype in TYPES {
        let sizes = sizes(&mut rng, dtype);
        let inn = sizes[rng.gen_range(0..sizes.len())].1;
        let out = rng.gen_range(1..48);
        let case = Case::new(&mut rng, dtype, out, inn);
        let row = random_x(&mut rng, 1, inn);
        let alone: Vec<Vec<f32>> = PRECISIONS
            .iter()
            .flat_map(|&p| Isa::available().into_iter().map(move |isa| (p, isa)))
            .map(|(p, isa)| case.run(&pool, isa, p, &row))
            .collect();
        for r in [1, 2, 3, 5, 8, 16, 33, 64] {
            let mut x = random_x(&mut rng, r, inn);
            let at = rng.gen_range(0..r);
            x.row_mut(at).copy_from_slice(row.row(0));
            let runs = PRECISIONS.iter().flat_map(|&p| Isa::available().into_iter().map(move |isa| (p, isa)));
            for ((p, isa), alone) in runs.zip(&alone) {
                let y = case.run(&pool, isa, p, &x);
                let got = &y[at * out..(at + 1) * out];
                assert!(
                    bits(got) == bits(alone),
                    "{} {} {}: row at {at} of {r}: {} (TF_SEED={seed})",
                    case.name(),
                    p.name(),
                    isa.name(),
                    first_diff(got, alone)
                );
            }
        }
    }
}

#[test]
fn thread_count_does_not_matter() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pools = [pool(1), pool(2), pool(3)];
    for dtype in TYPES {
        let inn = 256 * rng.gen_range(1..4);
        // Several chunks of columns, with a ragged last tile.
        let (out, rows) = (rng.gen_range(130..300), rng.gen_range(1..20));
        let case = Case::new(&mut rng, dtype, out, inn);
        let x = random_x(&mut rng, rows, inn);
        for p in PRECISIONS {
            for isa in Isa::available() {
                let one = case.run(&pools[0], isa, p, &x);
                for pool in &pools[1..] {
                    let many = case.run(pool, isa, p, &x);
                    assert!(
                        bits(&many) == bits(&one),
                        "{} {} {} {} threads: {} (TF_SEED={seed})",
                        case.name(),
                        p.name(),
                        isa.name(),
                        pool.threads(),
                        first_diff(&many, &one)
                    );
                }
            }
        }
    }
}

/// Full mode within `(k/16 + 8)·ε·Σ|x·w|` of the f64 dot of the dequantized weights; checkpoint mode within the
/// activation quantization error `Σ|w|·dx/2` (plus rounding) of it. A wrong but self-consistent formula fails.
#[test]
fn results_are_close_to_an_f64_dot() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    let eps = f32::EPSILON as f64;
    for dtype in TYPES {
        for (out, inn) in sizes(&mut rng, dtype) {
            let mut case = Case::new(&mut rng, dtype, out, inn);
            case.bias = None;
            let x = random_x(&mut rng, 3, inn);
            let mut wrow = vec![0f32; inn];
            for p in PRECISIONS {
                let y = case.run(&pool, Isa::detect(), p, &x);
                let block = checkpoint_block(dtype).filter(|_| p == Precision::Checkpoint);
                for r in 0..x.rows {
                    let xq = block.map(|b| quantize_row(x.row(r), b));
                    for n in 0..out {
                        case.w.row_f32(n, &mut wrow);
                        let (mut exact, mut mag, mut qerr) = (0f64, 0f64, 0f64);
                        for (i, (&xv, &wv)) in x.row(r).iter().zip(&wrow).enumerate() {
                            exact += xv as f64 * wv as f64;
                            mag += (xv as f64 * wv as f64).abs();
                            if let Some(q) = &xq {
                                qerr += (wv as f64).abs() * q.d[i / q.block] as f64 * 0.5001;
                            }
                        }
                        let steps = if block.is_some() { inn / 32 } else { inn / 16 } as f64;
                        let tol = qerr + (steps + 8.0) * eps * (mag + qerr) + 1e-30;
                        let got = y[r * out + n] as f64;
                        assert!(
                            (got - exact).abs() <= tol,
                            "{} {} row {r} col {n}: {got} vs {exact} (tol {tol}, TF_SEED={seed})",
                            case.name(),
                            p.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn row_f32_and_as_f32_vec_equal_dequantize() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for dtype in TYPES {
        let case = Case::new(&mut rng, dtype, 5, 256);
        let want = tf_quant::dequantize_to_vec(dtype, &case.bytes, 5 * 256).unwrap();
        assert_eq!(bits(&case.w.as_f32_vec()), bits(&want), "{dtype}");
        let mut row = vec![0f32; 256];
        case.w.row_f32(3, &mut row);
        assert_eq!(bits(&row), bits(&want[3 * 256..4 * 256]), "{dtype}");
    }
}

/// Several weights in one call (mixed types and block sizes, with and without bias, one with no rows to compute)
/// give each weight the reference's bits, on every ISA and layout, in both precisions.
#[test]
fn many_weights_in_one_call_equal_the_reference() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool(2);
    let inn = 512;
    for _ in 0..4 {
        let n = rng.gen_range(1..5);
        let cases: Vec<Case> = (0..n)
            .map(|_| {
                let dtype = [
                    DType::Q4K,
                    DType::Q6K,
                    DType::Q8_0,
                    DType::Q5_0,
                    DType::Q4_1,
                    DType::F32,
                    DType::IQ4NL,
                    DType::IQ4XS,
                    DType::MXFP4,
                ][rng.gen_range(0..9)];
                let out = rng.gen_range(1..70);
                Case::new(&mut rng, dtype, out, inn)
            })
            .collect();
        let rows = [0, 1, 2, 3, 5, 9][rng.gen_range(0..6)];
        let x = random_x(&mut rng, rows, inn);
        for p in PRECISIONS {
            for isa in Isa::available() {
                for stored in [false, true] {
                    let biases: Vec<Option<CpuWeight>> = cases.iter().map(Case::bias_weight).collect();
                    let ws: Vec<(&CpuWeight, Option<&CpuWeight>)> = cases
                        .iter()
                        .zip(&biases)
                        .map(|(c, b)| (if stored { &c.stored } else { &c.w }, b.as_ref()))
                        .collect();
                    let got = matmul_many(&pool, isa, p, &x, &ws);
                    assert_eq!(got.len(), cases.len());
                    for (case, y) in cases.iter().zip(&got) {
                        assert_eq!((y.rows, y.cols), (rows, case.out));
                        let want = case.reference(p, &x);
                        assert!(
                            bits(&y.host) == bits(&want),
                            "{} {} {} stored={stored} rows={rows}: {} (TF_SEED={seed})",
                            case.name(),
                            p.name(),
                            isa.name(),
                            first_diff(&y.host, &want)
                        );
                    }
                }
            }
        }
    }
}
