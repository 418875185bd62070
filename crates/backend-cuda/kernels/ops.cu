// Row and elementwise ops, bit-equal to tf_quant::reference::ops: rms_norm, RoPE rotation, GLU, add, scale,
// embedding rows, row selection, and the paged KV writes and copies.

// RMSNorm of n consecutive floats x by one block (any whole number of warps; the host gives about n / 2 threads so
// each loads few elements): threads 0..15 are dot16's lane accumulators of Σ x² (elements i ≡ lane mod 16,
// increasing; eight shared-memory loads ahead of their fmas), fed from shared memory that the whole block fills
// NORM_CHUNK elements at a time; then y_i = (x_i * inv) * w_i with inv = 1 / sqrt(ss / n + eps). w: n values of
// type w_dt. With ADD, the residual add comes first with exactly the arithmetic of `add`: x_i = x_i + b_i is
// written back to x and to the shared chunk (the sums are what the norm sees), and the last loop reads the sums
// back from x. The thread count changes no bits: the sums of squares are the 16 lanes' in any case. yh (may be
// null): y rounded to bf16 (f16 when yh_f16), for the tensor-core kernels (round_half).
#define NORM_CHUNK 4096
// NORM_PER (a `CudaTuning` define; default 4): elements per thread of the one-chunk path. The host launches one
// thread per NORM_PER / 2 values (geometry::norm_threads reads the same define), so fewer, busier threads.
#ifdef NORM_PER
#define NORM_PER_DEF NORM_PER
#else
#define NORM_PER_DEF 4
#endif
template <bool ADD>
__device__ __forceinline__ void norm_block(float* __restrict__ x, const float* __restrict__ b, int n,
                                           const u8* __restrict__ w, int w_dt, float eps, float* __restrict__ y,
                                           u16* __restrict__ yh, int yh_f16) {
    __shared__ float xs[NORM_CHUNK];
    __shared__ float inv_s;
    griddep_launch();
    int tid = threadIdx.x;
    float acc = 0.0f;
    // A row of up to NPER elements per thread that fits one chunk (every norm the host launches with
    // norm_threads up to 4096 wide): each thread loads its x, b and w before any store, and the last loop reads
    // the sums from shared memory, so the block waits on one round trip to memory instead of one per element.
    const int NPER = NORM_PER_DEF;
    bool small = n <= NORM_CHUNK && n <= NPER * (int)blockDim.x;
    float wv[NPER];
#if PRE_WAIT
    // The norm weight is never written after upload: loaded while the previous kernel may still run.
    if (small) {
#pragma unroll
        for (int u = 0; u < NPER; u++) {
            int i = tid + u * blockDim.x;
            if (i < n) wv[u] = deq_elem(w_dt, w, i);
        }
    }
#endif
    griddep_wait();  // launched early (PDL): nothing the previous kernel writes is read before it is done
    if (small) {
        float xv[NPER], bv[NPER];
#pragma unroll
        for (int u = 0; u < NPER; u++) {
            int i = tid + u * blockDim.x;
            if (i < n) {
                xv[u] = x[i];
                if (ADD) bv[u] = b[i];
#if !PRE_WAIT
                wv[u] = deq_elem(w_dt, w, i);
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < NPER; u++) {
            int i = tid + u * blockDim.x;
            if (i < n) {
                float s = xv[u];
                if (ADD) {
                    s = s + bv[u];
                    x[i] = s;
                }
                xs[i] = s;
            }
        }
    }
    for (int c0 = 0; c0 < n; c0 += NORM_CHUNK) {
        int m = min(NORM_CHUNK, n - c0);
        if (!small) {
            for (int i = tid; i < m; i += blockDim.x) {
                float s = x[c0 + i];
                if (ADD) {
                    s = s + b[c0 + i];
                    x[c0 + i] = s;
                }
                xs[i] = s;
            }
        }
        __syncthreads();
        if (tid < 16) {
            // NORM_CHUNK is a multiple of 16, so chunk index i ≡ element index (mod 16).
            int i = tid;
            for (; i + 16 * 7 < m; i += 16 * 8) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) v[u] = xs[i + 16 * u];
#pragma unroll
                for (int u = 0; u < 8; u++) acc = fmaf(v[u], v[u], acc);
            }
            for (; i < m; i += 16) acc = fmaf(xs[i], xs[i], acc);
        }
        __syncthreads();
    }
    if (tid < 32) {
        float ss = tree16(tid < 16 ? acc : 0.0f);
        if (tid == 0) inv_s = 1.0f / sqrtf(ss / (float)n + eps);
    }
    __syncthreads();
    float inv = inv_s;
    if (small) {
#pragma unroll
        for (int u = 0; u < NPER; u++) {
            int i = tid + u * blockDim.x;
            if (i < n) {
                float v = (xs[i] * inv) * wv[u];
                y[i] = v;
                if (yh) yh[i] = round_half(v, yh_f16);
            }
        }
        return;
    }
    for (int i = tid; i < n; i += blockDim.x) {
        float v = (x[i] * inv) * deq_elem(w_dt, w, i);
        y[i] = v;
        if (yh) yh[i] = round_half(v, yh_f16);
    }
}

