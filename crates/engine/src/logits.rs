//! The logits of one forward as the engine receives them: every value (downloaded), or, when every row's draw is
//! a plain greedy argmax, only each row's token, computed by the backend where the logits are
//! ([`tf_core::Backend::argmax_rows`]): a 16-row window of a 152k vocabulary is 9.7 MB of floats but 64 bytes of
//! ids. The ids are [`tf_core::argmax_row`] of the rows, which is the sampler's greedy draw when
//! [`greedy_on_device`] holds, so the emitted tokens are the same either way.

use crate::generate::{EngineError, GenRequest};
use crate::sampler::{penalized, sample, sample_token, top_logprobs, SamplingParams};
use tf_core::{Backend, Tensor};

/// Whether a row of `req` drawn after `reply` (the stream's generated tokens before it) may take its token from
/// [`tf_core::Backend::argmax_rows`] instead of the downloaded logits: the request is greedy (temperature ≤ 0),
/// reports no logprob (`!logprobs`) and no alternatives (`top_logprobs == 0`), sets no `logit_bias`, and no
/// penalty can change the values (none set, or `reply` empty: penalties act on the reply's tokens only), and no
/// grammar masks the row. Then
/// the sampler's draw is exactly `tf_core::argmax_row` of the raw logits. Consumers of the values themselves
/// (prompt logprobs, the drafting self-check) always download.
pub fn greedy_on_device(req: &GenRequest, reply: &[u32]) -> bool {
    !req.logprobs && req.top_logprobs == 0 && req.constraint.is_none() && draw_is_argmax(&req.params, reply)
}

/// Whether the draw with `params` after `reply` is `tf_core::argmax_row` of the raw logits (the token alone;
/// [`greedy_on_device`] also asks that nothing else of the row is reported).
pub(crate) fn draw_is_argmax(params: &SamplingParams, reply: &[u32]) -> bool {
    params.is_greedy() && params.logit_bias.is_empty() && (reply.is_empty() || !params.has_penalty())
}

/// Whether every row of a window qualifies ([`greedy_on_device`]): row 0 is drawn after `reply`; with `drafted`
/// rows, each of them after `reply` and the drafts on its path, a reply that is never empty. ([`greedy_on_device`]
/// depends on a reply only through whether it is empty, so any non-empty one stands for them.)
pub(crate) fn window_on_device(req: &GenRequest, reply: &[u32], drafted: bool) -> bool {
    greedy_on_device(req, reply) && (!drafted || greedy_on_device(req, &[0]))
}

/// The logits rows of one forward.
pub(crate) enum Logits {
    /// Every value, row-major `[rows, vocab]`.
    Values { data: Vec<f32>, vocab: usize },
    /// Each row's [`tf_core::argmax_row`], from the backend.
    Argmax(Vec<u32>),
}

/// One row of [`Logits`].
#[derive(Clone, Copy)]
pub(crate) enum Row<'a> {
    Values(&'a [f32]),
    Argmax(u32),
}

impl Logits {
    pub(crate) fn row(&self, i: usize) -> Row<'_> {
        match self {
            Logits::Values { data, vocab } => Row::Values(&data[i * vocab..(i + 1) * vocab]),
            Logits::Argmax(ids) => Row::Argmax(ids[i]),
        }
    }

    /// The values, for a caller that asked for them (a programming error otherwise).
    pub(crate) fn into_values(self) -> Vec<f32> {
        match self {
            Logits::Values { data, .. } => data,
            Logits::Argmax(_) => panic!("logits values asked of a forward that fetched only argmaxes"),
        }
    }
}

