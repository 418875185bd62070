// One-row and interleaved-row float matmul kernels (split from matmul.cu, which must come first: `_ilg` is its
// matmul_float reading interleaved places). Every output's arithmetic is matmul_float's (see below).

// ---- interleaved float weights (il_index in common.cu) -----------------------------------------------------------

// The arithmetic of matmul_float (lane j of a half-warp is dot16's lane accumulator j, its fma chain over k = j,
// j + 16, ... in increasing order, then tree16) on rows stored interleaved: one 16-byte load gives lane j the next
// EPV elements of its own chain (logical 16·EPV·b + 16t + j, t = 0..EPV-1), and a half-warp's 16 loads of block b
// are one contiguous 256-byte segment. Activations are read at the logical indices. Needs K a multiple of 16·EPV.
// On the H200 one row runs ~25% faster than matmul_float (decode step 1.5B 3.35 -> 2.54 ms, 7B 7.23 -> 5.47 ms).
//
// Two kernels per weight type with the same fma sequence per output: `_il1` for one row (the decode step) and
// `_ilg` for any number of rows, which is matmul_float itself reading each element at its interleaved place
// (w_at; a half-warp's 2-byte loads then spread over the block's 256 bytes, served by L1 for the next seven).
// An earlier `_ilg` with 16-byte loads ran 1.5-2.3x slower than matmul_float for reasons not found. Which one
// runs changes no output's bits (the device tests compare a row alone with the same row in windows of 2..256
// rows). `_il1`'s block is blockDim.x / 16 columns wide, chosen by N on the host; grid (ceil(N / cols), 1);
// `_ilg` takes matmul_float's grid.
//
// One row: each thread issues IL_DEPTH weight vectors (IL_DEPTH·EPV chain elements) and then the activations
// they meet, all before the first fma of the batch. Weight loads bypass L1 (read once per step); the activations
// (re-read by every column) stay cached there. Loading the activations ahead is what pays: with them read next
// to each fma the chain waited on an L1/L2 round trip per element, and long rows (K = 8960, 18944) ran at
// 0.8-1.0 TB/s.
// Software pipelining (IL_PIPE, on by default): the next batch's weight vectors are requested before the current
// batch's fmas, so a thread always has a batch in flight; the same fmas in the same order, only the loads move.
// Depth per kernel: the q/k/v, o and down-projections (`_il1`, `_il1_many`) have few outputs (N = 1,536-4,608,
// 16 threads each), so each thread needs more bytes in flight than in the GLU kernel (N up to 18,944, two dot
// products per column): IL1_DEPTH (default 6 when pipelined: 110 registers) for those, GLU_DEPTH (4, 75 registers)
// for `_il1_glu`. On the H200, IL1_DEPTH 4 -> 6 took the 7B engine decode from 223 to 244 tok/s and the 1.5B from
// 585 to 616; 8 (142 registers) helped the 1.5B as much but not the 7B. IL_PIPE=0, IL_DEPTH (both), IL1_DEPTH and
// GLU_DEPTH are `CudaTuning::defines` (docs/perf-notes-cuda.md).
#ifndef IL_PIPE
#define IL_PIPE 1
#endif
#ifdef IL_DEPTH
#define IL_DEPTH_SET 1
#else
#if IL_PIPE
#define IL_DEPTH 4
#else
#define IL_DEPTH 8
#endif
#endif
#ifndef IL1_DEPTH
#if IL_PIPE && !defined(IL_DEPTH_SET)
#define IL1_DEPTH 6
#else
#define IL1_DEPTH IL_DEPTH
#endif
#endif
#ifndef GLU_DEPTH
#define GLU_DEPTH IL_DEPTH
#endif
// MANY_DEPTH (a `CudaTuning` define): the depth of `_il1_many` (q/k/v) alone; by default IL1_DEPTH. Registers bound how
// many threads of these kernels fit on the GPU at once: each of an SM's four sub-partitions has 16,384 registers
// and holds whole warps (110 registers, allocated as 112: 4 warps, 16 per SM; 142: 3, 12 per SM), fewer than the
// 7B's q/k/v needs in one wave (see `_il1_qkv_rope_w`), so its best depth can differ from o's and down's.
#ifndef MANY_DEPTH
#define MANY_DEPTH IL1_DEPTH
#endif
// BULK_PF (a `CudaTuning` define, sm_90 only): 1 = the `_il1` / `_il1_many` kernels ask L2 for each weight row past the
// first batch with one bulk prefetch before griddep_wait; 2 = the GLU kernel too. 0 (default): no prefetch.
#ifndef BULK_PF
#define BULK_PF 0
#endif