// One block per (group g, row r): grid (cols / group, R); the norm of each group of `group` values. yh: null, or
// [R, cols] for the half copy.
extern "C" __global__ void rms_norm(const float* x, int cols, int group, const u8* w, int w_dt, float eps,
                                    float* y, u16* yh, int yh_f16) {
    i64 off = (i64)blockIdx.y * cols + (i64)blockIdx.x * group;
    // Not written: without ADD norm_block only reads x.
    norm_block<false>((float*)(x + off), nullptr, group, w, w_dt, eps, y + off, yh ? yh + off : nullptr, yh_f16);
}

// The residual add and the RMSNorm after it, over whole rows: a [R, cols] += b, then y = rms_norm(a) with group =
// cols. One block per row, with exactly the arithmetic of `add` (s_i = a_i + b_i) then of `rms_norm`
// (norm_block). Saves one launch and a read of the row.
extern "C" __global__ void add_rms_norm(float* a, const float* b, int cols, const u8* w, int w_dt, float eps,
                                        float* y, u16* yh, int yh_f16) {
    i64 off = (i64)blockIdx.x * cols;
    norm_block<true>(a + off, b + off, cols, w, w_dt, eps, y + off, yh ? yh + off : nullptr, yh_f16);
}

// RoPE of x [R, cols] in place: thread per (row, head, pair i). cos/sin: [R, half] table rows of each row's
// position (computed on the host in f64, rounded once). neox: pairs (i, i + half), else (2i, 2i + 1).
extern "C" __global__ void rope(float* x, int R, int cols, int head_dim, int half, const float* cos_t,
                                const float* sin_t, int neox) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    int heads = cols / head_dim;
    i64 total = (i64)R * heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    i64 rh = idx / half;
    int h = (int)(rh % heads);
    int r = (int)(rh / heads);
    float* xh = x + (i64)r * cols + (i64)h * head_dim;
    int i0 = neox ? i : 2 * i;
    int i1 = neox ? i + half : 2 * i + 1;
    float c = cos_t[(i64)r * half + i], s = sin_t[(i64)r * half + i];
    float x0 = xh[i0], x1 = xh[i1];
    xh[i0] = x0 * c - x1 * s;
    xh[i1] = x0 * s + x1 * c;
}

// out = act(gate) * up; act 0 = SiLU, 1 = GELU (tanh form).
extern "C" __global__ void glu(const float* gate, const float* up, i64 n, int act, float* out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    float a = act == 0 ? tf_silu(g) : tf_gelu_tanh(g);
    out[i] = a * up[i];
}

// gpt-oss's clamped SwiGLU (reference::ops::glu_one): g = min(gate, limit), u = clamp(up, -limit, limit) by
// comparisons (NaN passes), out = (u + 1) * (g / (1 + exp(-(alpha * g)))).
extern "C" __global__ void glu_clamp(const float* gate, const float* up, i64 n, float alpha, float limit, float* out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], u = up[i];
    if (g > limit) g = limit;
    if (u > limit) u = limit;
    else if (u < -limit) u = -limit;
    float glu = __fdiv_rn(g, __fadd_rn(1.0f, tf_exp(-__fmul_rn(alpha, g))));
    out[i] = __fmul_rn(__fadd_rn(u, 1.0f), glu);
}

