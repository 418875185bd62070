//! Our own f32 transcendentals: the exact definitions every backend and SIMD level reproduces bit for bit
//! (docs/arithmetic.md, "Elementwise math"). Only `+ - * /`, `fma` (`f32::mul_add`, one rounding), comparisons
//! and bit manipulation are used; never libm. Every line is one rounded operation in the order written: a SIMD
//! kernel that performs the same operations lane-wise gets the same bits.
//!
//! NaN inputs give NaN outputs (their payload bits are not part of the contract).

/// `log2(e)` rounded to f32.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` rounded to f32 (0x3f317218). `n · LN2_HI` is exact inside an fma for the `n` that occur, so the
/// first reduction step `x - n·LN2_HI` is exact.
pub const LN2_HI: f32 = f32::from_bits(0x3f31_7218);
/// `ln 2 - LN2_HI` rounded to f32 (≈ -1.9046542e-9).
pub const LN2_LO: f32 = f32::from_bits(0xb102_e308);
/// `1.5 · 2^23`: `(y + ROUND_MAGIC) - ROUND_MAGIC` rounds `|y| < 2^22` to the nearest integer, ties to even.
pub const ROUND_MAGIC: f32 = 12_582_912.0;
/// Below this, `exp` returns +0 (`exp(-104) ≈ 6.8e-46` is under half the smallest subnormal).
pub const EXP_LO: f32 = -104.0;
/// Above this, `exp` returns +inf (`ln(f32::MAX) ≈ 88.7228`; inputs in (88.7228, 88.8] overflow to inf in the
/// final multiplication).
pub const EXP_HI: f32 = 88.8;
/// Polynomial for `exp(r) ≈ 1 + r + r²·P(r)` on `|r| ≤ ln2/2` (the Cephes `expf` coefficients, rounded to f32):
/// `P(r) = P0·r⁵ + … + P5`; P0..P5 ≈ 1.9875691e-4, 1.3981999e-3, 8.333452e-3, 4.1665796e-2, 1.6666666e-1, 0.5.
pub const EXP_P: [f32; 6] = [
    f32::from_bits(0x3950_6967),
    f32::from_bits(0x3ab7_43ce),
    f32::from_bits(0x3c08_8908),
    f32::from_bits(0x3d2a_a9c1),
    f32::from_bits(0x3e2a_aaaa),
    f32::from_bits(0x3f00_0000),
];

/// Below this `|x|`, `tanh` uses its odd polynomial; at or above, the `exp` formula.
pub const TANH_SMALL: f32 = 0.625;
/// Odd polynomial for `tanh(a) ≈ a + a·z·Q(z)`, `z = a²`, on `a < 0.625` (the Cephes `tanhf` coefficients, rounded
/// to f32): `Q = Q0·z⁴ + … + Q4`; Q0..Q4 ≈ -5.7049887e-3, 2.0639088e-2, -5.3739715e-2, 1.3331442e-1, -3.333328e-1.
pub const TANH_Q: [f32; 5] = [
    f32::from_bits(0xbbba_f0ea),
    f32::from_bits(0x3ca9_134e),
    f32::from_bits(0xbd5c_1e2d),
    f32::from_bits(0x3e08_8393),
    f32::from_bits(0xbeaa_aa99),
];

/// `sqrt(2/π)` ≈ 0.7978846 and the cubic coefficient 0.044715 of the tanh form of GELU, as f32.
pub const GELU_K0: f32 = f32::from_bits(0x3f4c_422a);
pub const GELU_K1: f32 = f32::from_bits(0x3d37_2713);