// The first weight batch really is in flight before
// griddepcontrol.wait. ptxas treats the wait (SASS ACQBULK) as independent of the weight loads (read-only, .nc)
// and scheduled all but one of them after it (cuobjdump: `_il1_add` 1 of 6 loads before ACQBULK, `_il1_glu` 0 of
// 4), so the early launch would stream almost nothing under the previous kernel. So the wait is predicated
// on a value computed from every vector of the batch (il1_wait_after: taken either way, so it always executes), so
// the loads must be issued, and have returned, before it.

// Early epilogue loads: the epilogue's other inputs are read early instead of after the last batch, where each would
// be one more dependent round trip at the end of every warp (DRAM for the bias, and for
// the residual row when the layer's weight stream has evicted it from L2). The bias (a weight, never written after
// upload) is loaded before griddepcontrol.wait and folded into the wait's predicate, so it is really in flight
// there; the residual (an earlier kernel's output) right after the wait, by a volatile load the compiler keeps
// ahead of the batches. The same additions in the same order: only the loads move.

// Element e (a compile-time constant after unrolling) of a 16-byte vector of DT values, as f32.
template <int DT>
__device__ __forceinline__ float vec_elem(const uint4& v, int e) {
    if (DT == DT_F32) {
        u32 w = e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
        return __uint_as_float(w);
    }
    int m = e >> 1;
    u32 w = m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w;
    u32 h = (e & 1) ? (w >> 16) : (w & 0xffffu);
    if (DT == DT_F16) return f16_bits_to_f32(h);
    return bf16_bits_to_f32(h);
}

// A 16-byte weight load through the read-only path, not allocated in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// griddepcontrol.wait after the batch v has arrived (above): the wait depends on a fold of every vector.
template <int D>
__device__ __forceinline__ void il1_wait_after(const uint4 (&v)[D], u32 pre) {
    u32 f = pre;
#pragma unroll
    for (int u = 0; u < D; u++) f ^= v[u].x ^ v[u].w;
    griddep_wait_on(f);
}

// The D weight vectors of batch b0 (zero past the row's nb blocks; never used there).
template <int D>
__device__ __forceinline__ void il1_batch(uint4 (&v)[D], const uint4* wq, int b0, int nb) {
#pragma unroll
    for (int u = 0; u < D; u++) v[u] = b0 + u < nb ? ld_stream(wq + 16 * (b0 + u)) : make_uint4(0, 0, 0, 0);
}

// The RMSNorm in front of a one-row projection (Backend::norm_matmul_many / norm_matmul_glu), run by every block of
// the projection on the row it reads: w [K] of type dt, and xs, K floats of the block's shared memory that end up
// holding the normed row. The arithmetic is norm_block's (kernels/ops.cu) for one chunk: lanes 0..15 sum x_i² over
// i ≡ lane (mod 16) in increasing order, tree16, inv = 1 / sqrt(ss / K + eps), then (x_i * inv) * w_i, so the
// projection sees the very floats `rms_norm` would have written. K ≤ IL_NORM_MAX_K, a multiple of 4.
#define IL_NORM_MAX_K 4096
#define PRO_N 8
// ready: the block has already normed the row into xs (a later pass of a block looping over its work).
struct NormIn {
    const u8* w;
    int dt;
    float eps;
    float* xs;
    bool ready;
};

// Elements 4v..4v+3 of a vector of type dt: F32, F16 or BF16, not interleaved (the host checks), 16-byte aligned.
// The loads are volatile asm so the compiler keeps them where they are written (hoisted, they held registers
// through the whole norm).
__device__ __forceinline__ float4 ld_float4_of(int dt, const u8* __restrict__ w, int v) {
    if (dt == DT_F32) {
        float4 f;
        asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w)
                     : "l"(w + 16 * (i64)v));
        return f;
    }
    uint2 h;
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(h.x), "=r"(h.y) : "l"(w + 8 * (i64)v));
    if (dt == DT_F16) {
        return make_float4(f16_bits_to_f32(h.x & 0xffffu), f16_bits_to_f32(h.x >> 16), f16_bits_to_f32(h.y & 0xffffu),
                           f16_bits_to_f32(h.y >> 16));
    }
    return make_float4(bf16_bits_to_f32(h.x & 0xffffu), bf16_bits_to_f32(h.x >> 16), bf16_bits_to_f32(h.y & 0xffffu),
                       bf16_bits_to_f32(h.y >> 16));
}

