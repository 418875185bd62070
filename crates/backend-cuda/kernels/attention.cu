// Attention over the paged KV cache, bit-equal to reference::ops::attention_head: per chunk of 256 absolute
// positions, scores s = dot16(q, k) * scale (softcap: cap * tanh(s / cap)), m_c = max s, e = exp(s - m_c),
// l_c = Σ e in visit order, o_c[d] = fma(e, v[d], o_c[d]) in visit order; chunks merged in increasing order.
//
// Chunks are fixed by absolute position, so they are computed in parallel (`attention_chunk_s<S>`, one block per
// (S heads of one KV group, row, chunk)) and merged in order by `attention_merge`: the same operations as one
// sequential pass. When every row visits one chunk (cmax = 1: decode up to 256 positions), attention_chunk_s
// writes o_c / l_c itself.

#define ATTN_CHUNK 256
#define MAX_HEAD_DIM 256
#define ATTN_THREADS 128
#define ATTN_VSTAGE 32
#define ATTN_SPS 2
// Visits each quad of the decode scoring (one head per block) scores per pass, their loads issued together (4: 1–1.6%
// faster than 2 on the H200). The same bits at any value.
#define ATTN_QV 4
// ATTN_VSPLIT (2 by default; 1, 2 or 4): one head per block (decode) splits each head's V pass over this many
// blocks, each taking hd / ATTN_VSPLIT of the dimensions (every one scores all visits: the same scores, maxima and
// l_c, so the slices' o_c are the one-block values). On the H200, 2 is 1% faster than 1 on the 1.5B, 7B and 8B
// shapes (4: the V pass 3.3 → 1.9 µs per 7B layer, but four blocks scoring each head's K delay the scoring).
// The host reads it for the grid (geometry::attn_vsplit, whose default must be this one: tests/compile.rs).
#ifndef ATTN_VSPLIT
#define ATTN_VSPLIT 2
#endif
// Early K loads: with PRE_WAIT, the one-head scoring (decode) loads its first
// pass's K rows into registers before griddep_wait, for the visits whose position is below the row's `clean` bound
// (rows[5]: every prefix position below it was written by a kernel that completed before the host's last
// synchronizing download, src/kv_writes.rs), so no kernel still running can be writing them; the others load after
// the wait. The same loads into the same registers and the same fmas as loading after the wait: the same bits. On
// the H200 the first pass is 0.8 µs shorter per layer (7B and 1.5B).

