//! RoPE (docs/arithmetic.md "RoPE"). cos/sin tables come from `tf_quant::reference::ops::rope_cos_sin_scaled` (f64,
//! rounded to f32 once) and are cached per set of RoPE parameters for positions below a bound that grows by
//! powers of two up to [`TABLE_MAX`]; positions past it are computed on the fly by the same function, so cached
//! and uncached rows have the same bits. The rotation itself is the reference's `rope_rotate_head` (elementwise:
//! `y0 = x0*c - x1*s`, `y1 = x0*s + x1*c`, the same bits at any vector width), run over rows by the pool.

use crate::for_rows;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tf_core::{Rope, RopeScaling, Tensor};
use tf_quant::reference::ops::{rope_cos_sin_scaled, rope_freqs, rope_mscale, rope_rotate_head};

/// Positions covered by a cached table at most (128 Ki positions; beyond, rows are computed per call).
pub(crate) const TABLE_MAX: usize = 1 << 17;

/// The cached cos/sin of positions `0..len`: `cos`, `sin` are `[len, rot_dims / 2]`.
struct Table {
    len: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Everything the table depends on, as bits: theta, rot_dims, the scaling variant and its parameters
/// (`Rope::style` only matters to the rotation).
type Key = (u64, usize, u8, [u64; 6]);

fn key(rope: &Rope) -> Key {
    let (tag, params) = match rope.scaling {
        RopeScaling::None => (0, [0; 6]),
        RopeScaling::Linear { factor } => (1, [factor.to_bits(), 0, 0, 0, 0, 0]),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
            let l = [factor, low_freq_factor, high_freq_factor, original_context];
            (2, [l[0].to_bits(), l[1].to_bits(), l[2].to_bits(), l[3].to_bits(), 0, 0])
        }
        RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, truncate, mscale } => {
            let y = [factor, original_context, beta_fast, beta_slow, mscale];
            (3, [y[0].to_bits(), y[1].to_bits(), y[2].to_bits(), y[3].to_bits(), y[4].to_bits(), truncate as u64])
        }
    };
    (rope.theta.to_bits(), rope.rot_dims, tag, params)
}

/// The frequencies of one set of parameters and its current table.
type Entry = (Arc<Vec<f64>>, Arc<Table>);

/// RoPE tables by parameters.
#[derive(Default)]
pub(crate) struct RopeCache {
    tables: Mutex<HashMap<Key, Entry>>,
}

impl RopeCache {
    /// The frequencies and a table covering `max_pos` when it is below [`TABLE_MAX`].
    fn get(&self, pool: &crate::Pool, rope: &Rope, max_pos: usize) -> (Arc<Vec<f64>>, Arc<Table>) {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let entry = tables.entry(key(rope)).or_insert_with(|| {
            (Arc::new(rope_freqs(rope)), Arc::new(Table { len: 0, cos: Vec::new(), sin: Vec::new() }))
        });
        let want = (max_pos + 1).min(TABLE_MAX);
        if entry.1.len < want {
            let len = want.next_power_of_two().clamp(256, TABLE_MAX);
            let half = rope.rot_dims / 2;
            let freqs = entry.0.clone();
            let mscale = rope_mscale(rope);
            let (mut cos, mut sin) = (vec![0f32; len * half], vec![0f32; len * half]);
            // Fill cos and sin rows together: `[len, 2·half]` scratch, split after.
            let mut both = vec![0f32; len * 2 * half];
            for_rows(pool, &mut both, 2 * half, |p, row| {
                let (c, s) = row.split_at_mut(half);
                rope_cos_sin_scaled(&freqs, mscale, p as u32, c, s);
            });
            for (p, row) in both.chunks_exact(2 * half).enumerate() {
                cos[p * half..(p + 1) * half].copy_from_slice(&row[..half]);
                sin[p * half..(p + 1) * half].copy_from_slice(&row[half..]);
            }
            entry.1 = Arc::new(Table { len, cos, sin });
        }
        (entry.0.clone(), entry.1.clone())
    }
}

/// Rotates every `head_dim` group of every row of `x [R, heads·head_dim]` in place, row `r` at `positions[r]`.
pub(crate) fn rope(
    pool: &crate::Pool,
    cache: &RopeCache,
    x: &mut Tensor,
    positions: &[u32],
    head_dim: usize,
    rope: &Rope,
) {
    assert_eq!(positions.len(), x.rows, "rope: {} positions for {} rows", positions.len(), x.rows);
    assert!(
        head_dim > 0 && x.cols.is_multiple_of(head_dim),
        "rope: cols {} not a multiple of head_dim {head_dim}",
        x.cols
    );
    assert!(rope.rot_dims <= head_dim, "rope: rot_dims {} > head_dim {head_dim}", rope.rot_dims);
    assert!(
        rope.rot_dims.is_multiple_of(2) && rope.rot_dims > 0,
        "rope: rot_dims {} must be even and > 0",
        rope.rot_dims
    );
    if x.rows == 0 {
        return;
    }
    let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
    let (freqs, table) = cache.get(pool, rope, max_pos);
    let half = rope.rot_dims / 2;
    let mscale = rope_mscale(rope);
    let cols = x.cols;
    for_rows(pool, &mut x.host, cols, |r, row| {
        let p = positions[r] as usize;
        let (mut cos_own, mut sin_own) = (Vec::new(), Vec::new());
        let (cos, sin) = if p < table.len {
            (&table.cos[p * half..(p + 1) * half], &table.sin[p * half..(p + 1) * half])
        } else {
            cos_own.resize(half, 0.0);
            sin_own.resize(half, 0.0);
            rope_cos_sin_scaled(&freqs, mscale, p as u32, &mut cos_own, &mut sin_own);
            (&cos_own[..], &sin_own[..])
        };
        for head in row.chunks_exact_mut(head_dim) {
            rope_rotate_head(head, cos, sin, rope.style);
        }
    });
}