__device__ __forceinline__ void il1_norm_prologue(const float* __restrict__ h, int K, const NormIn& nm) {
    __shared__ float inv_s;
    float* __restrict__ xs = nm.xs;
    int tid = threadIdx.x, nt = blockDim.x;
    // The row into shared memory, eight 16-byte loads in flight per thread.
    const float4* h4 = (const float4*)h;
    float4* x4 = (float4*)xs;
    int nv = K / 4;
    for (int v0 = tid; v0 < nv; v0 += PRO_N * nt) {
        float4 r[PRO_N];
#pragma unroll
        for (int u = 0; u < PRO_N; u++) {
            if (v0 + u * nt < nv) r[u] = h4[v0 + u * nt];
        }
#pragma unroll
        for (int u = 0; u < PRO_N; u++) {
            if (v0 + u * nt < nv) x4[v0 + u * nt] = r[u];
        }
    }
    __syncthreads();
    float acc = 0.0f;
    if (tid < 16) {
        int i = tid;
        for (; i + 16 * 7 < K; i += 16 * 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = xs[i + 16 * u];
#pragma unroll
            for (int u = 0; u < 8; u++) acc = fmaf(v[u], v[u], acc);
        }
        for (; i < K; i += 16) acc = fmaf(xs[i], xs[i], acc);
    }
    if (tid < 32) {
        float ss = tree16(tid < 16 ? acc : 0.0f);
        if (tid == 0) inv_s = 1.0f / sqrtf(ss / (float)K + nm.eps);
    }
    __syncthreads();
    float inv = inv_s;
    // (x_i * inv) * w_i, the norm weight read as 16-byte (F32) or 8-byte vectors, eight in flight per thread.
    for (int v0 = tid; v0 < nv; v0 += PRO_N * nt) {
        float4 wv[PRO_N];
#pragma unroll
        for (int u = 0; u < PRO_N; u++) {
            if (v0 + u * nt < nv) wv[u] = ld_float4_of(nm.dt, nm.w, v0 + u * nt);
        }
#pragma unroll
        for (int u = 0; u < PRO_N; u++) {
            int v = v0 + u * nt;
            if (v < nv) {
                float4 a = x4[v];
                x4[v] = make_float4((a.x * inv) * wv[u].x, (a.y * inv) * wv[u].y, (a.z * inv) * wv[u].z,
                                    (a.w * inv) * wv[u].w);
            }
        }
    }
    __syncthreads();
}

// dot16 of the single row x with interleaved weight row nn, by the half-warp whose lane is j: each thread issues
// D weight vectors and then the activations they meet before the batch's first fma; the tree16 result is
// valid in lane 0. The kernels built on it are launched with programmatic dependence (src/backend.rs): the first
// batch of weights is requested before griddep_wait(), and nothing is read from x or written before it. NORM: x is
// the row before its RMSNorm, which the whole block computes into nm.xs right after the wait (il1_norm_prologue,
// so every thread of the block must call this), and the activations are read from there. pre: bits of values the
// caller loaded before the call (the bias, see the early epilogue loads above), which the wait then follows; after (if not null): a float an earlier kernel wrote, read into
// *after_v right after the wait.
template <int DT, int D, bool PF = false, bool NORM = false>
__device__ __forceinline__ float il1_dot(const float* x, int K, const u8* w, int nn, int j, const NormIn& nm = {},
                                         u32 pre = 0, const float* after = nullptr,
                                         float* after_v = nullptr) {
    const int EPV = DT == DT_F32 ? 4 : 8;
    const int BLK = 16 * EPV;
    // Lane j's vector of block b: wq[16 b].
    const uint4* wq = (const uint4*)(w + (i64)nn * K * (DT == DT_F32 ? 4 : 2)) + j;
    int nb = K / BLK;
    const float* xr = x + j;
    float acc = 0.0f;
    griddep_launch();
    uint4 v[D];
    il1_batch(v, wq, 0, nb);
#if BULK_PF
    // BULK_PF: lane 0 asks L2 for the rest of the row in one bulk prefetch (sm_90's copy engine, one
    // instruction, no registers) while the previous kernel still runs.
    if (PF && j == 0 && nb > D) {
        const u8* rest = (const u8*)(wq - j + 16 * D);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(rest), "r"((u32)((nb - D) * 256)) : "memory");
    }
