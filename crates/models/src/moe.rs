//! The mixture-of-experts feed-forward, a shared layer (Qwen3-MoE, Mixtral): its weights in both formats, the
//! router's choice, and the combine.
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
        self.router.nbytes() + self.experts.iter().map(GluMlp::nbytes).sum::<u64>()
    }

    /// Bytes one token reads: the router and `used` experts.
    pub fn bytes_per_token(&self) -> u64 {
        let one = self.experts.first().map_or(0, GluMlp::nbytes);
        weight_bytes([Some(&self.router)]) + one * self.used as u64
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
    Ok(MoeMlp { router, experts, used: moe.used, norm_topk: moe.norm_topk })
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
    let logits = be.matmul(&h, &w.router, None); // [R, E]
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
        let a = be.matmul_glu(&xs, &expert.gate, &expert.up, act); // [n_e, Fe]
        let y = be.matmul(&a, &expert.down, None); // [n_e, H]
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
