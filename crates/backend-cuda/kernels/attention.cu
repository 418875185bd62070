// Attention over the paged KV cache, bit-equal to reference::ops::attention_head: per chunk of 256 absolute
// positions, scores s = dot16(q, k) * scale (softcap: cap * tanh(s / cap)), m_c = max s, e = exp(s - m_c),
// l_c = Σ e in visit order, o_c[d] = fma(e, v[d], o_c[d]) in visit order; chunks merged in increasing order.

#define ATTN_CHUNK 256
#define MAX_HEAD_DIM 256

// Per row: pos, seq, ctx, tree_off, tree_len (5 i32). bt: flattened block tables, bt_off[seq] their starts.
// tree: (position, slot) pairs. window < 0: no sliding window. has_cap: soft-capping by softcap.
// One warp per (query head h, row r): grid (heads, R), 32 threads. k, v: this layer's [slots, kv_heads, hd].
extern "C" __global__ void attention(const float* q, const float* k, const float* v, const i32* rows,
                                     const u32* bt, const i32* bt_off, const u32* tree, int heads, int kv_heads,
                                     int hd, int block_size, float scale_, int window, int has_cap, float softcap,
                                     float* out) {
    __shared__ float qs[MAX_HEAD_DIM];
    __shared__ u32 slots[ATTN_CHUNK];
    __shared__ float sc[ATTN_CHUNK];
    int h = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
    int kvh = h / (heads / kv_heads);
    const i32* row = rows + 5 * r;
    i64 pos = row[0];
    int seq = row[1];
    i64 ctx = row[2];
    const u32* tr = tree + 2 * row[3];
    int tlen = row[4];
    const u32* table = bt + bt_off[seq];
    const float* qh = q + ((i64)r * heads + h) * hd;
    for (int i = lane; i < hd; i += 32) qs[i] = qh[i];
    // Prefix positions p >= lo are inside the window ((pos - p) < window).
    i64 lo = 0;
    if (window >= 0) {
        i64 l = pos - (i64)window + 1;
        lo = l > 0 ? l : 0;
    }
    i64 next_p = lo;  // next prefix position to visit
    int ti = 0;       // next tree entry
    bool have = false;
    float m = 0.0f, l = 0.0f;
    float o[MAX_HEAD_DIM / 32];
    float oc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int t = 0; t < MAX_HEAD_DIM / 32; t++) o[t] = 0.0f;
    i64 stride_slot = (i64)kv_heads * hd;
    __syncthreads();
    while (true) {
        // The first visit still to come fixes the chunk.
        while (ti < tlen && window >= 0 && !((pos - (i64)tr[2 * ti]) < (i64)window)) ti++;
        i64 first;
        if (next_p < ctx) {
            first = next_p;
        } else if (ti < tlen) {
            first = tr[2 * ti];
        } else {
            break;
        }
        i64 cend = (first / ATTN_CHUNK + 1) * ATTN_CHUNK;
        // Prefix part of the chunk, then its tree entries.
        i64 pend = ctx < cend ? ctx : cend;
        int np = next_p < pend ? (int)(pend - next_p) : 0;
        for (int i = lane; i < np; i += 32) {
            i64 p = next_p + i;
            slots[i] = table[p / block_size] * (u32)block_size + (u32)(p % block_size);
        }
        if (np > 0) next_p = pend;
        int n = np;
        while (ti < tlen && (i64)tr[2 * ti] < cend) {
            i64 p = tr[2 * ti];
            if (window < 0 || (pos - p) < (i64)window) {
                if (lane == 0) slots[n] = tr[2 * ti + 1];
                n++;
            }
            ti++;
        }
        __syncthreads();
        // Scores: half-warp per position, lane j of the half is dot16's lane accumulator j.
        int half = lane / 16, j = lane % 16;
        for (int base = 0; base < n; base += 2) {
            int vi = base + half;
            float acc = 0.0f;
            if (vi < n) {
                const float* kr = k + (i64)slots[vi] * stride_slot + (i64)kvh * hd;
                for (int i = j; i < hd; i += 16) acc = fmaf(qs[i], kr[i], acc);
            }
            float s = tree16(acc);
            if (j == 0 && vi < n) {
                s = s * scale_;
                if (has_cap) s = softcap * tf_tanh(s / softcap);
                sc[vi] = s;
            }
        }
        __syncthreads();
        float mc = __uint_as_float(0xff800000u);
        for (int i = 0; i < n; i++) mc = fmaxf(mc, sc[i]);
        __syncthreads();
        for (int i = lane; i < n; i += 32) sc[i] = tf_exp(sc[i] - mc);
        __syncthreads();
        float lc = 0.0f;
        for (int i = 0; i < n; i++) lc += sc[i];
#pragma unroll
        for (int t = 0; t < MAX_HEAD_DIM / 32; t++) oc[t] = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = sc[i];
            const float* vr = v + (i64)slots[i] * stride_slot + (i64)kvh * hd;
#pragma unroll
            for (int t = 0; t < MAX_HEAD_DIM / 32; t++) {
                int dd = lane + 32 * t;
                if (dd < hd) oc[t] = fmaf(e, vr[dd], oc[t]);
            }
        }
        if (!have) {
            m = mc;
            l = lc;
#pragma unroll
            for (int t = 0; t < MAX_HEAD_DIM / 32; t++) o[t] = oc[t];
            have = true;
        } else {
            float m2 = fmaxf(m, mc);
            float a = tf_exp(m - m2);
            float b = tf_exp(mc - m2);
#pragma unroll
            for (int t = 0; t < MAX_HEAD_DIM / 32; t++) o[t] = o[t] * a + oc[t] * b;
            l = l * a + lc * b;
            m = m2;
        }
        __syncthreads();
    }
    float* outh = out + ((i64)r * heads + h) * hd;
#pragma unroll
    for (int t = 0; t < MAX_HEAD_DIM / 32; t++) {
        int dd = lane + 32 * t;
        if (dd < hd) outh[dd] = have ? o[t] / l : 0.0f;
    }
}
