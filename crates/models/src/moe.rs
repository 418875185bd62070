//! The mixture-of-experts feed-forward, a shared layer (Qwen3-MoE, Mixtral, gpt-oss): its weights in both formats,
//! the router's choice, and the combine. gpt-oss adds a router bias and expert biases (`MoeMlp::router_bias`,
//! `MoeMlp::biases`); its softmax over the top-k logits is the normalized top-k of the full softmax (`norm_topk`).
//!
//! Row-exactness: the router logits come from a row-exact matmul; the choice and the weights of a row are computed
//! on the host from that row's logits alone (f64 softmax, ties to the lower expert id); each expert runs the rows
//! that chose it through row-exact matmuls; and a row receives its experts' outputs in ascending expert id (one
//! [`Backend::add_rows_scaled`] per expert), so its bits never depend on which other rows share the batch or which
//! experts they chose.
//!
//! Shapes: `R` rows, `H` hidden, `E` experts, `K` experts per token, `Fe` expert feed-forward width.

use crate::config::{ModelConfig, MoeConfig};
use crate::layers::{trace, weight_bytes, GluMlp};
use crate::load::{Loader, Name};

/// The router in GGUF (`[E, H]`); the transformers name depends on the family (see [`load`]).
pub const ROUTER: Name = Name { gguf: "blk.{}.ffn_gate_inp", hf: "model.layers.{}.mlp.gate" };
use crate::model::ModelError;
use tf_core::{Backend, ConfigFormat, GluAct, Tensor, Weight};

/// One sparse feed-forward layer.
#[derive(Clone, Debug)]
pub struct MoeMlp {
    /// `[E, H]`.
    pub router: Weight,
    /// `[E]` f32 (gpt-oss).
    pub router_bias: Option<Weight>,
    /// Per expert, the biases of gate `[Fe]`, up `[Fe]` and down `[H]` (gpt-oss), f32.
    pub biases: Option<Vec<[Weight; 3]>>,
    /// Per expert: gate and up `[Fe, H]`, down `[H, Fe]`.
    pub experts: Vec<GluMlp>,
    /// Experts per token.
    pub used: usize,
    /// Divide the chosen probabilities by their sum.
    pub norm_topk: bool,
}

impl MoeMlp {
    /// Bytes of the router and every expert.
    pub fn nbytes(&self) -> u64 {
        let biases = self.biases.iter().flatten().flatten().map(Weight::nbytes).sum::<u64>();
        self.router.nbytes()
            + weight_bytes([self.router_bias.as_ref()])
            + self.experts.iter().map(GluMlp::nbytes).sum::<u64>()
            + biases
    }

    /// Bytes one token reads: the router and `used` experts.
    pub fn bytes_per_token(&self) -> u64 {
        let one = self.experts.first().map_or(0, GluMlp::nbytes)
            + self.biases.as_ref().and_then(|b| b.first()).map_or(0, |b| b.iter().map(Weight::nbytes).sum());
        weight_bytes([Some(&self.router), self.router_bias.as_ref()]) + one * self.used as u64
    }
}

/// The sparse feed-forward of layer `l`. GGUF stores each projection of all experts as one `[E, Fe, H]` tensor
/// (`blk.{l}.ffn_{gate,up,down}_exps`, router `blk.{l}.ffn_gate_inp`); Hugging Face checkpoints store one tensor per
/// expert: Qwen3-MoE `mlp.experts.{e}.{gate,up,down}_proj` with router `mlp.gate`, Mixtral
/// `block_sparse_moe.experts.{e}.{w1,w3,w2}` with router `block_sparse_moe.gate`.
pub fn load(ld: &Loader, cfg: &ModelConfig, moe: &MoeConfig, l: usize) -> Result<MoeMlp, ModelError> {
    let (h, f, e) = (cfg.hidden, moe.ffn, moe.experts);
    let (router, experts) = match cfg.format {
        ConfigFormat::Gguf => {
            let router = ld.matrix(ROUTER, l, [e, h])?; // [E, H]
            let gate = ld.expert_slices(&format!("blk.{l}.ffn_gate_exps.weight"), [e, f, h])?; // E × [Fe, H]
            let up = ld.expert_slices(&format!("blk.{l}.ffn_up_exps.weight"), [e, f, h])?; // E × [Fe, H]
            let down = ld.expert_slices(&format!("blk.{l}.ffn_down_exps.weight"), [e, h, f])?; // E × [H, Fe]
            let experts = gate.into_iter().zip(up).zip(down).map(|((gate, up), down)| GluMlp { gate, up, down });
            (router, experts.collect())
        }
        ConfigFormat::HfConfig => {
            let qwen = format!("model.layers.{l}.mlp");
            let mixtral = format!("model.layers.{l}.block_sparse_moe");
            let (base, [g, u, d]) = if ld.has_hf(&format!("{qwen}.gate.weight")) {
                (qwen, ["gate_proj", "up_proj", "down_proj"])
            } else {
                (mixtral, ["w1", "w3", "w2"])
            };
            let router = ld.matrix_named(&ld.hf_name(&format!("{base}.gate.weight")), [e, h])?; // [E, H]
            let experts = (0..e)
                .map(|x| {
                    let m =
                        |p: &str, shape| ld.matrix_named(&ld.hf_name(&format!("{base}.experts.{x}.{p}.weight")), shape);
                    Ok(GluMlp { gate: m(g, [f, h])?, up: m(u, [f, h])?, down: m(d, [h, f])? })
                })
                .collect::<Result<Vec<_>, ModelError>>()?;
            (router, experts)
        }
    };
    Ok(MoeMlp { router, router_bias: None, biases: None, experts, used: moe.used, norm_topk: moe.norm_topk })
}