// Per row: pos, seq, ctx, tree_off, tree_len, clean (6 i32; clean: see the early K loads above). bt: flattened block tables,
// bt_off[seq] their starts.
// tree: (position, slot) pairs. chunks [R, cmax]: the absolute chunk ids each row visits, increasing, -1 after
// the last. window < 0: no sliding window. has_cap: soft-capping by softcap. k, v: this layer's
// [slots, kv_heads, hd]. part [R, heads, cmax, hd + 2]: per chunk m_c, l_c, o_c[hd].
// grid (heads / S · VS, R, cmax), (ATTN_THREADS, S) threads (VS = ATTN_VSPLIT when S = 1, else 1; block x of
// head h takes V dimensions [x % VS · hd / VS, + hd / VS)): S query heads of one KV group per block (S divides the
// group), each on its own ATTN_THREADS threads (threadIdx.y = the head within the block), so the K rows they
// score and the V stages they consume are loaded once per block (K through L1, V into shared memory) instead of
// once per head. Per head everything is as with S = 1: half-warps score the chunk's visits (lane j of a half-warp
// holds dot16's lane j, then the fixed tree), and thread t owns output dimensions 2t, 2t + 1.
template <int S>
__device__ void attention_chunk_s(const float* q, const float* k, const float* v, const i32* rows, const u32* bt,
                                  const i32* bt_off, const u32* tree, const i32* chunks, int cmax, int heads,
                                  int kv_heads, int hd, int block_size, float scale_, int window, int has_cap,
                                  float softcap, float* part, float* out) {
    // float4 loads per thread for one V stage.
    constexpr int PF = (ATTN_VSTAGE * MAX_HEAD_DIM / 4 + ATTN_THREADS * S - 1) / (ATTN_THREADS * S);
    constexpr int T = ATTN_THREADS * S;
    constexpr int VS = S == 1 ? ATTN_VSPLIT : 1;
    __shared__ __align__(16) float qs_all[S][MAX_HEAD_DIM];  // read as float4 by the quad scoring
    __shared__ u32 slots[ATTN_CHUNK];
    __shared__ __align__(16) float sc_all[S][ATTN_CHUNK];  // read as float4 in the V loop
    __shared__ float red_all[S][ATTN_THREADS / 32];
    __shared__ float4 vs[ATTN_VSTAGE * MAX_HEAD_DIM / 4];
    griddep_launch();
    // Launched early (PDL): the row metadata, block tables and chunk lists are host uploads (each ordered after
    // every earlier kernel), so with PRE_WAIT they are read before griddep_wait; q, and everything written, after.
#if !PRE_WAIT
    griddep_wait();
#endif
    int sub = threadIdx.y, tid = threadIdx.x, ft = sub * ATTN_THREADS + tid;
    int h = blockIdx.x / VS * S + sub, r = blockIdx.y, c = blockIdx.z;
    int hdv = hd / VS, dbase = blockIdx.x % VS * hdv;  // this block's V dimensions [dbase, dbase + hdv)
    float* qs = qs_all[sub];
    float* sc = sc_all[sub];
    float* red = red_all[sub];
    i64 cid = chunks[(i64)r * cmax + c];
    if (cid < 0) {
#if PRE_WAIT
        griddep_wait();
#endif
        // One chunk per row (no merge launched): a row without visits gets zeros, as attention_merge writes.
        if (cmax == 1) {
            float* outh = out + ((i64)r * heads + h) * hd;
            for (int d = dbase + tid; d < dbase + hdv; d += ATTN_THREADS) outh[d] = 0.0f;
        }
        return;
    }
    int kvh = h / (heads / kv_heads);
    const i32* row = rows + 6 * r;
    i64 pos = row[0];
    int seq = row[1];
    i64 ctx = row[2];
    const u32* tr = tree + 2 * row[3];
    int tlen = row[4];
    const u32* table = bt + bt_off[seq];
    const float* qh = q + ((i64)r * heads + h) * hd;
    // Prefix positions p >= lo are inside the window ((pos - p) < window).
    i64 lo = 0;
    if (window >= 0) {
        i64 l = pos - (i64)window + 1;
        lo = l > 0 ? l : 0;
    }
    i64 cbeg = cid * ATTN_CHUNK, cend = cbeg + ATTN_CHUNK;
    // The chunk's visits: its prefix positions, then its tree entries inside the window.
    i64 pbeg = lo > cbeg ? lo : cbeg;
    i64 pend = ctx < cend ? ctx : cend;
    int np = pbeg < pend ? (int)(pend - pbeg) : 0;
    i64 stride_slot = (i64)kv_heads * hd;
    const float* kh = k + (i64)kvh * hd;
    const float* vh = v + (i64)kvh * hd + dbase;
    for (int i = ft; i < np; i += T) {
        i64 p = pbeg + i;
        u32 pu = (u32)p, bs = (u32)block_size;  // positions are u32: 32-bit division
        u32 slot = table[pu / bs] * bs + pu % bs;
        slots[i] = slot;
#if PRE_WAIT
        // Ask L2 for the visit's K and V rows (prefetches read nothing into registers: safe before the wait).
        for (int l = 0; l < hd; l += 32) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(kh + (i64)slot * stride_slot + l));
            if (VS == 1 || l < hdv) asm volatile("prefetch.global.L2 [%0];" ::"l"(vh + (i64)slot * stride_slot + l));
        }
#endif
    }
    // The one-head scoring's K operands (below), declared here so that its first pass can be loaded before the
    // wait: bit u of `early` says visit quad + u · 32 of that pass (its first 8 steps of 16) is already in kk[u].
    float4 kk[ATTN_QV][8];
    unsigned early = 0;
#if PRE_WAIT
    if (S == 1) {
        i64 clean = row[5];
        int e = tid & 3, quad = tid >> 2, steps = hd / 16;
#pragma unroll
        for (int u = 0; u < ATTN_QV; u++) {
            int vi = quad + u * (ATTN_THREADS / 4);
            i64 p = pbeg + vi;
            if (vi < np && p < clean) {
                u32 pu = (u32)p, bs = (u32)block_size;
                const float* kr = kh + (i64)(table[pu / bs] * bs + pu % bs) * stride_slot + 4 * e;
#pragma unroll
                for (int m = 0; m < 8; m++)
                    if (m < steps) kk[u][m] = *(const float4*)(kr + 16 * m);
                early |= 1u << u;
            }
        }
    }