extern "C" __global__ void add(float* a, const float* b, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] + b[i];
}

extern "C" __global__ void scale(float* x, i64 n, float s) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s;
}

// out [R, hidden] = rows ids[r] of table [vocab, hidden] (tag dt), dequantized.
extern "C" __global__ void embed(const u8* table, int dt, int hidden, const u32* ids, int R, float* out) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)R * hidden) return;
    int r = (int)(idx / hidden), c = (int)(idx % hidden);
    int base = dt & ~DT_INTERLEAVED;  // an interleaved table (tied to a matmul) is read through il_index
    i64 row_bytes = (i64)(hidden / block_elems(base)) * block_bytes(base);
    out[idx] = deq_elem(dt, table + (i64)ids[r] * row_bytes, c);
}

// The key of row r from argmax_rows' per-slice keys [R, slices]: their maximum, by one warp (lane l takes slices
// l, l + 32, ...; the maximum of integers in any order).
__device__ __forceinline__ u64 argmax_key(const u64* keys, int slices, int r) {
    u64 k = 0;
    for (int s = threadIdx.x & 31; s < slices; s += 32) k = max(k, keys[(i64)r * slices + s]);
    for (int off = 16; off > 0; off >>= 1) k = max(k, __shfl_down_sync(FULL_MASK, k, off));
    return k;  // lane 0 holds the maximum
}

// embed of the ids argmax_rows left in keys [R, slices] (id = 0xffffffff - low half of the row's key; an id past
// the table's vocab rows, which a row without a key would give, embeds zeros): a forward fed by the previous one's
// argmax without the host. Grid (ceil(hidden / blockDim), R), blockDim a multiple of 32. With host_ids
// (device-mapped pinned host memory) set, each row's id is written there too, for the host to read after an event
// (src/host_ids.rs). Launched early (PDL): everything it reads is the previous kernels' output.
extern "C" __global__ void embed_keys(const u8* table, int dt, int hidden, const u64* keys, int slices, int vocab,
                                      float* out, u32* host_ids) {
    __shared__ u32 row_id;
    griddep_launch();
    griddep_wait();
    int r = blockIdx.y;
    if (threadIdx.x < 32) {
        u64 k = argmax_key(keys, slices, r);
        if (threadIdx.x == 0) {
            row_id = 0xffffffffu - (u32)k;
            if (host_ids && blockIdx.x == 0) host_ids[r] = row_id;
        }
    }
    __syncthreads();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    u32 id = row_id;
    i64 idx = (i64)r * hidden + c;
    if (id >= (u32)vocab) {
        out[idx] = 0.0f;
        return;
    }
    int base = dt & ~DT_INTERLEAVED;
    i64 row_bytes = (i64)(hidden / block_elems(base)) * block_bytes(base);
    out[idx] = deq_elem(dt, table + (i64)id * row_bytes, c);
}

// out [n, cols] = rows idx[i] of x.
extern "C" __global__ void select_rows(const float* x, int cols, const u32* idx, int n, float* out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)n * cols) return;
    int i = (int)(t / cols), c = (int)(t % cols);
    out[t] = x[(i64)idx[i] * cols + c];
}

// acc[rows[i]] += scales[i] * y[i] for i = 0..n in order (acc [R, cols], y [n, cols]); one thread per column, so
// a row listed twice takes its additions in list order. Product and sum rounded separately (no FMA contraction).
extern "C" __global__ void add_rows_scaled(float* acc, const float* y, int cols, const u32* rows, const float* scales,
                                           int n) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int i = 0; i < n; i++) {
        i64 dst = (i64)rows[i] * cols + c;
        acc[dst] = __fadd_rn(acc[dst], __fmul_rn(scales[i], y[(i64)i * cols + c]));
    }
}