/// `2^k` for `-126 ≤ k ≤ 127`, built from the exponent bits.
#[inline]
pub fn pow2i(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `e^x`, exactly as follows (each step one rounding):
///
/// 1. NaN → NaN (the input); `x < -104` → `+0.0`; `x > 88.8` → `+inf`.
/// 2. `n = (x * LOG2E + ROUND_MAGIC) - ROUND_MAGIC` (an integer in `[-150, 128]`).
/// 3. `r = fma(-n, LN2_HI, x)`; `r = fma(-n, LN2_LO, r)`.
/// 4. `p = fma(fma(fma(fma(fma(P0, r, P1), r, P2), r, P3), r, P4), r, P5)`;
///    `y = fma(p, r * r, r) + 1.0`.
/// 5. With `k = n as i32`, `k1 = k >> 1` (floor) and `k2 = k - k1`: result `(y * 2^k1) * 2^k2`. The first
///    product is exact; the second rounds once (to a subnormal, or to inf, when the result is one).
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_LO {
        return 0.0;
    }
    if x > EXP_HI {
        return f32::INFINITY;
    }
    let n = (x * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let [p0, p1, p2, p3, p4, p5] = EXP_P;
    let p = p0.mul_add(r, p1).mul_add(r, p2).mul_add(r, p3).mul_add(r, p4).mul_add(r, p5);
    let y = p.mul_add(r * r, r) + 1.0;
    let k = n as i32;
    let k1 = k >> 1;
    let k2 = k - k1;
    (y * pow2i(k1)) * pow2i(k2)
}

/// `silu(x) = x / (1.0 + exp(-x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `tanh(x)`, computed on `a = |x|` and given the sign of `x` at the end (`copysign`, so `tanh(-0.0) = -0.0`):
/// - `a < TANH_SMALL`: `z = a * a`; `q = fma(fma(fma(fma(Q0, z, Q1), z, Q2), z, Q3), z, Q4)`;
///   `t = fma(q * z, a, a)`;
/// - otherwise (and for NaN): `e = exp(-2.0 * a)`; `t = (1.0 - e) / (1.0 + e)`.
#[inline]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let t = if a < TANH_SMALL {
        let z = a * a;
        let [q0, q1, q2, q3, q4] = TANH_Q;
        let q = q0.mul_add(z, q1).mul_add(z, q2).mul_add(z, q3).mul_add(z, q4);
        (q * z).mul_add(a, a)
    } else {
        let e = exp(-2.0 * a);
        (1.0 - e) / (1.0 + e)
    };
    t.copysign(x)
}