#endif
    // Launched early (PDL): the first weights are on their way; x is the previous kernel's output.
#if __CUDA_ARCH__ >= 900
    il1_wait_after(v, pre);
#else
    griddep_wait_on(pre);
#endif
    if (after) {
        float a;
        asm volatile("ld.global.f32 %0, [%1];" : "=f"(a) : "l"(after));
        *after_v = a;
    }
    if (NORM) {
        if (!nm.ready) il1_norm_prologue(x, K, nm);
        xr = nm.xs + j;
    }
    for (int b0 = 0; b0 < nb; b0 += D) {
        float xv[D][EPV];
#pragma unroll
        for (int u = 0; u < D; u++) {
#pragma unroll
            for (int e = 0; e < EPV; e++) xv[u][e] = b0 + u < nb ? xr[(b0 + u) * BLK + 16 * e] : 0.0f;
        }
#if IL_PIPE
        uint4 nv[D];
        il1_batch(nv, wq, b0 + D, nb);
#endif
#pragma unroll
        for (int u = 0; u < D; u++) {
            if (b0 + u < nb) {
#pragma unroll
                for (int e = 0; e < EPV; e++) acc = fmaf(xv[u][e], vec_elem<DT>(v[u], e), acc);
            }
        }
#if IL_PIPE
#pragma unroll
        for (int u = 0; u < D; u++) v[u] = nv[u];
#else
        if (b0 + D < nb) il1_batch(v, wq, b0 + D, nb);
#endif
    }
    return tree16(acc);
}

// bx: this block's index among the weight's blocks (blockIdx.x when one weight is launched alone); D: il1_dot's
// depth.
// ADD: the residual add after the projection, y_n = y_n + s (`add`'s arithmetic, y the residual row). NORM: see
// il1_dot.
template <int DT, int D = IL1_DEPTH, bool ADD = false, bool NORM = false>
__device__ __forceinline__ void matmul_float_il1(const float* x, int K, const u8* w, int N, const u8* bias,
                                                int bias_dt, float* y, int bx, const NormIn& nm = {}) {
    int half = threadIdx.x / 16, j = threadIdx.x % 16;
    int n = bx * (blockDim.x / 16) + half;
    bool live = n < N;
    bool out = live && j == 0;
    float bv = out && bias ? deq_elem(bias_dt, bias, n) : 0.0f, yv = 0.0f;
    float s = il1_dot<DT, D, BULK_PF >= 1, NORM>(x, K, w, live ? n : N - 1, j, nm, __float_as_uint(bv),
                                                 ADD && out ? y + n : nullptr, &yv);
    if (out) {
        if (bias) s = s + bv;
        if (ADD) s = yv + s;
        y[n] = s;
    }
}