// K and V rows [R, width] into slots[r] of one layer (k_layer, v_layer: [slots, width]).
extern "C" __global__ void kv_write(float* k_layer, float* v_layer, const float* k, const float* v, int width,
                                    const u32* slots, int R) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)R * width) return;
    int r = (int)(t / width), c = (int)(t % width);
    i64 dst = (i64)slots[r] * width + c;
    k_layer[dst] = k[t];
    v_layer[dst] = v[t];
}

// Spins ns nanoseconds of %globaltimer (kv_write_late; the lab's probes, crates/cuda-lab).
__device__ __forceinline__ void spin_ns(int ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (u64)ns);
}

// Test only (tests/kv_writes.rs, CudaBackend::kv_write_late): kv_write's copy from a kernel that lets its dependents
// start at once and writes only after spinning ns nanoseconds past its wait, so that a dependent attention runs its
// code before griddep_wait while the rows are still old (what a kernel reading them there too early would see).
extern "C" __global__ void kv_write_late(float* k_layer, float* v_layer, const float* k, const float* v, int width,
                                         const u32* slots, int R, int ns) {
    griddep_launch();
    griddep_wait();
    spin_ns(ns);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)R * width; i += (i64)gridDim.x * blockDim.x) {
        int r = (int)(i / width), c = (int)(i % width);
        i64 dst = (i64)slots[r] * width + c;
        k_layer[dst] = k[i];
        v_layer[dst] = v[i];
    }
}

// rope of q and k in place, then k and v into slots[r] of one layer, in one launch: exactly `rope` (the same two
// products and one sum or difference per element) twice and `kv_write`. Threads in turn: one per (row, q head,
// pair), one per (row, k head, unit) where units 0..half-1 are the pairs (rotated, written to k and to the cache)
// and the rest the head's dimensions rot.. head_dim - 1 (copied to the cache as they are), one per V element.
// q [R, qcols], k and v [R, kcols]; k_layer, v_layer [slots, kcols].
extern "C" __global__ void rope_kv_write(float* q, float* k, const float* v, int R, int qcols, int kcols, int head_dim,
                                         int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
                                         float* v_layer, const u32* slots) {
    griddep_launch();
#if !PRE_WAIT
    griddep_wait();
#endif
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    int rot = 2 * half;
    int hq = qcols / head_dim, hk = kcols / head_dim;
    int ku = half + head_dim - rot;
    i64 nq = (i64)R * hq * half, nk = (i64)R * hk * ku, nv = (i64)R * kcols;
    bool is_q = idx < nq;
    if (!is_q) idx -= nq;
    if (is_q || idx < nk) {
        int per = is_q ? half : ku;
        int heads = is_q ? hq : hk;
        int cols = is_q ? qcols : kcols;
        int u = (int)(idx % per);
        i64 rh = idx / per;
        int h = (int)(rh % heads);
        int r = (int)(rh / heads);
        float* xh = (is_q ? q : k) + (i64)r * cols + (i64)h * head_dim;
        // slots and the cos / sin rows are host uploads (each ordered after every earlier kernel): read before
        // waiting on the previous kernel, whose outputs (q, k, v) are read after.
        float* ch = k_layer + (i64)slots[r] * kcols + (i64)h * head_dim;
        float c = 0.0f, s = 0.0f;
        if (u < half) c = cos_t[(i64)r * half + u], s = sin_t[(i64)r * half + u];
#if PRE_WAIT
        griddep_wait();
#endif
        if (u < half) {
            int i0 = neox ? u : 2 * u;
            int i1 = neox ? u + half : 2 * u + 1;
            float x0 = xh[i0], x1 = xh[i1];
            float y0 = x0 * c - x1 * s;
            float y1 = x0 * s + x1 * c;
            xh[i0] = y0;
            xh[i1] = y1;
            if (!is_q) {
                ch[i0] = y0;
                ch[i1] = y1;
            }
        } else {
            int d = rot + (u - half);
            ch[d] = xh[d];
        }
        return;
    }
    idx -= nk;
#if PRE_WAIT
    griddep_wait();
#endif
    if (idx < nv) {
        int r = (int)(idx / kcols), c = (int)(idx % kcols);
        v_layer[(i64)slots[r] * kcols + c] = v[idx];
    }
}

