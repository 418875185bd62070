//! Attention over the paged KV cache (kernels/attention.cu): the chunk kernel, then the in-order merge when a row
//! visits more than one chunk.

use super::{cuda_kv, CudaBackend, CudaTensor};
use crate::geometry::{attn_chunks, attn_heads_per_block, ATTN_KERNELS, ATTN_THREADS, MAX_HEAD_DIM};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tf_core::{AttnMeta, AttnParams, KvCache, Tensor};

impl CudaBackend {
    /// [`tf_core::Backend::attention`].
    pub(super) fn attention_impl(
        &self,
        q: &Tensor,
        kv: &KvCache,
        layer: usize,
        meta: &AttnMeta,
        p: &AttnParams,
    ) -> Tensor {
        let store = cuda_kv(kv);
        let spec = store.spec;
        p.check(q, meta, spec.kv_heads, spec.head_dim);
        assert!(
            p.head_dim <= MAX_HEAD_DIM && p.head_dim.is_multiple_of(16),
            "attention: head_dim {} is not a multiple of 16 up to {MAX_HEAD_DIM}",
            p.head_dim
        );
        assert!(layer < spec.layers, "attention: layer {layer} of {}", spec.layers);
        let out = self.alloc_f32(q.rows * q.cols);
        if q.rows == 0 || p.heads == 0 {
            return self.tensor(q.rows, q.cols, out);
        }
        let (bufs, chunks_b, cmax) = {
            // The rows whose K the kernel may load before its wait depend on the store's writes in flight.
            let writes = store.writes.lock().unwrap_or_else(|e| e.into_inner());
            let done = self.gpu.waits_done();
            let wkey = writes.key(done);
            let key = (store.k.ptr, wkey.0, wkey.1);
            let mut up = self.uploads();
            let bufs = match &up.attn {
                Some((m, sp, k, b)) if m == meta && *sp == spec && *k == key => b.clone(),
                _ => {
                    let clean = writes.clean_bounds(done, meta, spec.block_size);
                    let b = Arc::new(self.attn_bufs(meta, spec, &clean));
                    up.attn = Some((meta.clone(), spec, key, b.clone()));
                    up.chunks.clear();
                    b
                }
            };
            // The chunks each row visits (kernels/attention.cu), uploaded once per metadata and window. With sinks the
            // list is at least two wide, so the chunk kernel leaves partials and the merge adds the sinks.
            if p.sinks.is_some() {
                let (chunks, cmax) = attn_chunks(&meta.rows, p.window);
                let wide = cmax.max(2);
                let mut padded = vec![-1i32; meta.rows.len() * wide];
                for (r, c) in chunks.chunks_exact(cmax).enumerate() {
                    padded[r * wide..r * wide + cmax].copy_from_slice(c);
                }
                (bufs, Arc::new(self.upload_or_panic(bytemuck::cast_slice(&padded))), wide)
            } else {
                match up.chunks.iter().find(|c| c.0 == p.window) {
                    Some((_, b, cmax)) => (bufs, b.clone(), *cmax),
                    None => {
                        let (chunks, cmax) = attn_chunks(&meta.rows, p.window);
                        let b = Arc::new(self.upload_or_panic(bytemuck::cast_slice(&chunks)));
                        up.chunks.push((p.window, b.clone(), cmax));
                        (bufs, b, cmax)
                    }
                }
            }
        };
        // Sink logits [heads] (an address of 0 without them).
        let sinks = p.sinks.as_ref().map(|s| self.upload_or_panic(bytemuck::cast_slice(s)));
        let qs = self.input(q);
        let qb = &qs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let off = (layer * store.layer_len() * 4) as u64;
        let window = p.window.map_or(-1, |w| i32::try_from(w).unwrap_or(i32::MAX));
        // Chunks in parallel, then merged in order (kernels/attention.cu); with one chunk per row the chunk kernel
        // writes the output itself. part [R, heads, cmax, head_dim + 2]: m_c, l_c, o_c of every chunk.
        let part =
            if cmax > 1 { self.alloc_f32(q.rows * p.heads * cmax * (p.head_dim + 2)) } else { self.alloc_f32(0) };
        // S query heads of one KV group per block share its K/V loads when there are blocks enough to fill the GPU
        // (`CudaTuning::attn_heads` 1..=7 caps it); every head's arithmetic is the same either way.
        let sb = attn_heads_per_block(p.heads, p.kv_heads, q.rows * cmax, self.tune.attn_heads.load(Ordering::Relaxed));
        // One head per block: ATTN_VSPLIT blocks per head, each with a slice of the V dimensions.
        let vsplit = if sb == 1 { self.gpu.attn_vsplit } else { 1 };
        self.gpu
            .launch(ATTN_KERNELS[sb - 1])
            .pdl()
            .ptr(qb)
            .addr(store.k.ptr + off)
            .addr(store.v.ptr + off)
            .ptr(&bufs.rows)
            .ptr(&bufs.bt)
            .ptr(&bufs.bt_off)
            .ptr(&bufs.tree)
            .ptr(&chunks_b)
            .i32(cmax)
            .i32(p.heads)
            .i32(p.kv_heads)
            .i32(p.head_dim)
            .i32(spec.block_size)
            .f32(p.scale)
            .int(window)
            .int(i32::from(p.softcap.is_some()))
            .f32(p.softcap.unwrap_or(0.0))
            .ptr(&part)
            .ptr(&out)
            .go(((p.heads / sb * vsplit) as u32, q.rows as u32, cmax as u32), (ATTN_THREADS, sb as u32, 1));
        if cmax > 1 {
            self.gpu
                .launch("attention_merge")
                .pdl()
                .ptr(&part)
                .ptr(&chunks_b)
                .i32(cmax)
                .i32(p.heads)
                .i32(p.head_dim)
                .addr(sinks.as_ref().map_or(0, |b| b.ptr))
                .ptr(&out)
                .go((p.heads as u32, q.rows as u32, 1), (ATTN_THREADS, 1, 1));
        }
        self.tensor(q.rows, q.cols, out)
    }
}