/// GELU, tanh form. `0.5·x·(1 + tanh(u))` equals `x / (1 + e^(-2u))`, which has no cancellation for negative
/// `x`, so: `u = GELU_K0 * (x + GELU_K1 * ((x * x) * x))`; result `x / (1.0 + exp(-2.0 * u))` (each operation
/// rounded, no fma).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let u = GELU_K0 * (x + GELU_K1 * ((x * x) * x));
    x / (1.0 + exp(-2.0 * u))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error of `got` against the exact `want` in units of the f32 ulp at `want` (subnormal spacing below the
    /// normal range).
    fn ulps(got: f32, want: f64) -> f64 {
        let a = want.abs();
        let ulp = if a < f32::MIN_POSITIVE as f64 { 2f64.powi(-149) } else { 2f64.powi(a.log2().floor() as i32 - 23) };
        (got as f64 - want).abs() / ulp
    }

    /// `n` points spread evenly over `[lo, hi]` plus their neighbours one ulp away.
    fn points(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).flat_map(move |i| {
            let x = lo + (hi - lo) * (i as f32 / n as f32);
            [x, f32::from_bits(x.to_bits().wrapping_add(1)), f32::from_bits(x.to_bits().wrapping_sub(1))]
        })
    }

    #[test]
    fn constants_are_what_the_doc_says() {
        assert_eq!(LN2_HI as f64, 0.693_147_182_464_599_6);
        assert_eq!(GELU_K0, (2.0 / std::f64::consts::PI).sqrt() as f32);
        assert_eq!(GELU_K1, 0.044715);
        assert_eq!(EXP_P[5], 0.5);
        let lo = std::f64::consts::LN_2 - LN2_HI as f64;
        assert_eq!(LN2_LO, lo as f32);
        assert_eq!(pow2i(-126), f32::MIN_POSITIVE);
        assert_eq!(pow2i(127), 2f32.powi(127));
        assert_eq!(pow2i(0), 1.0);
    }

    #[test]
    fn exp_accuracy_over_the_normal_range() {
        let mut worst = (0.0f64, 0.0f32);
        for x in points(-87.0, 88.0, 2_000_000).chain(points(-1.0, 1.0, 200_000)) {
            let e = ulps(exp(x), (x as f64).exp());
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 1.5, "exp max error {} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp(-0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp(-104.5).to_bits(), 0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(88.75), f32::INFINITY);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert!(exp(88.72).is_finite());
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(1.0), std::f32::consts::E);
        // The subnormal range: within one subnormal step of the truth.
        for x in points(-104.0, -87.0, 100_000) {
            let want = (x as f64).exp();
            assert!(ulps(exp(x), want) <= 1.0, "exp({x}) = {:e}, want {want:e}", exp(x));
        }
        // Monotone over a dense sample.
        let mut prev = 0.0f32;
        for x in points(-110.0, 89.0, 400_000).step_by(3) {
            let y = exp(x);
            assert!(y >= prev, "exp not monotone at {x}");
            prev = y;
        }
    }

    #[test]
    fn tanh_accuracy() {
        let mut worst = (0.0f64, 0.0f32);
        for x in points(-12.0, 12.0, 1_000_000).chain(points(-0.7, 0.7, 200_000)).chain(points(-1e-3, 1e-3, 10_000)) {
            let e = ulps(tanh(x), (x as f64).tanh());
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 3.0, "tanh max error {} ulp at {}", worst.0, worst.1);
        assert_eq!(tanh(0.0).to_bits(), 0);
        assert_eq!(tanh(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(tanh(30.0), 1.0);
        assert_eq!(tanh(-30.0), -1.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert!(tanh(f32::NAN).is_nan());
        for x in points(-1e-30, 1e-30, 1000).filter(|x| !x.is_nan()) {
            assert_eq!(tanh(x), x, "tanh of tiny {x}");
        }
    }

    #[test]
    fn silu_and_gelu_accuracy() {
        let mut worst_silu = 0.0f64;
        let mut worst_gelu = 0.0f64;
        for x in points(-60.0, 60.0, 1_000_000) {
            let xd = x as f64;
            let s = xd / (1.0 + (-xd).exp());
            // Relative error against the exact value, with an absolute floor for results near 0.
            worst_silu = worst_silu.max((silu(x) as f64 - s).abs() / s.abs().max(1e-30));
            let u = GELU_K0 as f64 * (xd + GELU_K1 as f64 * xd * xd * xd);
            let g = xd / (1.0 + (-2.0 * u).exp());
            // the ~2 ulp rounding of `u` moves the result by about `2·|2u·(1 - σ(2u))|` ulps: scale by it.
            let cond = 1.0 + 2.0 * (2.0 * u * (1.0 - 1.0 / (1.0 + (-2.0 * u).exp()))).abs();
            if g.abs() < 1e-30 {
                // Results this small may flush to zero (`exp(-2u)` overflows first); only their size is checked.
                assert!(gelu_tanh(x).abs() < 1e-30, "gelu({x})");
            } else {
                worst_gelu = worst_gelu.max(ulps(gelu_tanh(x), g) / cond);
            }
        }
        eprintln!("silu max relative error {worst_silu:e}, gelu max ulps / condition {worst_gelu}");
        assert!(worst_silu < 4e-7, "silu relative error {worst_silu:e}");
        assert!(worst_gelu < 3.0, "gelu error {worst_gelu} ulps / condition");
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(-200.0), -0.0);
        assert_eq!(silu(200.0), 200.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(100.0), 100.0);
        assert_eq!(gelu_tanh(-100.0), -0.0);
        assert_eq!(gelu_tanh(f32::MAX), f32::MAX);
        assert!(silu(f32::NAN).is_nan() && gelu_tanh(f32::NAN).is_nan());
    }
}
