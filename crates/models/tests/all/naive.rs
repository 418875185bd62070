//! A deliberately plain f32/f64 backend for checking the model code independently of the real backends: every op
//! is the textbook formula, row by row. Not row-exactness evidence for anything but itself; it is the oracle that
//! says whether a family file wires the right ops in the right order.

use std::sync::{Arc, Mutex};
use tf_core::{
    AttnMeta, AttnParams, Backend, BackendError, GluAct, KvCache, KvSpec, Precision, Rope, RopeScaling, RopeStyle,
    Tensor, TensorInfo, Weight,
};

pub struct Naive;

/// Weight storage: dequantized f32, row-major `[out, in]`.
struct W(Vec<f32>);

/// KV storage: `[layers][slots][kv_heads·head_dim]` for K and for V.
struct Kv {
    k: Mutex<Vec<f32>>,
    v: Mutex<Vec<f32>>,
}

fn w(w: &Weight) -> &[f32] {
    &w.storage.downcast_ref::<W>().expect("naive weight").0
}

impl Backend for Naive {
    fn describe(&self) -> String {
        "naive test backend".into()
    }

    fn precision(&self) -> Precision {
        Precision::Full
    }

    fn upload(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Weight, BackendError> {
        let v = tf_quant::dequantize_to_vec(info.dtype, bytes, info.numel() as usize)
            .map_err(|e| BackendError(e.to_string()))?;
        let shape = info.shape.iter().map(|&d| d as usize).collect();
        Ok(Weight { name: info.name.clone(), dtype: info.dtype, shape, storage: Arc::new(W(v)) })
    }

    fn upload_f32(&self, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, BackendError> {
        Ok(Weight {
            name: name.into(),
            dtype: tf_core::DType::F32,
            shape: shape.to_vec(),
            storage: Arc::new(W(values)),
        })
    }

    fn embed(&self, table: &Weight, ids: &[u32]) -> Tensor {
        let h = table.in_dim();
        let t = w(table);
        Tensor::host(ids.len(), h, ids.iter().flat_map(|&i| t[i as usize * h..][..h].iter().copied()).collect())
    }

    fn matmul(&self, x: &Tensor, wt: &Weight, bias: Option<&Weight>) -> Tensor {
        let (n, k) = (wt.out_dim(), wt.in_dim());
        assert_eq!(x.cols, k, "matmul {}", wt.name);
        let m = w(wt);
        let b = bias.map(w);
        let mut out = Vec::with_capacity(x.rows * n);
        for r in 0..x.rows {
            let xr = x.row(r);
            for j in 0..n {
                let dot: f64 = m[j * k..][..k].iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                out.push((dot + b.map_or(0.0, |b| b[j] as f64)) as f32);
            }
        }
        Tensor::host(x.rows, n, out)
    }

    fn rms_norm(&self, x: &Tensor, wt: &Weight, group: usize, eps: f32) -> Tensor {
        let g = w(wt);
        let mut out = x.host.clone();
        for chunk in out.chunks_mut(group) {
            let ms: f64 = chunk.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / group as f64;
            let s = 1.0 / (ms + eps as f64).sqrt();
            for (v, &gi) in chunk.iter_mut().zip(g) {
                *v = (*v as f64 * s) as f32 * gi;
            }
        }
        Tensor::host(x.rows, x.cols, out)
    }

    fn rope(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope) {
        let half = rope.rot_dims / 2;
        let inv: Vec<f64> = (0..half)
            .map(|i| {
                let f = rope.theta.powf(-((2 * i) as f64) / rope.rot_dims as f64);
                match rope.scaling {
                    RopeScaling::None => f,
                    RopeScaling::Linear { factor } => f / factor,
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                        let wl = 2.0 * std::f64::consts::PI / f;
                        let (low_wl, high_wl) =
                            (original_context / low_freq_factor, original_context / high_freq_factor);
                        if wl < high_wl {
                            f
                        } else if wl > low_wl {
                            f / factor
                        } else {
                            let s = (original_context / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - s) * f / factor + s * f
                        }
                    }
                    RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, truncate, .. } => {
                        // The pair index at which a frequency turns `rot` times over the original context.
                        let d = rope.rot_dims as f64;
                        let at = |rot: f64| {
                            d * (original_context / (2.0 * std::f64::consts::PI * rot)).ln() / (2.0 * rope.theta.ln())
                        };
                        let (mut lo, mut hi) = (at(beta_fast), at(beta_slow));
                        if truncate {
                            lo = lo.floor();
                            hi = hi.ceil();
                        }
                        let lo = lo.max(0.0);
                        let hi = if hi.min(d - 1.0) == lo { lo + 0.001 } else { hi.min(d - 1.0) };
                        // 0: keep the frequency (extrapolate); 1: divide it by the factor (interpolate).
                        let t = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                        f * (1.0 - t) + f / factor * t
                    }
                }
            })
            .collect();
        let mscale = match rope.scaling {
            RopeScaling::Yarn { mscale, .. } => mscale,
            _ => 1.0,
        };
        let cols = x.cols;
        for (row, &pos) in x.host.chunks_mut(cols).zip(positions) {
            let p = pos as f64;
            for head in row.chunks_mut(head_dim) {
                for (i, &f) in inv.iter().enumerate() {
                    let (c, s) = (((p * f).cos() * mscale) as f32, ((p * f).sin() * mscale) as f32);
                    let (a, b) = match rope.style {
                        RopeStyle::Normal => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c - x1 * s;
                    head[b] = x0 * s + x1 * c;
                }
            }
        }
    }

    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError> {
        let n = spec.layers * spec.blocks * spec.block_size * spec.kv_heads * spec.head_dim;
        Ok(KvCache {
            spec,
            storage: Arc::new(Kv { k: Mutex::new(vec![0.0; n]), v: Mutex::new(vec![0.0; n]) }),
            states: None,
        })
    }

    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]) {
        let s = kv.spec;
        let width = s.kv_heads * s.head_dim;
        let st = kv.storage.downcast_ref::<Kv>().unwrap();
        let (mut kk, mut vv) = (st.k.lock().unwrap(), st.v.lock().unwrap());
        for layer in 0..s.layers {
            let base = layer * s.blocks * s.block_size * width;
            for (&a, &b) in src.iter().zip(dst) {
                let (a, b) = (base + a as usize * width, base + b as usize * width);
                kk.copy_within(a..a + width, b);
                vv.copy_within(a..a + width, b);
            }
        }
    }

    fn kv_write(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) {
        let s = kv.spec;
        let width = s.kv_heads * s.head_dim;
        let base = layer * s.blocks * s.block_size * width;
        let st = kv.storage.downcast_ref::<Kv>().unwrap();
        let (mut kk, mut vv) = (st.k.lock().unwrap(), st.v.lock().unwrap());
        for (r, &slot) in slots.iter().enumerate() {
            let o = base + slot as usize * width;
            kk[o..o + width].copy_from_slice(k.row(r));
            vv[o..o + width].copy_from_slice(v.row(r));
        }
    }

    fn attention(&self, q: &Tensor, kv: &KvCache, layer: usize, meta: &AttnMeta, p: &AttnParams) -> Tensor {
        let s = kv.spec;
        let width = s.kv_heads * s.head_dim;
        let base = layer * s.blocks * s.block_size * width;
        let st = kv.storage.downcast_ref::<Kv>().unwrap();
        let (kk, vv) = (st.k.lock().unwrap(), st.v.lock().unwrap());
        let dh = p.head_dim;
        let mut out = vec![0f32; q.rows * p.heads * dh];
        for (r, ra) in meta.rows.iter().enumerate() {
            let table = &meta.block_tables[ra.seq];
            let mut keys: Vec<(u32, usize)> = (0..ra.ctx)
                .map(|pos| {
                    (pos, table[pos as usize / s.block_size] as usize * s.block_size + pos as usize % s.block_size)
                })
                .collect();
            keys.extend(ra.tree.iter().map(|&(pos, slot)| (pos, slot as usize)));
            if let Some(wnd) = p.window {
                keys.retain(|&(pos, _)| pos + wnd > ra.pos);
            }
            for h in 0..p.heads {
                let kh = h / (p.heads / p.kv_heads);
                let qv = &q.row(r)[h * dh..][..dh];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&(_, slot)| {
                        let kr = &kk[base + slot * width + kh * dh..][..dh];
                        let mut sc =
                            qv.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * p.scale as f64;
                        if let Some(c) = p.softcap {
                            sc = c as f64 * (sc / c as f64).tanh();
                        }
                        sc
                    })
                    .collect();
                // The sink: one more logit in the softmax, without a value.
                let sink = p.sinks.as_ref().map(|s| s[h] as f64);
                let mx = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|&x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
                let o = &mut out[(r * p.heads + h) * dh..][..dh];
                for d in 0..dh {
                    let acc: f64 = keys
                        .iter()
                        .zip(&e)
                        .map(|(&(_, slot), &wgt)| wgt * vv[base + slot * width + kh * dh + d] as f64)
                        .sum();
                    o[d] = (acc / sum) as f32;
                }
            }
        }
        Tensor::host(q.rows, p.heads * dh, out)
    }

    fn glu(&self, gate: &Tensor, up: &Tensor, act: GluAct) -> Tensor {
        if let GluAct::SwigluClamp { alpha, limit } = act {
            // gpt-oss: gate clamped above, up on both sides; (up + 1) · gate · sigmoid(alpha · gate), in f64.
            let f = |g: f32, u: f32| -> f32 {
                let (g, u, a, l) = (g as f64, u as f64, alpha as f64, limit as f64);
                let (g, u) = (g.min(l), u.clamp(-l, l));
                ((u + 1.0) * g / (1.0 + (-a * g).exp())) as f32
            };
            return Tensor::host(
                gate.rows,
                gate.cols,
                gate.host.iter().zip(&up.host).map(|(&g, &u)| f(g, u)).collect(),
            );
        }
        let f = |g: f32| -> f32 {
            let g = g as f64;
            (match act {
                GluAct::Silu => g / (1.0 + (-g).exp()),
                GluAct::GeluTanh => {
                    0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
                }
                GluAct::SwigluClamp { .. } => unreachable!("handled above"),
            }) as f32
        };
        Tensor::host(gate.rows, gate.cols, gate.host.iter().zip(&up.host).map(|(&g, &u)| f(g) * u).collect())
    }

    fn add(&self, a: &mut Tensor, b: &Tensor) {
        a.host.iter_mut().zip(&b.host).for_each(|(x, y)| *x += y);
    }

    fn scale(&self, x: &mut Tensor, s: f32) {
        x.host.iter_mut().for_each(|v| *v *= s);
    }

    fn select_rows(&self, x: &Tensor, rows: &[usize]) -> Tensor {
        Tensor::host(rows.len(), x.cols, rows.iter().flat_map(|&r| x.row(r).iter().copied()).collect())
    }

    fn add_rows_scaled(&self, acc: &mut Tensor, y: &Tensor, rows: &[usize], scales: &[f32]) {
        for (i, (&r, &s)) in rows.iter().zip(scales).enumerate() {
            for j in 0..y.cols {
                acc.host[r * acc.cols + j] += s * y.host[i * y.cols + j];
            }
        }
    }

    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        x.host.clone()
    }
}
