//! Recurrent-state ops on the CPU: the register store and the Mamba-2 convolution and scan, row by row through the
//! scalar reference (`tf_quant::reference::ssm`). Rows run in order, since a row may read the state an earlier
//! row of the call left ([`StateSrc::Row`]); only states a later row reads are kept in the call.

use crate::isa::Isa;
use crate::pool::Pool;
use std::sync::RwLock;
use tf_core::{BackendError, SsmParams, StateCache, StateIo, StateSpec, StateSrc, Tensor};
use tf_quant::reference::ssm::{conv_row, gate_norm, relu_sq as relu_sq_one, step_decay};

/// One recurrent layer's registers: `conv [registers, conv_len]`, `ssm [registers, ssm_len]`.
struct LayerStates {
    conv: Vec<f32>,
    ssm: Vec<f32>,
}

/// The storage behind a CPU [`StateCache`].
pub struct CpuStates {
    spec: StateSpec,
    layers: Vec<RwLock<LayerStates>>,
}

impl CpuStates {
    pub fn alloc(spec: StateSpec) -> Result<CpuStates, BackendError> {
        let too_big = || BackendError(format!("recurrent state {spec:?} is too large"));
        let conv = spec.conv_len().checked_mul(spec.registers).ok_or_else(too_big)?;
        let ssm = spec.ssm_len().checked_mul(spec.registers).ok_or_else(too_big)?;
        let mut layers = Vec::with_capacity(spec.layers);
        for _ in 0..spec.layers {
            let mut c = Vec::new();
            let mut s = Vec::new();
            c.try_reserve_exact(conv).map_err(|_| too_big())?;
            s.try_reserve_exact(ssm).map_err(|_| too_big())?;
            c.resize(conv, 0.0);
            s.resize(ssm, 0.0);
            layers.push(RwLock::new(LayerStates { conv: c, ssm: s }));
        }
        Ok(CpuStates { spec, layers })
    }
}

fn store(st: &StateCache) -> &CpuStates {
    st.storage.downcast_ref::<CpuStates>().expect("a state store from the CPU backend")
}

/// Runs `row(r, src, out_state)` for every row in order, `src` the state it reads (`len` floats from register
/// storage `part` of the layer, a kept earlier row, or zeros), and stores each outgoing state where `io` says.
fn run_rows(
    io: &[StateIo],
    len: usize,
    layer: &RwLock<LayerStates>,
    part: fn(&mut LayerStates) -> &mut Vec<f32>,
    mut row: impl FnMut(usize, &[f32], &mut [f32]),
) {
    let later = StateIo::read_later(io);
    let mut kept: Vec<Option<Vec<f32>>> = vec![None; io.len()];
    let zeros = vec![0f32; len];
    let mut guard = layer.write().unwrap_or_else(|e| e.into_inner());
    for (r, x) in io.iter().enumerate() {
        let mut next = vec![0f32; len];
        {
            let regs = part(&mut guard);
            let src: &[f32] = match x.src {
                StateSrc::Zero => &zeros,
                StateSrc::Reg(g) => &regs[g as usize * len..(g as usize + 1) * len],
                StateSrc::Row(j) => kept[j].as_deref().expect("state of an earlier row kept for a later one"),
            };
            row(r, src, &mut next);
        }
        if let Some(g) = x.dst {
            part(&mut guard)[g as usize * len..(g as usize + 1) * len].copy_from_slice(&next);
        }
        if later[r] {
            kept[r] = Some(next);
        }
    }
}

pub fn ssm_conv(x: &Tensor, w: &[f32], b: Option<&[f32]>, st: &StateCache, layer: usize, io: &[StateIo]) -> Tensor {
    let s = store(st);
    let spec = s.spec;
    assert_eq!(x.cols, spec.conv_dim, "ssm_conv: x cols vs conv_dim");
    assert_eq!(io.len(), x.rows, "ssm_conv: one StateIo per row");
    assert_eq!(w.len(), spec.conv_dim * spec.conv_kernel, "ssm_conv: weight length");
    StateIo::check(io, spec.registers);
    let mut out = Tensor::zeros(x.rows, x.cols);
    run_rows(
        io,
        spec.conv_len(),
        &s.layers[layer],
        |l| &mut l.conv,
        |r, src, next| {
            let mut o = vec![0f32; spec.conv_dim];
            conv_row(x.row(r), src, w, b, &mut o, next);
            out.row_mut(r).copy_from_slice(&o);
        },
    );
    out
}

/// One head of one row, as `tf_quant::reference::ssm::scan_head`: the state update by fused multiply-adds over
/// `d_state` (elementwise, so any vector width gives the reference's bits) and `y` by the canonical `dot16`.
#[allow(clippy::too_many_arguments)]
fn scan_head(
    isa: Isa,
    x: &[f32],
    b: &[f32],
    c: &[f32],
    step: f32,
    decay: f32,
    d: f32,
    state: &mut [f32],
    out: &mut [f32],
) {
    let ds = b.len();
    let kb: Vec<f32> = b.iter().map(|&bn| step * bn).collect(); // [d_state]
    for (p, (&xv, o)) in x.iter().zip(out.iter_mut()).enumerate() {
        let s = &mut state[p * ds..(p + 1) * ds];
        update(isa, s, decay, &kb, xv);
        *o = xv.mul_add(d, crate::simd::dot16(isa, s, c));
    }
}