/// gpt-oss's sparse feed-forward of layer `l`, with its biases. GGUF (llama.cpp's names): router
/// `blk.{l}.ffn_gate_inp` `[E, H]` + bias `[E]`, experts `blk.{l}.ffn_{gate,up}_exps` `[E, Fe, H]` + biases
/// `[E, Fe]`, `blk.{l}.ffn_down_exps` `[E, H, Fe]` + bias `[E, H]`. transformers: router `mlp.router` `[E, H]` +
/// bias `[E]`; `mlp.experts.gate_up_proj` `[E, H, 2·Fe]` (input-major: `x · W`, gate in the even columns, up in the
/// odd) + `gate_up_proj_bias` `[E, 2·Fe]`, `mlp.experts.down_proj` `[E, Fe, H]` + `down_proj_bias` `[E, H]`: the
/// experts are split and transposed to `[out, in]` at load time, as f32 (a float checkpoint's values exactly).
pub fn load_biased(ld: &Loader, cfg: &ModelConfig, moe: &MoeConfig, l: usize) -> Result<MoeMlp, ModelError> {
    let (h, f, e) = (cfg.hidden, moe.ffn, moe.experts);
    let vec = |name: &str, n: usize| -> Result<Weight, ModelError> {
        let v = ld.f32_values(name, &[n])?;
        ld.upload_f32(name, &[n], v)
    };
    // Per-expert rows `[E, n]` of a bias tensor, each uploaded as `[n]`.
    let rows = |name: &str, n: usize| -> Result<Vec<Weight>, ModelError> {
        let v = ld.f32_values(name, &[e, n])?;
        v.chunks_exact(n.max(1))
            .enumerate()
            .map(|(x, r)| ld.upload_f32(&format!("{name}[{x}]"), &[n], r.to_vec()))
            .collect()
    };
    match cfg.format {
        ConfigFormat::Gguf => {
            let base = format!("blk.{l}");
            let mut m = load(ld, cfg, moe, l)?;
            m.router_bias = Some(vec(&format!("{base}.ffn_gate_inp.bias"), e)?);
            let gate = rows(&format!("{base}.ffn_gate_exps.bias"), f)?; // E × [Fe]
            let up = rows(&format!("{base}.ffn_up_exps.bias"), f)?; // E × [Fe]
            let down = rows(&format!("{base}.ffn_down_exps.bias"), h)?; // E × [H]
            m.biases = Some(gate.into_iter().zip(up).zip(down).map(|((g, u), d)| [g, u, d]).collect());
            Ok(m)
        }
        ConfigFormat::HfConfig => {
            let base = ld.hf_name(&format!("model.layers.{l}.mlp"));
            let router = ld.matrix_named(&format!("{base}.router.weight"), [e, h])?; // [E, H]
            let router_bias = vec(&format!("{base}.router.bias"), e)?; // [E]
            let gu_name = format!("{base}.experts.gate_up_proj");
            if ld.has_hf(&format!("model.layers.{l}.mlp.experts.gate_up_proj_blocks")) {
                // openai/gpt-oss-* ship their experts as MXFP4 blocks and scales.
                return Err(ModelError(format!("{gu_name}_blocks: MXFP4 experts in safetensors are not supported")));
            }
            let gu = ld.f32_values(&gu_name, &[e, h, 2 * f])?; // [E, H, 2·Fe]
            let gub = ld.f32_values(&format!("{gu_name}_bias"), &[e, 2 * f])?; // [E, 2·Fe]
            let down_name = format!("{base}.experts.down_proj");
            let dn = ld.f32_values(&down_name, &[e, f, h])?; // [E, Fe, H]
            let dnb = ld.f32_values(&format!("{down_name}_bias"), &[e, h])?; // [E, H]
            let mut experts = Vec::with_capacity(e);
            let mut biases = Vec::with_capacity(e);
            for x in 0..e {
                let w = &gu[x * h * 2 * f..(x + 1) * h * 2 * f]; // [H, 2·Fe]
                                                                 // Column 2j (gate) / 2j + 1 (up) of `w` is row j of the [Fe, H] matrix.
                let split = |odd: usize| -> Vec<f32> {
                    (0..f).flat_map(|j| (0..h).map(move |k| w[k * 2 * f + 2 * j + odd])).collect()
                };
                let d = &dn[x * f * h..(x + 1) * f * h]; // [Fe, H]
                let down_t: Vec<f32> = (0..h).flat_map(|k| (0..f).map(move |j| d[j * h + k])).collect(); // [H, Fe]
                let b = &gub[x * 2 * f..(x + 1) * 2 * f]; // [2·Fe]
                let (gb, ub): (Vec<f32>, Vec<f32>) = b.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
                let up = |n: &str, shape: &[usize], v| ld.upload_f32(&format!("{n}[{x}]"), shape, v);
                experts.push(GluMlp {
                    gate: up(&format!("{gu_name}.gate"), &[f, h], split(0))?,
                    up: up(&format!("{gu_name}.up"), &[f, h], split(1))?,
                    down: up(&down_name, &[h, f], down_t)?,
                });
                biases.push([
                    up(&format!("{gu_name}_bias.gate"), &[f], gb)?,
                    up(&format!("{gu_name}_bias.up"), &[f], ub)?,
                    up(&format!("{down_name}_bias"), &[h], dnb[x * h..(x + 1) * h].to_vec())?,
                ]);
            }
            Ok(MoeMlp {
                router,
                router_bias: Some(router_bias),
                biases: Some(biases),
                experts,
                used: moe.used,
                norm_topk: moe.norm_topk,
            })
        }
    }
}

