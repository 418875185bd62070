//! Checkpoint mode: the activation rows of one call quantized once (docs/arithmetic.md, "Activation blocks"),
//! in the layouts the kernels read.

use tf_quant::reference::matmul::{quantize_block, sum_group};

use crate::isa::Isa;

/// `rows` activation rows of `k` values quantized to blocks of `block` (32 or 256) elements.
pub(crate) struct ActQ {
    pub rows: usize,
    pub k: usize,
    /// 32 or 256.
    pub block: usize,
    /// Blocks per row (`k / block`).
    pub nb: usize,
    /// `[rows][k]` quantized values, each in `-127..=127`.
    pub qs: Vec<i8>,
    /// `[rows][nb]` block scales.
    pub d: Vec<f32>,
    /// `[rows][nb * g]` sums of `g = sum_group(block)` values (1 per 32-block, 16 per 256-block).
    pub sums: Vec<i16>,
    /// `[nb][rows]`: `d` transposed, so that the scales of consecutive rows of one block are adjacent.
    pub d_t: Vec<f32>,
    /// `[nb][rows]`: the 32-block sums transposed, as i32 (empty for 256-blocks).
    pub s_t: Vec<i32>,
}

impl ActQ {
    /// Quantizes `x [rows][k]` (`k` a multiple of `block`).
    pub fn new(isa: Isa, x: &[f32], rows: usize, k: usize, block: usize) -> ActQ {
        assert_eq!(k % block, 0, "activation rows of {k} are not whole blocks of {block}");
        let nb = k / block;
        let g = sum_group(block);
        let mut qs = vec![0i8; rows * k];
        let mut d = vec![0f32; rows * nb];
        for ((x, q), d) in x.chunks_exact(block).zip(qs.chunks_exact_mut(block)).zip(d.iter_mut()) {
            *d = quantize(isa, x, q);
        }
        let sums: Vec<i16> = qs.chunks_exact(g).map(|q| q.iter().map(|&v| v as i16).sum()).collect();
        let mut d_t = vec![0f32; rows * nb];
        for r in 0..rows {
            for b in 0..nb {
                d_t[b * rows + r] = d[r * nb + b];
            }
        }
        let mut s_t = Vec::new();
        if block == 32 {
            s_t = vec![0i32; rows * nb];
            for r in 0..rows {
                for b in 0..nb {
                    s_t[b * rows + r] = sums[r * nb + b] as i32;
                }
            }
        }
        ActQ { rows, k, block, nb, qs, d, sums, d_t, s_t }
    }

    /// `[block]` quantized values of row `r`, block `b`.
    pub fn block_qs(&self, r: usize, b: usize) -> &[i8] {
        let at = r * self.k + b * self.block;
        &self.qs[at..at + self.block]
    }

    /// The sums of row `r`, block `b` (`[1]` or `[16]`).
    pub fn block_sums(&self, r: usize, b: usize) -> &[i16] {
        let g = self.block / sum_group(self.block);
        &self.sums[(r * self.nb + b) * g..(r * self.nb + b + 1) * g]
    }
}

/// One block, by the reference rule (every ISA gives the same bits).
fn quantize(isa: Isa, x: &[f32], q: &mut [i8]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { super::avx2::quantize_block(x, q) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Isa::Neon` is only selected on aarch64 with NEON.
        Isa::Neon => unsafe { super::neon::quantize_block(x, q) },
        _ => quantize_block(x, q),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn every_isa_quantizes_like_the_reference() {
        let seed: u64 = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for block in [32, 256] {
            for case in 0..200 {
                let scale = [1e-3f32, 1.0, 1e3, 1e-38, 3e-39][case % 5];
                let mut x: Vec<f32> = (0..block).map(|_| rng.gen_range(-1.0f32..1.0) * scale).collect();
                // Exact halves (round away), ties at the max, zeros, NaN and infinities.
                if case % 7 == 1 {
                    x[3] = 0.5 * x[0] / 63.5 * 127.0;
                    x[5] = -x[0];
                }
                if case % 11 == 2 {
                    x.iter_mut().for_each(|v| *v = 0.0);
                }
                if case % 13 == 3 {
                    x[7] = f32::NAN;
                }
                if case % 17 == 4 {
                    x[9] = f32::INFINITY;
                    x[10] = f32::NEG_INFINITY;
                }
                let mut want = vec![0i8; block];
                let dw = quantize_block(&x, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![0i8; block];
                    let dg = quantize(isa, &x, &mut got);
                    assert_eq!(dg.to_bits(), dw.to_bits(), "{isa:?} block {block} case {case} seed {seed}");
                    assert_eq!(got, want, "{isa:?} block {block} case {case} seed {seed}");
                }
            }
        }
    }
}