/// `s[n] = fma(s[n], decay, kb[n] · x)`.
#[inline]
fn update(isa: Isa, s: &mut [f32], decay: f32, kb: &[f32], x: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` is Avx2 or Avx512 only when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { update_fma(s, decay, kb, x) },
        _ => s.iter_mut().zip(kb).for_each(|(sn, &k)| *sn = sn.mul_add(decay, k * x)),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn update_fma(s: &mut [f32], decay: f32, kb: &[f32], x: f32) {
    s.iter_mut().zip(kb).for_each(|(sn, &k)| *sn = sn.mul_add(decay, k * x));
}

/// The selective scan of every row, heads split across the pool's threads (a head's recurrence is its own: rows
/// run in order within each unit of heads), then the gate and group norm per row.
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan(
    pool: &Pool,
    isa: Isa,
    xbc: &Tensor,
    dt: &Tensor,
    z: &Tensor,
    norm: &[f32],
    p: &SsmParams<'_>,
    st: &StateCache,
    layer: usize,
    io: &[StateIo],
) -> Tensor {
    let s = store(st);
    let spec = s.spec;
    let (heads, hd, ds, groups) = (spec.heads, spec.head_dim, spec.d_state, spec.groups);
    let inner = heads * hd;
    assert_eq!(xbc.cols, spec.conv_dim, "ssm_scan: xbc cols vs conv_dim");
    assert!(dt.cols == heads && z.cols == inner, "ssm_scan: dt/z cols");
    assert!(dt.rows == xbc.rows && z.rows == xbc.rows && io.len() == xbc.rows, "ssm_scan: rows");
    assert!(p.a_log.len() == heads && p.d.len() == heads && p.dt_bias.len() == heads, "ssm_scan: per-head params");
    StateIo::check(io, spec.registers);
    let rows = xbc.rows;
    let (len, per_head, per_group) = (spec.ssm_len(), hd * ds, heads / groups);
    let later = StateIo::read_later(io);
    let units = heads.min(2 * pool.threads()).max(1);
    let span = heads.div_ceil(units);
    let mut guard = s.layers[layer].write().unwrap_or_else(|e| e.into_inner());
    // Per unit: `y [rows, its heads · hd]` and the states its rows keep (`(row, [its heads · hd · ds])`).
    type UnitOut = (Vec<f32>, Vec<(usize, Vec<f32>)>);
    let results: Vec<UnitOut> = {
        let regs: &[f32] = &guard.ssm;
        let run = |u: usize| -> UnitOut {
            let (h0, h1) = ((u * span).min(heads), ((u + 1) * span).min(heads));
            let n = (h1 - h0) * per_head;
            let mut y = vec![0f32; rows * (h1 - h0) * hd];
            let mut kept: Vec<Option<Vec<f32>>> = vec![None; rows];
            let mut keep = Vec::new();
            for r in 0..rows {
                let mut cur = match io[r].src {
                    StateSrc::Zero => vec![0f32; n],
                    StateSrc::Reg(g) => regs[g as usize * len + h0 * per_head..][..n].to_vec(),
                    StateSrc::Row(j) => kept[j].clone().expect("state of an earlier row kept for a later one"),
                };
                let (x, bc) = xbc.row(r).split_at(inner);
                let (b_all, c_all) = bc.split_at(groups * ds);
                for h in h0..h1 {
                    let g = h / per_group;
                    let (step, decay) = step_decay(dt.row(r)[h], p.dt_bias[h], p.dt_min, p.a_log[h]);
                    scan_head(
                        isa,
                        &x[h * hd..(h + 1) * hd],
                        &b_all[g * ds..(g + 1) * ds],
                        &c_all[g * ds..(g + 1) * ds],
                        step,
                        decay,
                        p.d[h],
                        &mut cur[(h - h0) * per_head..(h - h0 + 1) * per_head],
                        &mut y[(r * (h1 - h0) + h - h0) * hd..][..hd],
                    );
                }
                if io[r].dst.is_some() {
                    keep.push((r, cur.clone()));
                }
                if later[r] {
                    kept[r] = Some(cur);
                }
            }
            (y, keep)
        };
        if units == 1 || rows * inner * ds < 1 << 14 {
            (0..units).map(run).collect()
        } else {
            pool.map(units, run)
        }
    };
    let mut out = Tensor::zeros(rows, inner);
    for (u, (y, keep)) in results.into_iter().enumerate() {
        let (h0, h1) = ((u * span).min(heads), ((u + 1) * span).min(heads));
        let w = (h1 - h0) * hd;
        for r in 0..rows {
            out.row_mut(r)[h0 * hd..h1 * hd].copy_from_slice(&y[r * w..(r + 1) * w]);
        }
        for (r, state) in keep {
            let g = io[r].dst.expect("kept rows have a register") as usize;
            guard.ssm[g * len + h0 * per_head..][..state.len()].copy_from_slice(&state);
        }
    }
    for r in 0..rows {
        gate_norm(out.row_mut(r), z.row(r), norm, p.norm_group, p.eps);
    }
    out
}

/// `max(x, 0)²` elementwise (the reference, one value at a time).
pub fn relu_sq(x: &Tensor) -> Tensor {
    let mut out = Tensor::zeros(x.rows, x.cols);
    for r in 0..x.rows {
        for (o, &v) in out.row_mut(r).iter_mut().zip(x.row(r)) {
            *o = relu_sq_one(v);
        }
    }
    out
}