/// The experts one row goes through and their weights, from its router logits `[E]`: the `k` highest
/// probabilities (ties to the lower expert id), as `(expert, weight)` in ascending expert id. The softmax is taken
/// in f64 over all experts; with `norm` the chosen probabilities are divided by their sum. Computed from this row
/// alone.
pub fn route(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let p: Vec<f64> = logits.iter().map(|&x| (x as f64 - max).exp()).collect();
    let total: f64 = p.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Highest first; equal logits keep the lower id first (a stable sort on a total order of the values).
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut chosen: Vec<usize> = order.into_iter().take(k).collect();
    chosen.sort_unstable();
    let denom = if norm { chosen.iter().map(|&e| p[e]).sum::<f64>() } else { total };
    chosen.into_iter().map(|e| (e, (p[e] / denom) as f32)).collect()
}

/// The sparse feed-forward block with its residual connection: `x += Σ_e w_e · expert_e(rms_norm(x, norm))` over
/// each row's chosen experts, for `x [R, H]`, `norm [H]`.
pub fn moe_mlp_residual(
    be: &dyn Backend,
    x: &mut Tensor,
    norm: &tf_core::Weight,
    eps: f32,
    w: &MoeMlp,
    act: GluAct,
    layer: usize,
) {
    let h = be.rms_norm(x, norm, x.cols, eps); // [R, H]
    trace("ffn_norm", layer, &h);
    let logits = be.matmul(&h, &w.router, w.router_bias.as_ref()); // [R, E]
    trace("ffn_moe_logits", layer, &logits);
    let n_exp = w.experts.len();
    let host = be.to_host(&logits);
    // Per expert, the rows that chose it (ascending) and their weights.
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); n_exp];
    let mut scales: Vec<Vec<f32>> = vec![Vec::new(); n_exp];
    for (r, lg) in host.chunks_exact(n_exp).enumerate() {
        for (e, wt) in route(lg, w.used, w.norm_topk) {
            rows[e].push(r);
            scales[e].push(wt);
        }
    }
    for (e, expert) in w.experts.iter().enumerate() {
        if rows[e].is_empty() {
            continue;
        }
        let xs = be.select_rows(&h, &rows[e]); // [n_e, H]
        let y = match w.biases.as_ref().map(|b| &b[e]) {
            None => {
                let a = be.matmul_glu(&xs, &expert.gate, &expert.up, act); // [n_e, Fe]
                be.matmul(&a, &expert.down, None) // [n_e, H]
            }
            Some([gb, ub, db]) => {
                let gu = be.matmul_many(&xs, &[(&expert.gate, Some(gb)), (&expert.up, Some(ub))]);
                let a = be.glu(&gu[0], &gu[1], act); // [n_e, Fe]
                be.matmul(&a, &expert.down, Some(db)) // [n_e, H]
            }
        };
        be.add_rows_scaled(x, &y, &rows[e], &scales[e]);
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_takes_the_highest_ties_to_the_lower_id_in_id_order() {
        let r = route(&[0.5, 2.0, -1.0, 2.0, 1.0], 2, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!(r.iter().all(|x| (x.1 - 0.5).abs() < 1e-7), "{r:?}");
        let r = route(&[3.0, 3.0, 3.0, 3.0], 3, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(r.iter().all(|x| (x.1 - 0.25).abs() < 1e-7), "{r:?}");
        let r = route(&[-4.0, 9.0, 0.0], 1, true);
        assert_eq!(r, vec![(1, 1.0)]);
    }
}
