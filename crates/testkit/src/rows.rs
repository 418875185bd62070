//! Random test data shared by the backends' op tests (CPU and CUDA draw the same kinds of rows).

use rand::rngs::StdRng;
use rand::Rng;

/// `n` values uniform in ±`scale`, with about 1% each of +0, −0 and tiny values (±1e-30).
pub fn values(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.gen_range(0..100) {
            0 => 0.0,
            1 => -0.0,
            2 => rng.gen_range(-1e-30f32..1e-30),
            _ => rng.gen_range(-scale..scale),
        })
        .collect()
}

/// A random logits row for the argmax: plain values, or with ties at the maximum (anywhere, so different threads
/// hold them), NaN of any sign and payload, ±0 as the maximum, +∞ twice, the maximum next to its neighbour
/// float, every value −∞, every value NaN, or NaN and −∞ only; sometimes the maximum at either end.
pub fn argmax_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let nan = |rng: &mut StdRng| f32::from_bits(0x7fc0_0000 | (rng.gen::<u32>() & 0x803f_ffff));
    let at = |rng: &mut StdRng| rng.gen_range(0..n);
    let mut row = values(rng, n, 30.0);
    let kind = rng.gen_range(0..9);
    match kind {
        0 => {}
        1 => {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for _ in 0..rng.gen_range(1..5) {
                let i = at(rng);
                row[i] = m;
            }
        }
        2 => {
            for _ in 0..rng.gen_range(1..=n.min(200)) {
                let i = at(rng);
                row[i] = nan(rng);
            }
        }
        3 => {
            row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
            for _ in 0..rng.gen_range(1..5) {
                let i = at(rng);
                row[i] = if rng.gen() { 0.0 } else { -0.0 };
            }
        }
        4 => {
            for _ in 0..2 {
                let i = at(rng);
                row[i] = f32::INFINITY;
            }
        }
        5 => {
            // The maximum and the float just below it, at random places.
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max).abs() + 1.0;
            let (i, j) = (at(rng), at(rng));
            row[i] = f32::from_bits(m.to_bits() - 1);
            row[j] = m;
        }
        6 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
        7 => row.iter_mut().for_each(|v| *v = nan(rng)),
        _ => row.iter_mut().for_each(|v| *v = if rng.gen() { nan(rng) } else { f32::NEG_INFINITY }),
    }
    if kind <= 5 && n > 1 && rng.gen_range(0..4) == 0 {
        let m = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        let i = if rng.gen() { 0 } else { n - 1 };
        row[i] = m;
    }
    row
}