/// Brings the logits `out` of a forward (`want` rows of `vocab`) to the host: each row's argmax when `argmax`,
/// else every value. Checks the shape the model returned and what the backend gave back.
pub(crate) fn fetch(
    be: &dyn Backend,
    out: &Tensor,
    want: usize,
    vocab: usize,
    argmax: bool,
) -> Result<Logits, EngineError> {
    if out.rows != want || out.cols != vocab {
        return Err(EngineError::Model(format!("logits are {}×{}, expected {want}×{vocab}", out.rows, out.cols)));
    }
    if argmax {
        let ids = if want == 0 { Vec::new() } else { be.argmax_rows(out) };
        if ids.len() != want || ids.iter().any(|&t| t as usize >= vocab) {
            return Err(EngineError::Model(format!("the backend's argmax gave {ids:?} for {want} rows of {vocab}")));
        }
        return Ok(Logits::Argmax(ids));
    }
    let data = be.to_host(out);
    if data.len() != want * vocab {
        return Err(EngineError::Model(format!("logits hold {} values, expected {}", data.len(), want * vocab)));
    }
    Ok(Logits::Values { data, vocab })
}

/// The keyed draw of one row (DESIGN.md §3) after `reply`: (token, its logprob when the request wants it, the
/// request's `top_logprobs` alternatives). An argmax row is the token itself; it must only come where
/// [`greedy_on_device`] holds (checked: anything else would be a different token, or a missing logprob).
/// With a grammar's `mask` (bit `t % 32` of word `t / 32`: token `t` allowed), disallowed ids are removed before
/// the draw (their logits become −∞): the keyed noise of every other id is unchanged (DESIGN.md §8).
pub(crate) fn draw_row(
    req: &GenRequest,
    row: Row<'_>,
    seed: u64,
    position: usize,
    reply: &[u32],
    mask: Option<&[u32]>,
) -> (u32, Option<f64>, Vec<(u32, f64)>) {
    let unmasked = match row {
        Row::Argmax(token) => {
            assert!(greedy_on_device(req, reply) && mask.is_none(), "an argmax row for a draw that needs the logits");
            return (token, None, Vec::new());
        }
        Row::Values(l) => l,
    };
    let masked;
    let logits = match mask {
        None => unmasked,
        Some(m) => {
            masked = apply_mask(unmasked, m);
            &masked[..]
        }
    };
    let (token, logprob) = if req.logprobs {
        let d = sample(logits, &req.params, seed, position as u64, reply);
        (d.token, Some(d.logprob))
    } else {
        (sample_token(logits, &req.params, seed, position as u64, reply), None)
    };
    let top = if req.top_logprobs > 0 {
        top_logprobs(&penalized(logits, &req.params, reply), req.top_logprobs)
    } else {
        Vec::new()
    };
    (token, logprob, top)
}

/// `logits` with every id the mask does not allow set to −∞.
pub(crate) fn apply_mask(logits: &[f32], mask: &[u32]) -> Vec<f32> {
    logits
        .iter()
        .enumerate()
        .map(|(t, &v)| if tf_core::mask_allows(mask, t as u32) { v } else { f32::NEG_INFINITY })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(params: SamplingParams, logprobs: bool, top: usize) -> GenRequest {
        let mut r = GenRequest::new(vec![1, 2], params, 4);
        r.logprobs = logprobs;
        r.top_logprobs = top;
        r
    }

    #[test]
    fn greedy_on_device_only_when_the_draw_is_the_plain_argmax() {
        let g = SamplingParams::greedy();
        let pen = SamplingParams { repetition_penalty: 1.2, ..SamplingParams::greedy() };
        let pres = SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy() };
        assert!(greedy_on_device(&req(g.clone(), false, 0), &[]));
        assert!(greedy_on_device(&req(g.clone(), false, 0), &[3, 3]));
        assert!(!greedy_on_device(&req(g.clone(), true, 0), &[]), "a logprob needs the values");
        assert!(!greedy_on_device(&req(g.clone(), false, 2), &[]), "alternatives need the values");
        assert!(!greedy_on_device(&req(SamplingParams::default(), false, 0), &[]), "sampled");
        assert!(greedy_on_device(&req(pen.clone(), false, 0), &[]), "no reply yet: nothing to penalize");
        assert!(!greedy_on_device(&req(pen.clone(), false, 0), &[3]));
        assert!(!greedy_on_device(&req(pres, false, 0), &[3]));
        assert!(window_on_device(&req(g.clone(), false, 0), &[], true));
        assert!(window_on_device(&req(pen.clone(), false, 0), &[], false));
        assert!(!window_on_device(&req(pen, false, 0), &[], true), "drafted rows follow a draft");
    }
}