extern "C" __global__ void matmul_f32w_il1(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                           int bias_dt, float* y) {
    matmul_float_il1<DT_F32>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void matmul_f32w_ilg(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                           int bias_dt, float* y) {
    matmul_float<DT_F32, true>(x, R, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_f16w_il1(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                           int bias_dt, float* y) {
    matmul_float_il1<DT_F16>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void matmul_f16w_ilg(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                           int bias_dt, float* y) {
    matmul_float<DT_F16, true>(x, R, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_bf16w_il1(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                            int bias_dt, float* y) {
    matmul_float_il1<DT_BF16>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void matmul_bf16w_ilg(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                            int bias_dt, float* y) {
    matmul_float<DT_BF16, true>(x, R, K, w, N, bias, bias_dt, y);
}

// `_il1` with the residual add: y [N] += x · wᵀ + bias (Backend::matmul_add for one row). Same arguments.
extern "C" __global__ void matmul_f32w_il1_add(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                               int bias_dt, float* y) {
    matmul_float_il1<DT_F32, IL1_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void matmul_f16w_il1_add(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                               int bias_dt, float* y) {
    matmul_float_il1<DT_F16, IL1_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void matmul_bf16w_il1_add(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                                int bias_dt, float* y) {
    matmul_float_il1<DT_BF16, IL1_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

// `_il1_add` at depth ADD_DEEP_DEPTH within ADD_DEEP_REGS registers (Backend::matmul_add for one row when the grid
// is small against the GPU: `CudaTuning::add_deep`). Few columns (the 1.5B's down: 768 warps, ~6
// per SM) leave each lane a long chain of dependent batches (70 vectors, 12 batches at depth 6, ~1.1 µs each): a
// deeper batch shortens the chain where registers are not what bounds the warps resident. Same arguments, same
// fmas in the same order (the batch size only moves loads).
#define ADD_DEEP_DEPTH 12
#define ADD_DEEP_REGS 255
extern "C" __global__ void __maxnreg__(ADD_DEEP_REGS)
    matmul_f32w_il1_add_d(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt, float* y) {
    matmul_float_il1<DT_F32, ADD_DEEP_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void __maxnreg__(ADD_DEEP_REGS)
    matmul_f16w_il1_add_d(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt, float* y) {
    matmul_float_il1<DT_F16, ADD_DEEP_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

extern "C" __global__ void __maxnreg__(ADD_DEEP_REGS)
    matmul_bf16w_il1_add_d(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt, float* y) {
    matmul_float_il1<DT_BF16, ADD_DEEP_DEPTH, true>(x, K, w, N, bias, bias_dt, y, blockIdx.x);
}

// Up to three interleaved weights of one type and K against the same single row in one launch (q/k/v, gate/up:
// Backend::matmul_many): the grid is the weights' one-row grids side by side, nb0 blocks for weight 0, then nb1 for
// weight 1, then the rest for weight 2; each block runs `_il1`'s code for its weight. Same outputs, same bits, one
// launch instead of three. grid (nb0 + nb1 + nb2, 1), 16 · cols threads.
template <int DT, bool NORM = false>
__device__ __forceinline__ void matmul_il1_many(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                                const u8* b0, int bdt0, float* y0, const u8* w1, int n1,
                                                const u8* b1, int bdt1, float* y1, const u8* w2, int n2,
                                                const u8* b2, int bdt2, float* y2, const NormIn& nm = {},
                                                int bx = blockIdx.x) {
    if (bx < nb0) {
        matmul_float_il1<DT, MANY_DEPTH, false, NORM>(x, K, w0, n0, b0, bdt0, y0, bx, nm);
    } else if (bx < nb0 + nb1) {
        matmul_float_il1<DT, MANY_DEPTH, false, NORM>(x, K, w1, n1, b1, bdt1, y1, bx - nb0, nm);
    } else {
        matmul_float_il1<DT, MANY_DEPTH, false, NORM>(x, K, w2, n2, b2, bdt2, y2, bx - nb0 - nb1, nm);
    }
}

// `_il1_many` of the RMSNorm of x (Backend::norm_matmul_many for one row): every block norms x into shared memory
// once (il1_norm_prologue; nw [K] of type nw_dt), then runs `_il1_many`'s blocks vb = blockIdx.x, + gridDim.x, ...
// below nvb (the host launches at most the resident blocks). The first pass is written apart from the loop so each
// copy knows whether it norms: in one loop the norm's registers stayed held through the matmul (173 registers);
// __maxnreg__ keeps 9 blocks per SM, as `_il1_many`. The arguments of `_il1_many`, then nw, nw_dt, eps, nvb.
template <int DT>
__device__ __forceinline__ void il1_many_norm(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                              const u8* b0, int bdt0, float* y0, const u8* w1, int n1, const u8* b1,
                                              int bdt1, float* y1, const u8* w2, int n2, const u8* b2, int bdt2,
                                              float* y2, const u8* nw, int nw_dt, float eps, int nvb) {
    __shared__ __align__(16) float xs[IL_NORM_MAX_K];
    matmul_il1_many<DT, true>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2,
                              NormIn{nw, nw_dt, eps, xs, false});
    for (int vb = blockIdx.x + gridDim.x; vb < nvb; vb += gridDim.x) {
        matmul_il1_many<DT, true>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2,
                                  NormIn{nw, nw_dt, eps, xs, true}, vb);
    }
}

extern "C" __global__ void __maxnreg__(112)
    matmul_f32w_il1_many_norm(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
                              float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2,
                              const u8* b2, int bdt2, float* y2, const u8* nw, int nw_dt, float eps, int nvb) {
    il1_many_norm<DT_F32>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, nw, nw_dt,
                        eps, nvb);
}

extern "C" __global__ void __maxnreg__(112)
    matmul_f16w_il1_many_norm(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
                              float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2,
                              const u8* b2, int bdt2, float* y2, const u8* nw, int nw_dt, float eps, int nvb) {
    il1_many_norm<DT_F16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, nw, nw_dt,
                        eps, nvb);
}

extern "C" __global__ void __maxnreg__(112)
    matmul_bf16w_il1_many_norm(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
                              float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2,
                              const u8* b2, int bdt2, float* y2, const u8* nw, int nw_dt, float eps, int nvb) {
    il1_many_norm<DT_BF16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, nw, nw_dt,
                        eps, nvb);
}

extern "C" __global__ void matmul_f32w_il1_many(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                                const u8* b0, int bdt0, float* y0, const u8* w1, int n1, const u8* b1,
                                                int bdt1, float* y1, const u8* w2, int n2, const u8* b2, int bdt2,
                                                float* y2) {
    matmul_il1_many<DT_F32>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2);
}

extern "C" __global__ void matmul_f16w_il1_many(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                                const u8* b0, int bdt0, float* y0, const u8* w1, int n1, const u8* b1,
                                                int bdt1, float* y1, const u8* w2, int n2, const u8* b2, int bdt2,
                                                float* y2) {
    matmul_il1_many<DT_F16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2);
}

extern "C" __global__ void matmul_bf16w_il1_many(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                                const u8* b0, int bdt0, float* y0, const u8* w1, int n1, const u8* b1,
                                                int bdt1, float* y1, const u8* w2, int n2, const u8* b2, int bdt2,
                                                float* y2) {
    matmul_il1_many<DT_BF16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2);
}


// `_il1_many` of q, k and v (weights 0, 1, 2) with `rope_kv_write` in its epilogue (Backend::norm_qkv_rope_kv_write
// for one row, after its norm): the same outputs, the same bits, one launch fewer per layer. The blocks of q and k
// compute rotation pairs instead of consecutive columns: the two half-warps of warp p compute the columns (i0, i1)
// of pair p (neox: (h·hd + i, h·hd + i + half), else (2p, 2p + 1)), each as `_il1` with its bias; the half-warps
// swap their sums and each writes its own element of the rotation with exactly `rope`'s arithmetic (two products
// and one sum or difference), k's also into the cache. v's blocks are `_il1` writing the cache too. Needs the whole
// head rotated (rot == head_dim) and an even number of columns per block; cos_t / sin_t [half] are the row's table
// rows, slot its cache slot; k_layer, v_layer [slots, n1] (n1 == n2). The arguments of `_il1_many`, then head_dim,
// half, cos_t, sin_t, neox, k_layer, v_layer, slots (slots[0] is the row's).
template <int DT, int D = MANY_DEPTH>
__device__ __forceinline__ void il1_qkv_rope(const float* x, int K, int nb0, int nb1, const u8* w0, int n0,
                                             const u8* b0, int bdt0, float* y0, const u8* w1, int n1, const u8* b1,
                                             int bdt1, float* y1, const u8* w2, int n2, const u8* b2, int bdt2,
                                             float* y2, int hd, int half, const float* cos_t, const float* sin_t,
                                             int neox, float* k_layer, float* v_layer, const u32* slots) {
    int bx = blockIdx.x;
    int hw = threadIdx.x / 16, j = threadIdx.x % 16;
    // The slot is a host upload (ordered after every earlier kernel): read before the wait inside il1_dot.
    i64 slot = (i64)slots[0];
    if (bx >= nb0 + nb1) {
        int n = (bx - nb0 - nb1) * (blockDim.x / 16) + hw;
        bool live = n < n2;
        float bv = live && j == 0 && b2 ? deq_elem(bdt2, b2, n) : 0.0f;
        float s = il1_dot<DT, D>(x, K, w2, live ? n : n2 - 1, j, {}, __float_as_uint(bv));
        if (live && j == 0) {
            if (b2) s = s + bv;
            y2[n] = s;
            v_layer[slot * n2 + n] = s;
        }
        return;
    }
    bool is_q = bx < nb0;
    int N = is_q ? n0 : n1;
    const u8* bias = is_q ? b0 : b1;
    int p = (is_q ? bx : bx - nb0) * (blockDim.x / 32) + threadIdx.x / 32;  // the warp's pair
    bool live = p < N / 2;
    int pc = live ? p : N / 2 - 1;
    int second = hw & 1;  // 0: the pair's first element (x0), 1: its second (x1)
    int i = pc % half;
    int n = neox ? (pc / half) * hd + i + second * half : 2 * pc + second;
    float c = cos_t[i], sn = sin_t[i];
    float bv = j == 0 && bias ? deq_elem(is_q ? bdt0 : bdt1, bias, n) : 0.0f;
    float s = il1_dot<DT, D>(x, K, is_q ? w0 : w1, n, j, {}, __float_as_uint(bv));
    if (j == 0 && bias) s = s + bv;
    float o = __shfl_xor_sync(FULL_MASK, s, 16);  // lane 0 of the other half-warp: the pair's other element
    float x0 = second ? o : s, x1 = second ? s : o;
    float r = second ? x0 * sn + x1 * c : x0 * c - x1 * sn;
    if (live && j == 0) {
        (is_q ? y0 : y1)[n] = r;
        if (!is_q) k_layer[slot * n1 + n] = r;
    }
}

extern "C" __global__ void __maxnreg__(112)
    matmul_f32w_il1_qkv_rope(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_F32>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, hd,
                         half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

extern "C" __global__ void __maxnreg__(112)
    matmul_f16w_il1_qkv_rope(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_F16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, hd,
                         half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

extern "C" __global__ void __maxnreg__(112)
    matmul_bf16w_il1_qkv_rope(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_BF16>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, hd,
                         half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

// `_il1_qkv_rope` for grids the default does not hold at once (Backend::norm_qkv_rope_kv_write picks it by
// occupancy): its 112 registers leave 4 warps per SM sub-partition (16,384 registers each), 16 per SM, so q/k/v of
// the 7B and 8B shapes (2,304 and 3,072 warps) ran in 1.1 and 1.5 waves, and the last blocks started their
// dependent chain of weight batches only as the first ones left (10 µs between the first and the last block past the
// wait). Depth QKV_W_DEPTH in at most 80 registers gives 6 warps per sub-partition (3,168 on an
// H200): one wave for both. The same outputs and bits (the depth only groups the loads).
#define QKV_W_DEPTH 4
extern "C" __global__ void __maxnreg__(80)
    matmul_f32w_il1_qkv_rope_w(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_F32, QKV_W_DEPTH>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2,
                                      y2, hd, half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

extern "C" __global__ void __maxnreg__(80)
    matmul_f16w_il1_qkv_rope_w(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_F16, QKV_W_DEPTH>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2,
                                      y2, hd, half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

extern "C" __global__ void __maxnreg__(80)
    matmul_bf16w_il1_qkv_rope_w(const float* x, int K, int nb0, int nb1, const u8* w0, int n0, const u8* b0, int bdt0,
        float* y0, const u8* w1, int n1, const u8* b1, int bdt1, float* y1, const u8* w2, int n2, const u8* b2,
        int bdt2, float* y2, int hd, int half, const float* cos_t, const float* sin_t, int neox, float* k_layer,
        float* v_layer, const u32* slots) {
    il1_qkv_rope<DT_BF16, QKV_W_DEPTH>(x, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2,
                                       y2, hd, half, cos_t, sin_t, neox, k_layer, v_layer, slots);
}

// glu(x · gateᵀ, x · upᵀ) for one row and interleaved gate and up [N, K] of one type, in one launch: half-warps
// 0..cols-1 of a block compute gate columns n0..n0+cols-1 and half-warps cols..2·cols-1 the up columns of the same
// n (each as `_il1`), then thread t < cols writes act(g) * u for column n0 + t with exactly `glu`'s arithmetic.
// grid (ceil(N / cols)), 32 · cols threads; act 0 = SiLU, 1 = GELU (tanh form).
template <int DT, bool NORM = false>
__device__ __forceinline__ void il1_glu(const float* x, int K, const u8* gate, const u8* up, int N, int act,
                                        float* out, const NormIn& nm = {}, int bx = blockIdx.x) {
    __shared__ float gu[64];  // [2 · cols]: the block's gate sums, then its up sums
    int cols = blockDim.x / 32;
    int half = threadIdx.x / 16, j = threadIdx.x % 16;
    bool is_up = half >= cols;
    int n = bx * cols + (is_up ? half - cols : half);
    float s = il1_dot<DT, GLU_DEPTH, BULK_PF >= 2, NORM>(x, K, is_up ? up : gate, n < N ? n : N - 1, j, nm);
    if (j == 0) gu[half] = s;
    __syncthreads();
    int t = threadIdx.x;
    int nt = bx * cols + t;
    if (t < cols && nt < N) {
        float g = gu[t];
        float a = act == 0 ? tf_silu(g) : tf_gelu_tanh(g);
        out[nt] = a * gu[cols + t];
    }
}

extern "C" __global__ void matmul_f32w_il1_glu(const float* x, int K, const u8* gate, const u8* up, int N, int act,
                                               float* out) {
    il1_glu<DT_F32>(x, K, gate, up, N, act, out);
}

extern "C" __global__ void matmul_f16w_il1_glu(const float* x, int K, const u8* gate, const u8* up, int N, int act,
                                               float* out) {
    il1_glu<DT_F16>(x, K, gate, up, N, act, out);
}

extern "C" __global__ void matmul_bf16w_il1_glu(const float* x, int K, const u8* gate, const u8* up, int N, int act,
                                                float* out) {
    il1_glu<DT_BF16>(x, K, gate, up, N, act, out);
}

// `_il1_glu` of the RMSNorm of x (Backend::norm_matmul_glu for one row), as `_il1_many_norm`: each block norms x
// once, then runs `_il1_glu`'s column groups vb = blockIdx.x, + gridDim.x, ... (80 registers: 6 blocks per SM, as
// `_il1_glu`). The arguments of `_il1_glu`, then nw, nw_dt, eps.
template <int DT>
__device__ __forceinline__ void il1_glu_norm(const float* x, int K, const u8* gate, const u8* up, int N, int act,
                                             float* out, const u8* nw, int nw_dt, float eps) {
    __shared__ __align__(16) float xs[IL_NORM_MAX_K];
    int cols = blockDim.x / 32;
    int nvb = (N + cols - 1) / cols;
    il1_glu<DT, true>(x, K, gate, up, N, act, out, NormIn{nw, nw_dt, eps, xs, false});
    for (int vb = blockIdx.x + gridDim.x; vb < nvb; vb += gridDim.x) {
        __syncthreads();  // the block's gate/up sums are read before the next pass writes them
        il1_glu<DT, true>(x, K, gate, up, N, act, out, NormIn{nw, nw_dt, eps, xs, true}, vb);
    }
}

extern "C" __global__ void __maxnreg__(80) matmul_f32w_il1_glu_norm(const float* x, int K, const u8* gate,
                                                                     const u8* up, int N, int act, float* out,
                                                                     const u8* nw, int nw_dt, float eps) {
    il1_glu_norm<DT_F32>(x, K, gate, up, N, act, out, nw, nw_dt, eps);
}

extern "C" __global__ void __maxnreg__(80) matmul_f16w_il1_glu_norm(const float* x, int K, const u8* gate,
                                                                     const u8* up, int N, int act, float* out,
                                                                     const u8* nw, int nw_dt, float eps) {
    il1_glu_norm<DT_F16>(x, K, gate, up, N, act, out, nw, nw_dt, eps);
}

extern "C" __global__ void __maxnreg__(80) matmul_bf16w_il1_glu_norm(const float* x, int K, const u8* gate,
                                                                     const u8* up, int N, int act, float* out,
                                                                     const u8* nw, int nw_dt, float eps) {
    il1_glu_norm<DT_BF16>(x, K, gate, up, N, act, out, nw, nw_dt, eps);
}

// Interleaves a float tensor in place at upload: w holds nblk blocks of 256 bytes (16·epv elements of 16 / epv
// bytes each); thread j of each half-warp reads lane j's elements 16t + j of its block, the half-warp syncs, and
// the thread writes them as the block's j-th 16-byte vector. grid (ceil(16 nblk / 256)), 256 threads.
extern "C" __global__ void interleave_rows(u8* w, i64 nblk, int epv) {
    i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    i64 b = g / 16;
    int j = (int)(g % 16);
    bool live = b < nblk;
    u32 v[4] = {0u, 0u, 0u, 0u};
    if (live) {
        if (epv == 4) {
            const u32* src = (const u32*)(w + b * 256);
            for (int t = 0; t < 4; t++) v[t] = src[16 * t + j];
        } else {
            const u16* src = (const u16*)(w + b * 256);
            for (int t = 0; t < 8; t++) v[t / 2] |= (u32)src[16 * t + j] << (16 * (t % 2));
        }
    }
    __syncwarp();
    if (live) ((uint4*)(w + b * 256))[j] = make_uint4(v[0], v[1], v[2], v[3]);
}

