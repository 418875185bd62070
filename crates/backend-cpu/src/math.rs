//! Transcendentals over slices, per ISA. The AVX2 vectors perform, lane by lane, exactly the operations of the
//! scalar definitions in `tf_quant::reference::math` (same constants, same order, same fma/non-fma choices), so
//! every lane gives the scalar bits; tails shorter than a vector use the scalar functions themselves.
//!
//! Every function taking an [`Isa`] requires `isa` to be usable on this CPU (`Isa::available()`); `CpuBackend`
//! guarantees it for the ISA it holds.

use crate::isa::Isa;
use tf_core::GluAct;
use tf_quant::reference::math as m;

/// `xs[i] = exp(xs[i] - sub)` (the subtraction rounded, then `exp`).
pub(crate) fn exp_sub_inplace(isa: Isa, xs: &mut [f32], sub: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` is Avx2 only when the CPU has AVX2 and FMA (module docs).
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::exp_sub_inplace(xs, sub) },
        _ => xs.iter_mut().for_each(|x| *x = m::exp(*x - sub)),
    }
}

/// Soft-capping of attention scores: `xs[i] = cap * tanh(xs[i] / cap)`.
pub(crate) fn softcap_inplace(isa: Isa, xs: &mut [f32], cap: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `exp_sub_inplace`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::softcap_inplace(xs, cap) },
        _ => xs.iter_mut().for_each(|x| *x = cap * m::tanh(*x / cap)),
    }
}

/// `out[i] = act(gate[i]) * up[i]`; all three `[n]`.
pub(crate) fn glu(isa: Isa, gate: &[f32], up: &[f32], act: GluAct, out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == up.len(), "glu: lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `exp_sub_inplace`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::glu(gate, up, act, out) },
        _ => tf_quant::reference::ops::glu(gate, up, act, out),
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{m, GluAct};
    use std::arch::x86_64::*;
    use tf_quant::reference::ops::glu_one;

    /// `exp` of 8 lanes: `tf_quant::reference::math::exp` step by step.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(m::EXP_LO));
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(m::EXP_HI));
        // Lanes outside [EXP_LO, EXP_HI] (and NaN) are replaced below; clamping keeps their integer work in range.
        let xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(m::EXP_HI)), _mm256_set1_ps(m::EXP_LO));
        let magic = _mm256_set1_ps(m::ROUND_MAGIC);
        let n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(m::LOG2E)), magic), magic);
        // fnmadd(n, c, r) = -(n·c) + r, rounded once: the same value as the scalar fma(-n, c, r).
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(m::LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(m::LN2_LO), r);
        let c = m::EXP_P;
        let mut p = _mm256_fmadd_ps(_mm256_set1_ps(c[0]), r, _mm256_set1_ps(c[1]));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c[2]));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c[3]));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c[4]));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c[5]));
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        // n is an integer in [-150, 128]: the conversion is exact in any rounding mode.
        let k = _mm256_cvtps_epi32(n);
        let k1 = _mm256_srai_epi32::<1>(k);
        let k2 = _mm256_sub_epi32(k, k1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k1, bias)));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k2, bias)));
        let mut res = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
        res = _mm256_blendv_ps(res, _mm256_setzero_ps(), under);
        res = _mm256_blendv_ps(res, _mm256_set1_ps(f32::INFINITY), over);
        _mm256_blendv_ps(res, x, nan)
    }

    /// `tanh` of 8 lanes: `tf_quant::reference::math::tanh` (both branches computed, then selected per lane).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn tanh8(x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let a = _mm256_andnot_ps(sign, x);
        let small = _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(m::TANH_SMALL));
        let z = _mm256_mul_ps(a, a);
        let c = m::TANH_Q;
        let mut q = _mm256_fmadd_ps(_mm256_set1_ps(c[0]), z, _mm256_set1_ps(c[1]));
        q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(c[2]));
        q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(c[3]));
        q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(c[4]));
        let t_small = _mm256_fmadd_ps(_mm256_mul_ps(q, z), a, a);
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0), a));
        let t_large = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        let t = _mm256_blendv_ps(t_large, t_small, small);
        // copysign(t, x)
        _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, x))
    }

    /// `silu` of 8 lanes: `x / (1 + exp(-x))`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn silu8(x: __m256) -> __m256 {
        let neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), exp8(neg)))
    }

    /// gpt-oss's clamped SwiGLU of 8 lanes, `glu_one`'s operations: `g = min(g, limit)` and
    /// `u = clamp(u, -limit, limit)` by compare-and-blend (NaN lanes pass), then
    /// `(u + 1) * (g / (1 + exp(-(alpha * g))))`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn swiglu_clamp8(g: __m256, u: __m256, alpha: f32, limit: f32) -> __m256 {
        let (hi, lo) = (_mm256_set1_ps(limit), _mm256_set1_ps(-limit));
        let g = _mm256_blendv_ps(g, hi, _mm256_cmp_ps::<_CMP_GT_OQ>(g, hi));
        let u = _mm256_blendv_ps(u, hi, _mm256_cmp_ps::<_CMP_GT_OQ>(u, hi));
        let u = _mm256_blendv_ps(u, lo, _mm256_cmp_ps::<_CMP_LT_OQ>(u, lo));
        let neg = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(alpha), g), _mm256_set1_ps(-0.0));
        let one = _mm256_set1_ps(1.0);
        let glu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(neg)));
        _mm256_mul_ps(_mm256_add_ps(u, one), glu)
    }

    /// `gelu_tanh` of 8 lanes: `u = K0 * (x + K1 * ((x * x) * x))`, `x / (1 + exp(-2 * u))`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn gelu8(x: __m256) -> __m256 {
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(m::GELU_K1), x3));
        let u = _mm256_mul_ps(_mm256_set1_ps(m::GELU_K0), inner);
        let e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0), u));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// Applies `f8` to full 8-lane chunks of `xs` in place and `f1` to the tail.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn map_inplace(xs: &mut [f32], f8: impl Fn(__m256) -> __m256, f1: impl Fn(f32) -> f32) {
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds exactly 8 f32; unaligned load/store.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), f8(_mm256_loadu_ps(c.as_ptr()))) };
        }
        for x in chunks.into_remainder() {
            *x = f1(*x);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp_sub_inplace(xs: &mut [f32], sub: f32) {
        let s = _mm256_set1_ps(sub);
        map_inplace(xs, |v| exp8(_mm256_sub_ps(v, s)), |x| m::exp(x - sub));
    }

    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn softcap_inplace(xs: &mut [f32], cap: f32) {
        let c = _mm256_set1_ps(cap);
        map_inplace(xs, |v| _mm256_mul_ps(c, tanh8(_mm256_div_ps(v, c))), |x| cap * m::tanh(x / cap));
    }

    /// `out = act(gate) * up`; all `[n]`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn glu(gate: &[f32], up: &[f32], act: GluAct, out: &mut [f32]) {
        let n = out.len();
        assert!(gate.len() == n && up.len() == n);
        let full = n / 8 * 8;
        for i in (0..full).step_by(8) {
            // SAFETY: i + 8 <= n for all three slices (asserted lengths).
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let y = match act {
                    GluAct::Silu => _mm256_mul_ps(silu8(g), u),
                    GluAct::GeluTanh => _mm256_mul_ps(gelu8(g), u),
                    GluAct::SwigluClamp { alpha, limit } => swiglu_clamp8(g, u, alpha, limit),
                };
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
        }
        for i in full..n {
            out[i] = glu_one(gate[i], up[i], act);
        }
    }

    /// Runs the vector forms over a slice (for the tests of this module).
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn map_for_test(xs: &mut [f32], which: u8) {
        match which {
            0 => map_inplace(xs, |v| exp8(v), m::exp),
            1 => map_inplace(xs, |v| tanh8(v), m::tanh),
            2 => map_inplace(xs, |v| silu8(v), m::silu),
            _ => map_inplace(xs, |v| gelu8(v), m::gelu_tanh),
        }
    }
}

// The AVX2 vectors against the scalar functions (only x86_64 has vector forms of these).
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Interesting inputs: edges of every branch, their neighbours, and a dense sweep.
    fn inputs() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            m::EXP_LO,
            m::EXP_HI,
            88.72,
            88.7228,
            -87.0,
            -103.97,
            m::TANH_SMALL,
            -m::TANH_SMALL,
            0.5,
            -0.5,
        ];
        let edges = v.clone();
        for x in edges {
            for d in 1..4u32 {
                v.push(f32::from_bits(x.to_bits().wrapping_add(d)));
                v.push(f32::from_bits(x.to_bits().wrapping_sub(d)));
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = match i % 3 {
                0 => (s >> 40) as f32 / (1u64 << 24) as f32 * 240.0 - 120.0,
                1 => (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0,
                _ => f32::from_bits(s as u32),
            };
            v.push(x);
        }
        v.retain(|x| !x.is_nan());
        v
    }

    #[test]
    fn avx2_vectors_equal_scalar_bits() {
        if !Isa::available().contains(&Isa::Avx2) {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let xs = inputs();
            let scalar: [fn(f32) -> f32; 4] = [m::exp, m::tanh, m::silu, m::gelu_tanh];
            for (which, f) in scalar.iter().enumerate() {
                let mut v = xs.clone();
                // SAFETY: AVX2 and FMA are available (checked above).
                unsafe { avx2::map_for_test(&mut v, which as u8) };
                for (&x, &y) in xs.iter().zip(&v) {
                    assert_eq!(y.to_bits(), f(x).to_bits(), "function {which} at {x:e} ({:#x})", x.to_bits());
                }
            }
            // NaN in, NaN out.
            let mut v = [f32::NAN; 8];
            // SAFETY: as above.
            unsafe { avx2::map_for_test(&mut v, 0) };
            assert!(v.iter().all(|x| x.is_nan()));
        }
    }
}
