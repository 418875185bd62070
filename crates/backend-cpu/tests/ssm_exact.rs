//! The recurrent-state ops (`ssm_conv`, `ssm_scan`) against the scalar reference (`tf_quant::reference::ssm`),
//! bit for bit: at every ISA this CPU has and 1–3 threads, over calls whose rows read zeros, registers and earlier
//! rows (chains and a tree), with shapes whose state size is not a multiple of 16 and whose heads do not split
//! evenly over the threads. Since the reference computes each row from its own inputs and state, equality also
//! shows each row's bits are those it has alone.

use std::collections::HashMap;
use tf_backend_cpu::isa::Isa;
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision, SsmParams, StateIo, StateSpec, StateSrc, Tensor};
use tf_quant::reference::ssm::{conv_row, scan_row, ScanParams, ScanShape};

/// A fixed LCG in `[-1, 1)`.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
    fn tensor(&mut self, rows: usize, cols: usize, scale: f32) -> Tensor {
        Tensor::host(rows, cols, self.vec(rows * cols, scale))
    }
}

const SPEC: StateSpec = StateSpec {
    layers: 2,
    conv_dim: 6 * 5 + 2 * 3 * 20,
    conv_kernel: 4,
    heads: 6,
    head_dim: 5,
    d_state: 20,
    groups: 3,
    registers: 8,
};

/// Two calls: the first's rows start from zeros and chain (with a tree branch), keeping some states in
/// registers; the second's rows continue from those registers and from each other.
fn calls() -> Vec<Vec<StateIo>> {
    let io = |src, dst| StateIo { src, dst };
    vec![
        vec![
            io(StateSrc::Zero, Some(0)),
            io(StateSrc::Row(0), None),
            io(StateSrc::Row(1), Some(1)),
            io(StateSrc::Row(0), Some(2)),
            io(StateSrc::Row(3), None),
            io(StateSrc::Zero, Some(3)),
        ],
        vec![
            io(StateSrc::Reg(1), Some(4)),
            io(StateSrc::Row(0), Some(5)),
            io(StateSrc::Reg(2), None),
            io(StateSrc::Reg(0), Some(6)),
            io(StateSrc::Row(3), Some(7)),
            io(StateSrc::Reg(3), None),
            io(StateSrc::Row(5), None),
        ],
    ]
}

/// The reference over the same calls: per register and per kept row, the state a row leaves.
fn reference(
    layer_inputs: &[(Tensor, Tensor, Tensor)],
    conv_w: &[f32],
    conv_b: &[f32],
    p: &ScanParams<'_>,
) -> Vec<(Tensor, Tensor)> {
    let shape = ScanShape { heads: SPEC.heads, head_dim: SPEC.head_dim, d_state: SPEC.d_state, groups: SPEC.groups };
    let (mut conv_regs, mut ssm_regs): (HashMap<u32, Vec<f32>>, HashMap<u32, Vec<f32>>) =
        (HashMap::new(), HashMap::new());
    let mut out = Vec::new();
    for (io, (x, dt, z)) in calls().iter().zip(layer_inputs) {
        let (mut conv_rows, mut ssm_rows): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (Vec::new(), Vec::new());
        let mut conv_out = Tensor::zeros(x.rows, SPEC.conv_dim);
        let mut scan_out = Tensor::zeros(x.rows, SPEC.heads * SPEC.head_dim);
        for (r, a) in io.iter().enumerate() {
            let (cw, sw) = match a.src {
                StateSrc::Zero => (vec![0.0; SPEC.conv_len()], vec![0.0; SPEC.ssm_len()]),
                StateSrc::Reg(g) => (conv_regs[&g].clone(), ssm_regs[&g].clone()),
                StateSrc::Row(j) => (conv_rows[j].clone(), ssm_rows[j].clone()),
            };
            let mut next_w = vec![0.0; SPEC.conv_len()];
            conv_row(x.row(r), &cw, conv_w, Some(conv_b), conv_out.row_mut(r), &mut next_w);
            let mut s = sw;
            scan_row(conv_out.row(r), dt.row(r), z.row(r), shape, p, &mut s, scan_out.row_mut(r));
            conv_rows.push(next_w);
            ssm_rows.push(s);
        }
        for (r, a) in io.iter().enumerate() {
            if let Some(g) = a.dst {
                conv_regs.insert(g, conv_rows[r].clone());
                ssm_regs.insert(g, ssm_rows[r].clone());
            }
        }
        out.push((conv_out, scan_out));
    }
    out
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.host.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn conv_and_scan_equal_the_reference() {
    let mut rng = Lcg(7);
    let inner = SPEC.heads * SPEC.head_dim;
    let conv_w = rng.vec(SPEC.conv_dim * SPEC.conv_kernel, 0.5);
    let conv_b = rng.vec(SPEC.conv_dim, 0.2);
    let (a_log, d, dt_bias) = (rng.vec(SPEC.heads, 1.0), rng.vec(SPEC.heads, 1.0), rng.vec(SPEC.heads, 1.0));
    let norm = rng.vec(inner, 1.0);
    let inputs: Vec<(Tensor, Tensor, Tensor)> = calls()
        .iter()
        .map(|io| {
            (
                rng.tensor(io.len(), SPEC.conv_dim, 2.0),
                rng.tensor(io.len(), SPEC.heads, 2.0),
                rng.tensor(io.len(), inner, 2.0),
            )
        })
        .collect();
    let norm_group = inner / SPEC.groups;
    let rp = ScanParams { a_log: &a_log, d: &d, dt_bias: &dt_bias, dt_min: 0.01, eps: 1e-5, norm_group, norm: &norm };
    let want = reference(&inputs, &conv_w, &conv_b, &rp);
    let p = SsmParams { a_log: &a_log, d: &d, dt_bias: &dt_bias, dt_min: 0.01, eps: 1e-5, norm_group };
    let mut isas = vec![Isa::Scalar, Isa::detect()];
    isas.dedup();
    for isa in isas {
        for threads in 1..=3 {
            let be = CpuBackend::with_isa(threads, Precision::Full, isa);
            let st = be.alloc_states(SPEC).unwrap();
            // Layer 1 of the store, so a layer offset bug shows.
            for (c, (io, (x, dt, z))) in calls().iter().zip(&inputs).enumerate() {
                let conv = be.ssm_conv(x, &conv_w, Some(&conv_b), &st, 1, io);
                assert_eq!(bits(&conv), bits(&want[c].0), "ssm_conv, call {c}, {isa:?}, {threads} threads");
                let y = be.ssm_scan(&conv, dt, z, &norm, &p, &st, 1, io);
                assert_eq!(bits(&y), bits(&want[c].1), "ssm_scan, call {c}, {isa:?}, {threads} threads");
            }
        }
    }
}

#[test]
fn relu_sq_is_max_zero_squared() {
    let be = CpuBackend::new(2, Precision::Full);
    let x = Tensor::host(1, 5, vec![-2.0, -0.0, 0.5, 3.0, f32::NAN]);
    let y = be.relu_sq(&x);
    assert_eq!(&y.host[..4], &[0.0, 0.0, 0.25, 9.0]);
    assert!(y.host[4].is_nan());
}
