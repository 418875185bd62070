//! Recurrent-state ops on the CPU: the register store and the Mamba-2 convolution and scan, row by row through the
//! scalar reference (`tf_quant::reference::ssm`). Rows run in order, since a row may read the state an earlier
//! row of the call left ([`StateSrc::Row`]); only states a later row reads are kept in the call.

use std::sync::RwLock;
use tf_core::{BackendError, SsmParams, StateCache, StateIo, StateSpec, StateSrc, Tensor};
use tf_quant::reference::ssm::{conv_row, relu_sq as relu_sq_one, scan_row, ScanParams, ScanShape};

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

#[allow(clippy::too_many_arguments)]
pub fn ssm_scan(
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
    let inner = spec.heads * spec.head_dim;
    assert_eq!(xbc.cols, spec.conv_dim, "ssm_scan: xbc cols vs conv_dim");
    assert!(dt.cols == spec.heads && z.cols == inner, "ssm_scan: dt/z cols");
    assert!(dt.rows == xbc.rows && z.rows == xbc.rows && io.len() == xbc.rows, "ssm_scan: rows");
    StateIo::check(io, spec.registers);
    let shape = ScanShape { heads: spec.heads, head_dim: spec.head_dim, d_state: spec.d_state, groups: spec.groups };
    let params = ScanParams {
        a_log: p.a_log,
        d: p.d,
        dt_bias: p.dt_bias,
        dt_min: p.dt_min,
        eps: p.eps,
        norm_group: p.norm_group,
        norm,
    };
    let mut out = Tensor::zeros(xbc.rows, inner);
    run_rows(
        io,
        spec.ssm_len(),
        &s.layers[layer],
        |l| &mut l.ssm,
        |r, src, next| {
            next.copy_from_slice(src);
            let mut o = vec![0f32; inner];
            scan_row(xbc.row(r), dt.row(r), z.row(r), shape, &params, next, &mut o);
            out.row_mut(r).copy_from_slice(&o);
        },
    );
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