// Copies slot src[i] to dst[i] for i in order, in every layer: block (layer, K or V), the pairs one after another.
// k, v: [layers, slots, width].
extern "C" __global__ void kv_copy(float* k, float* v, i64 layer_len, int width, const u32* src, const u32* dst,
                                   int n) {
    float* base = (blockIdx.y == 0 ? k : v) + (i64)blockIdx.x * layer_len;
    for (int i = 0; i < n; i++) {
        float* from = base + (i64)src[i] * width;
        float* to = base + (i64)dst[i] * width;
        for (int c = threadIdx.x; c < width; c += blockDim.x) {
            float val = from[c];
            to[c] = val;
        }
        __syncthreads();
    }
}

// The greedy token of each row of x [R, cols] (tf_core::argmax_row): the lowest id holding the row's maximum,
// NaN read as −∞, so -0.0 and 0.0 are equal and a row of only −∞/NaN gives 0. Grid (slices, R): block (s, r)
// scans columns [s · per, (s + 1) · per) of row r (blockDim a multiple of 32, at most 1024): each thread keeps the
// best (value, id) of its strided part, then the warps and the block combine pairs by "greater value wins, equal
// values go to the lower id" — the maximum of a total order on (value, id) pairs, so the order in which pairs meet
// changes nothing. A thread that saw nothing holds (−∞, INT_MAX), which loses to every element. The block's best
// pair goes into keys[r · slices + s] (u64) as a key with the same order: the value's bits made monotone (−∞ for
// NaN, +0 for -0) above 0xffffffff − id, 0 for a slice with no element; the row's key is the maximum over its
// slices (argmax_key), so any number of slices gives the same key, and id = 0xffffffff − (key mod 2³²). One slice
// per 2,048 columns puts ~75 blocks on a 152k vocabulary row instead of one (24 µs → a few on the H200). Every
// slice writes its key, so the buffer needs no zeroing before the launch, and the kernel launches early (PDL).
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

extern "C" __global__ void argmax_rows(const float* x, int cols, int per, unsigned long long* keys) {
    __shared__ float wv[32];
    __shared__ int wi[32];
    griddep_launch();
    griddep_wait();  // launched early (PDL): the logits are the previous kernel's output
    const float* row = x + (i64)blockIdx.y * cols;
    const float neg_inf = __uint_as_float(0xff800000u);
    const int B = blockDim.x;
    int end = min(cols, (blockIdx.x + 1) * per);
    float bv = neg_inf;
    int bi = 0x7fffffff;
    int i = blockIdx.x * per + threadIdx.x;
    // Four loads in flight per thread, then the tail.
    for (; i + 3 * B < end; i += 4 * B) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = row[i + u * B];
#pragma unroll
        for (int u = 0; u < 4; u++) argmax_take(bv, bi, v[u] != v[u] ? neg_inf : v[u], i + u * B);
    }
    for (; i < end; i += B) {
        float v = row[i];
        argmax_take(bv, bi, v != v ? neg_inf : v, i);
    }
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_down_sync(FULL_MASK, bv, off);
        int oi = __shfl_down_sync(FULL_MASK, bi, off);
        argmax_take(bv, bi, ov, oi);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = B >> 5;
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < warps ? wv[lane] : neg_inf;
        bi = lane < warps ? wi[lane] : 0x7fffffff;
        for (int off = 16; off > 0; off >>= 1) {
            float ov = __shfl_down_sync(FULL_MASK, bv, off);
            int oi = __shfl_down_sync(FULL_MASK, bi, off);
            argmax_take(bv, bi, ov, oi);
        }
        if (lane == 0) {
            u32 u = __float_as_uint(bv == 0.0f ? 0.0f : bv);  // -0 reads as +0; bv is never NaN here
            u32 ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            keys[(i64)blockIdx.y * gridDim.x + blockIdx.x] =
                bi == 0x7fffffff ? 0ull : ((unsigned long long)ord << 32) | (0xffffffffu - (u32)bi);
        }
    }
}