#endif
    int n = np;
    for (int ti = 0; ti < tlen; ti++) {
        i64 p = tr[2 * ti];
        if (p >= cbeg && p < cend && (window < 0 || (pos - p) < (i64)window)) {
            if (ft == 0) slots[n] = tr[2 * ti + 1];
            n++;
        }
    }
#if PRE_WAIT
    griddep_wait();
#endif
    for (int i = tid; i < hd; i += ATTN_THREADS) qs[i] = qh[i];
    __syncthreads();
    // Scores (the same bits either way).
    if (S == 1) {
        // One query head per block (decode), four threads per visit: thread e of a quad holds dot16's lanes 4e..4e+3
        // (elements 16m + 4e + u, u < 4, increasing m), so each float4 load of a warp reads 8 rows × 64 contiguous
        // bytes (one thread per visit, reading 32 rows per load, scored a 7B layer in ~5 µs whether the rows came
        // from DRAM, L2 or L1; this form's first visit takes 1.9 µs). Then tree16's additions across the quad by shuffles: lanes j + 8 into j (threads e + 2 into e), j + 4
        // into j (thread 1 into 0), then j + 2 and j + 1 in thread 0: the same fmas and the same additions as one
        // thread doing all 16 lanes. Each quad scores QV visits per pass, their loads issued together; pass bounds
        // are uniform across the block (the shuffles need every lane).
        constexpr int QV = ATTN_QV;
        int e = tid & 3, quad = tid >> 2;
        const int QUADS = ATTN_THREADS / 4;
        int steps = hd / 16;
        for (int v0 = 0; v0 < n; v0 += QUADS * QV) {
            float acc[QV][4];
            const float* kr[QV];
#pragma unroll
            for (int u = 0; u < QV; u++) {
#pragma unroll
                for (int l = 0; l < 4; l++) acc[u][l] = 0.0f;
                kr[u] = kh + (i64)slots[min(v0 + quad + u * QUADS, n - 1)] * stride_slot + 4 * e;
            }
            for (int m0 = 0; m0 < steps; m0 += 8) {
#pragma unroll
                for (int u = 0; u < QV; u++)
#pragma unroll
                    for (int m = 0; m < 8; m++)
                        if (m0 + m < steps && !(early >> u & 1)) kk[u][m] = *(const float4*)(kr[u] + 16 * (m0 + m));
                early = 0;  // only the first pass's first 8 steps were loaded early
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    if (m0 + m < steps) {
                        float4 qv = *(const float4*)(qs + 16 * (m0 + m) + 4 * e);
#pragma unroll
                        for (int u = 0; u < QV; u++) {
                            acc[u][0] = fmaf(qv.x, kk[u][m].x, acc[u][0]);
                            acc[u][1] = fmaf(qv.y, kk[u][m].y, acc[u][1]);
                            acc[u][2] = fmaf(qv.z, kk[u][m].z, acc[u][2]);
                            acc[u][3] = fmaf(qv.w, kk[u][m].w, acc[u][3]);
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < QV; u++) {
#pragma unroll
                for (int l = 0; l < 4; l++) acc[u][l] = acc[u][l] + __shfl_down_sync(FULL_MASK, acc[u][l], 2, 4);
#pragma unroll
                for (int l = 0; l < 4; l++) acc[u][l] = acc[u][l] + __shfl_down_sync(FULL_MASK, acc[u][l], 1, 4);
                int vi = v0 + quad + u * QUADS;
                if (e == 0 && vi < n) {
                    float sv = ((acc[u][0] + acc[u][2]) + (acc[u][1] + acc[u][3])) * scale_;
                    if (has_cap) sv = softcap * tf_tanh(sv / softcap);
                    sc[vi] = sv;
                }
            }
        }
    } else {
        // Several heads per block (windows, batches): a half-warp per visit, its lane j holding dot16's lane j
        // (elements j, j + 16, ... in increasing order), so each load step of a half-warp reads 16 consecutive
        // floats of one K row instead of every thread walking its own row (a cache wavefront per thread, which
        // bound the 16-row windows); the fixed tree (tree16) then gives lane 0 the canonical sum. The block's
        // heads share their KV head, so each half-warp of the whole block scores ATTN_SPS visits for every head:
        // its K values are loaded once for the S heads (each head's chain is the one it would be alone: the same
        // fmas in the same order). Loads 8 steps at a time, issued before the fmas; loop bounds are uniform per
        // warp (tree16 shuffles).
        int j = ft & 15, half = (ft >> 4) & 1, wid = ft >> 5;  // lane in the half-warp, half, warp of the block
        const int WARPS = T / 32;
        int steps = hd / 16;
        for (int wb = wid * 2 * ATTN_SPS; wb < n; wb += WARPS * 2 * ATTN_SPS) {
            int vb = wb + half * ATTN_SPS;
            float acc[S][ATTN_SPS];
            const float* kr[ATTN_SPS];
#pragma unroll
            for (int u = 0; u < ATTN_SPS; u++) {
#pragma unroll
                for (int s = 0; s < S; s++) acc[s][u] = 0.0f;
                kr[u] = kh + (i64)slots[min(vb + u, n - 1)] * stride_slot + j;
            }
            for (int m0 = 0; m0 < steps; m0 += 8) {
                float kv[ATTN_SPS][8];
#pragma unroll
                for (int u = 0; u < ATTN_SPS; u++)
#pragma unroll
                    for (int m = 0; m < 8; m++) kv[u][m] = m0 + m < steps ? kr[u][16 * (m0 + m)] : 0.0f;
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    if (m0 + m < steps) {
#pragma unroll
                        for (int s = 0; s < S; s++) {
                            float qv = qs_all[s][16 * (m0 + m) + j];
#pragma unroll
                            for (int u = 0; u < ATTN_SPS; u++) acc[s][u] = fmaf(qv, kv[u][m], acc[s][u]);
                        }
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < S; s++) {
#pragma unroll
                for (int u = 0; u < ATTN_SPS; u++) {
                    float sum = tree16(acc[s][u]);
                    if (j == 0 && vb + u < n) {
                        float sv = sum * scale_;
                        if (has_cap) sv = softcap * tf_tanh(sv / softcap);
                        sc_all[s][vb + u] = sv;
                    }
                }
            }
        }
    }
    __syncthreads();
    // m_c: max over the chunk (exact in any order; NaN never wins).
    float mc = __uint_as_float(0xff800000u);
    for (int i = tid; i < n; i += ATTN_THREADS) mc = fmaxf(mc, sc[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL_MASK, mc, off));
    if ((tid & 31) == 0) red[tid / 32] = mc;
    __syncthreads();
    mc = red[0];
#pragma unroll
    for (int w = 1; w < ATTN_THREADS / 32; w++) mc = fmaxf(mc, red[w]);
    for (int i = tid; i < n; i += ATTN_THREADS) sc[i] = tf_exp(sc[i] - mc);
    __syncthreads();
    // o_c[d] in visit order per dimension, V rows staged through shared memory (32 × 256 floats at a time, all
    // threads loading with float4). The next stage's loads are issued into registers before the current stage is
    // consumed, so they cross memory while the chains run. Thread tid < hdv / 2 owns dimensions 2·tid and 2·tid + 1
    // of the block's slice (one float2 per visit; hdv is a multiple of 4), reading 8 positions' e and V ahead of
    // their fmas (same fmas, same order); it also adds the e values it reads into l_c, in visit order (the same
    // additions in the same order as one thread summing them, which none then has to do alone).
    int d0 = 2 * tid;  // within the block's slice: dimension dbase + d0
    bool owns = d0 < hdv;
    float oc0 = 0.0f, oc1 = 0.0f;  // dimensions d0 and d0 + 1
    float lc = 0.0f;
    // Thread ft < vstep · per_row loads float4 column vcol of stage rows vrow + k · vstep, k < PF (the rest load
    // nothing); a stage is as many visits as fit in vs and in those PF rounds, a multiple of 8 (so that e is read
    // as aligned float4s).
    int per_row = hdv / 4;
    int vstep = T / per_row;
    int stage = min(ATTN_VSTAGE * MAX_HEAD_DIM / hdv, PF * vstep) & ~7;
    int vrow = ft < vstep * per_row ? ft / per_row : 1 << 28, vcol = 4 * (ft % per_row);
    float4 pf[PF];
    {
        int lim = min(stage, n);
#pragma unroll
        for (int k = 0; k < PF; k++) {
            int row_k = vrow + k * vstep;
            if (row_k < lim) pf[k] = *(const float4*)(vh + (i64)slots[row_k] * stride_slot + vcol);
        }
    }
    for (int base = 0; base < n; base += stage) {
        int cnt = min(stage, n - base);
#pragma unroll
        for (int k = 0; k < PF; k++) {
            int row_k = vrow + k * vstep;
            if (row_k < cnt) vs[row_k * per_row + vcol / 4] = pf[k];
        }
        __syncthreads();
        int nb = base + stage;
        if (nb < n) {
            int lim = min(stage, n - nb);
#pragma unroll
            for (int k = 0; k < PF; k++) {
                int row_k = vrow + k * vstep;
                if (row_k < lim) pf[k] = *(const float4*)(vh + (i64)slots[nb + row_k] * stride_slot + vcol);
            }
        }
        if (owns) {
            const float* vsf = (const float*)vs + d0;
            int i = 0;
            for (; i + 8 <= cnt; i += 8) {
                float4 ea = *(const float4*)(sc + base + i), eb = *(const float4*)(sc + base + i + 4);
                float e[8] = {ea.x, ea.y, ea.z, ea.w, eb.x, eb.y, eb.z, eb.w};
                float2 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) v[u] = *(const float2*)(vsf + (i + u) * hdv);
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    oc0 = fmaf(e[u], v[u].x, oc0);
                    oc1 = fmaf(e[u], v[u].y, oc1);
                    lc += e[u];
                }
            }
            for (; i < cnt; i++) {
                float e = sc[base + i];
                float2 v = *(const float2*)(vsf + i * hdv);
                oc0 = fmaf(e, v.x, oc0);
                oc1 = fmaf(e, v.y, oc1);
                lc += e;
            }
        }
        __syncthreads();
    }
    if (cmax == 1) {
        // The row's only chunk: the merge would output o_c / l_c; do it here and skip attention_merge.
        float* outh = out + ((i64)r * heads + h) * hd;
        if (owns) {
            outh[dbase + d0] = oc0 / lc;
            outh[dbase + d0 + 1] = oc1 / lc;
        }
        return;
    }
    float* pp = part + (((i64)r * heads + h) * cmax + c) * (hd + 2);
    if (tid == 0) {
        pp[0] = mc;
        pp[1] = lc;  // l_c in visit order
    }
    if (owns) {
        pp[2 + dbase + d0] = oc0;
        pp[3 + dbase + d0] = oc1;
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 1)
attention_chunk_s1(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<1>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 2)
attention_chunk_s2(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<2>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 3)
attention_chunk_s3(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<3>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 4)
attention_chunk_s4(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<4>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 5)
attention_chunk_s5(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<5>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 6)
attention_chunk_s6(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<6>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS * 7)
attention_chunk_s7(const float* q, const float* k, const float* v, const i32* rows, const u32* bt, const i32* bt_off,
                    const u32* tree, const i32* chunks, int cmax, int heads, int kv_heads, int hd, int block_size,
                    float scale_, int window, int has_cap, float softcap, float* part, float* out) {
    attention_chunk_s<7>(q, k, v, rows, bt, bt_off, tree, chunks, cmax, heads, kv_heads, hd, block_size, scale_,
                          window, has_cap, softcap, part, out);
}

// Merges each (row, head)'s chunk partials in increasing chunk order: m' = max(m, m_c), a = exp(m - m'),
// b = exp(m_c - m'), l = l * a + l_c * b, o = o * a + o_c * b; then, with sinks [heads] (null: none), the head's
// sink s last: m' = max(m, s), a = exp(m - m'), l = l * a + exp(s - m'), o = o * a; output o / l (zeros for a row
// without visits). grid (heads, R), ATTN_THREADS threads, each owning dimensions t, t + 128.
extern "C" __global__ void attention_merge(const float* part, const i32* chunks, int cmax, int heads, int hd,
                                           const float* sinks, float* out) {
    griddep_launch();
    griddep_wait();
    int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const float* pp = part + ((i64)r * heads + h) * cmax * (hd + 2);
    float* outh = out + ((i64)r * heads + h) * hd;
    if (chunks[(i64)r * cmax] < 0) {
        for (int d = tid; d < hd; d += ATTN_THREADS) outh[d] = 0.0f;
        return;
    }
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        float m = pp[0], l = pp[1], o = pp[2 + d];
        for (int c = 1; c < cmax && chunks[(i64)r * cmax + c] >= 0; c++) {
            const float* pc = pp + (i64)c * (hd + 2);
            float mc = pc[0], lc = pc[1], oc = pc[2 + d];
            float m2 = fmaxf(m, mc);
            float a = tf_exp(m - m2);
            float b = tf_exp(mc - m2);
            o = o * a + oc * b;
            l = l * a + lc * b;
            m = m2;
        }
        if (sinks) {
            float s = sinks[h];
            float m2 = fmaxf(m, s);
            float a = tf_exp(m - m2);
            l = l * a + tf_exp(s - m2);
            o = o * a;
        }
        outh[d] = o / l;
    }
}
