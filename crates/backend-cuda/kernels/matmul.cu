// Matmul kernels: y [R, N] = x [R, K] · wᵀ (+ bias) for w [N, K] in its GGUF block format, bit-equal to
// tf_quant::reference::matmul::matmul_ref. Every output (r, n) is computed by one fixed instruction sequence
// that reads only row r of the activations: row groups only share weight loads, never arithmetic.

// Rows per group in the kernels below (accumulators held per row; a group shorter than this skips the rest).
#define FULL_ROWS 8
#define QUANT_ROWS 4

// ---- activation quantization (reference::matmul::quantize_block / quantize_row) ------------------------------

// One warp per (block b, row r): grid (K / block, R), 32 threads. x [R, K] f32 → q [R, K] i8, d [R, K / block],
// sums [R, K / sum_group] (sum_group = 32 for 32-element blocks, 16 for 256-element blocks).
extern "C" __global__ void quantize_rows(const float* x, int K, int block, i8* q, float* d, i16* sums) {
    int b = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
    int per = block / 32;  // 1 or 8 elements per lane
    const float* xb = x + (i64)r * K + (i64)b * block;
    float v[8];
    float amax = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t < per) {
            v[t] = xb[lane * per + t];
            float a = fabsf(v[t]);
            if (a > amax) amax = a;
        }
    }
    // max is exact and order-free over non-NaN values (NaN never wins a `>` comparison).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(FULL_MASK, amax, off);
        if (o > amax) amax = o;
    }
    float dd = amax / 127.0f;
    float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    int s = 0;
    i8* qb = q + (i64)r * K + (i64)b * block;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t < per) {
            float rr = roundf(v[t] * id);
            int qi;
            if (rr != rr) {
                qi = 0;
            } else {
                qi = (int)fminf(fmaxf(rr, -127.0f), 127.0f);
            }
            qb[lane * per + t] = (i8)qi;
            s += qi;
        }
    }
    int nblocks = K / block;
    if (lane == 0) d[(i64)r * nblocks + b] = dd;
    if (block == 32) {
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(FULL_MASK, s, off);
        if (lane == 0) sums[(i64)r * nblocks + b] = (i16)s;
    } else {
        // groups of 16 = two lanes of 8
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        if ((lane & 1) == 0) sums[(i64)r * (K / 16) + (i64)b * 16 + lane / 2] = (i16)s;
    }
}

// ---- full precision: dot16(x[r], dequantize(w[n])) --------------------------------------------------------------

// Half-warp per (column n, group of FULL_ROWS rows); lane j of the half-warp is lane accumulator j of dot16.
// grid (ceil(N / 8), ceil(R / FULL_ROWS)), 128 threads (8 half-warps = 8 columns).
extern "C" __global__ void matmul_full(const float* x, int R, int K, const u8* w, int dt, int N, const u8* bias,
                                       int bias_dt, float* y) {
    int half = threadIdx.x / 16, j = threadIdx.x % 16;
    int n = blockIdx.x * 8 + half;
    int r0 = blockIdx.y * FULL_ROWS;
    int nr = min(FULL_ROWS, R - r0);
    bool live = n < N;
    int nn = live ? n : N - 1;  // dead half-warps shadow a real column so every lane reaches the shuffles
    i64 row_bytes = (i64)(K / block_elems(dt)) * block_bytes(dt);
    const u8* wr = w + (i64)nn * row_bytes;
    float acc[FULL_ROWS];
#pragma unroll
    for (int t = 0; t < FULL_ROWS; t++) acc[t] = 0.0f;
    for (int i = j; i < K; i += 16) {
        float wv = deq_elem(dt, wr, i);
#pragma unroll
        for (int t = 0; t < FULL_ROWS; t++) {
            if (t < nr) acc[t] = fmaf(x[(i64)(r0 + t) * K + i], wv, acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < FULL_ROWS; t++) {
        float s = tree16(acc[t]);
        if (live && j == 0 && t < nr) {
            if (bias) s = s + deq_elem(bias_dt, bias, n);
            y[(i64)(r0 + t) * N + n] = s;
        }
    }
}

// Float weights (F32, F16, BF16): the arithmetic of matmul_full with the weight type fixed at compile time and
// FLOAT_UNROLL weight loads issued ahead of each lane's fma chains (the chains themselves stay element by element
// in increasing order). Decode has few outputs per matrix and the canonical order allows only 16 threads per
// output, so memory parallelism comes from this depth. Each block loops over up to FLOAT_ROWS rows in groups of
// FLOAT_GROUP, so a weight row comes from DRAM once per block and later groups read it from cache.
// grid (ceil(N / 8), ceil(R / FLOAT_ROWS)), 128 threads.
#define FLOAT_UNROLL 32
#define FLOAT_GROUP 16
#define FLOAT_ROWS 64

template <int DT>
__device__ __forceinline__ float ld_w(const u8* row, int i) {
    // Rows of float weights are aligned to their element size (the buffer is, and a row is K whole elements).
    if (DT == DT_F32) return ((const float*)row)[i];
    if (DT == DT_F16) return f16_bits_to_f32(((const u16*)row)[i]);
    return bf16_bits_to_f32(((const u16*)row)[i]);
}

// ld_w through the read-only path without allocating in L1.
template <int DT>
__device__ __forceinline__ float ld_w_stream(const u8* row, int i) {
    if (DT == DT_F32) {
        float v;
        asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"((const float*)row + i));
        return v;
    }
    unsigned short h;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(h) : "l"((const u16*)row + i));
    return DT == DT_F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
}

// Where logical element i of a row is stored: at i, or with IL (rows interleaved, il_index in common.cu) element
// 16t + j of each 16·EPV-element block at EPV·j + t of that block (lane j's chain elements side by side).
template <int DT, bool IL>
__device__ __forceinline__ int w_at(int i) {
    if (!IL) return i;
    const int EPV = DT == DT_F32 ? 4 : 8;
    const int BLK = 16 * EPV;
    int b = i / BLK, e = i % BLK;
    return b * BLK + (e % 16) * EPV + e / 16;
}

template <int DT, bool IL>
__device__ void matmul_float(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt,
                             float* y) {
    int half = threadIdx.x / 16, j = threadIdx.x % 16;
    int n = blockIdx.x * 8 + half;
    bool live = n < N;
    int nn = live ? n : N - 1;
    const u8* wr = w + (i64)nn * K * (DT == DT_F32 ? 4 : 2);
    int rend = min(R, (int)(blockIdx.y + 1) * FLOAT_ROWS);
    for (int r0 = blockIdx.y * FLOAT_ROWS; r0 < rend; r0 += FLOAT_GROUP) {
        int nr = min(FLOAT_GROUP, rend - r0);
        const float* xr = x + (i64)r0 * K;
        float acc[FLOAT_GROUP];
#pragma unroll
        for (int t = 0; t < FLOAT_GROUP; t++) acc[t] = 0.0f;
        if (nr == 1) {
            // The weights bypass L1 and the activations they meet are loaded before the first fma (else each fma
            // waits on its activation's round trip; see the interleaved kernels below).
            int i = j;
            for (; i + 16 * (FLOAT_UNROLL - 1) < K; i += 16 * FLOAT_UNROLL) {
                float wv[FLOAT_UNROLL], xv[FLOAT_UNROLL];
#pragma unroll
                for (int u = 0; u < FLOAT_UNROLL; u++) wv[u] = ld_w_stream<DT>(wr, w_at<DT, IL>(i + 16 * u));
#pragma unroll
                for (int u = 0; u < FLOAT_UNROLL; u++) xv[u] = xr[i + 16 * u];
#pragma unroll
                for (int u = 0; u < FLOAT_UNROLL; u++) acc[0] = fmaf(xv[u], wv[u], acc[0]);
            }
            for (; i < K; i += 16) acc[0] = fmaf(xr[i], ld_w<DT>(wr, w_at<DT, IL>(i)), acc[0]);
        } else {
            int i = j;
            for (; i + 16 * (FLOAT_UNROLL - 1) < K; i += 16 * FLOAT_UNROLL) {
                float wv[FLOAT_UNROLL];
#pragma unroll
                for (int u = 0; u < FLOAT_UNROLL; u++) wv[u] = ld_w<DT>(wr, w_at<DT, IL>(i + 16 * u));
#pragma unroll
                for (int u = 0; u < FLOAT_UNROLL; u++) {
#pragma unroll
                    for (int t = 0; t < FLOAT_GROUP; t++) {
                        if (t < nr) acc[t] = fmaf(xr[(i64)t * K + i + 16 * u], wv[u], acc[t]);
                    }
                }
            }
            for (; i < K; i += 16) {
                float wv = ld_w<DT>(wr, w_at<DT, IL>(i));
#pragma unroll
                for (int t = 0; t < FLOAT_GROUP; t++) {
                    if (t < nr) acc[t] = fmaf(xr[(i64)t * K + i], wv, acc[t]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < FLOAT_GROUP; t++) {
            float s = tree16(acc[t]);
            if (live && j == 0 && t < nr) {
                if (bias) s = s + deq_elem(bias_dt & ~EPI_ADD, bias, n);
                if (bias_dt & EPI_ADD) s = y[(i64)(r0 + t) * N + n] + s;
                y[(i64)(r0 + t) * N + n] = s;
            }
        }
    }
}

extern "C" __global__ void matmul_f32w(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt,
                                       float* y) {
    matmul_float<DT_F32, false>(x, R, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_f16w(const float* x, int R, int K, const u8* w, int N, const u8* bias, int bias_dt,
                                       float* y) {
    matmul_float<DT_F16, false>(x, R, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_bf16w(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                        int bias_dt, float* y) {
    matmul_float<DT_BF16, false>(x, R, K, w, N, bias, bias_dt, y);
}

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
// GLU_DEPTH (NVRTC defines, src/device.rs) are for measurements (docs/perf-notes-cuda.md).
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
// MANY_DEPTH (measurement): the depth of `_il1_many` (q/k/v) alone; by default IL1_DEPTH. Registers bound how
// many threads of these kernels fit on the GPU at once (110 registers: 18 warps per SM; 142: 14, fewer than the
// 7B's q/k/v needs in one wave), so its best depth can differ from o's and down's.
#ifndef MANY_DEPTH
#define MANY_DEPTH IL1_DEPTH
#endif
// BULK_PF (measurement, sm_90 only): 1 = the `_il1` / `_il1_many` kernels ask L2 for each weight row past the
// first batch with one bulk prefetch before griddep_wait; 2 = the GLU kernel too. 0 (default): no prefetch.
#ifndef BULK_PF
#define BULK_PF 0
#endif

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
#ifndef PRO_N
#define PRO_N 8
#endif
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
// so every thread of the block must call this), and the activations are read from there.
template <int DT, int D, bool PF = false, bool NORM = false>
__device__ __forceinline__ float il1_dot(const float* x, int K, const u8* w, int nn, int j, const NormIn& nm = {}) {
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
    // Measurement knob: lane 0 asks L2 for the rest of the row in one bulk prefetch (sm_90's copy engine, one
    // instruction, no registers) while the previous kernel still runs.
    if (PF && j == 0 && nb > D) {
        const u8* rest = (const u8*)(wq - j + 16 * D);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(rest), "r"((u32)((nb - D) * 256)) : "memory");
    }
#endif
    // Launched early (PDL): the first weights are on their way; x is the previous kernel's output.
    griddep_wait();
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
    float s = il1_dot<DT, D, BULK_PF >= 1, NORM>(x, K, w, live ? n : N - 1, j, nm);
    if (live && j == 0) {
        if (bias) s = s + deq_elem(bias_dt, bias, n);
        if (ADD) s = y[n] + s;
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

// ---- checkpoint precision: per-block integer dots folded in block order -----------------------------------------

// Four bytes at a 2-byte aligned address (blocks of 18, 34 and 210 bytes are only 2-byte aligned).
__device__ __forceinline__ u32 ld2_u32(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// The float update of one weight block with its activation block: acc = fma(f1, s1, acc), then (when two) acc =
// fma(f2, s2, acc) (CheckpointBlock::update of each type).
struct Terms {
    float f1, f2;
    int s1, s2;
};

// Block `blk` of type `dt` against activation block qx (i8 [32 or 256]), its scale dx and group sums. For the
// 256-element types only elements [e0, e1) (whole 32-element slices) enter the integer sums s1, s2: the sums of the
// slices add up to the reference's integers exactly. 32-element types always take the whole block.
__device__ Terms block_terms(int dt, const u8* blk, const i8* qx, float dx, const i16* sums, int e0, int e1) {
    Terms t;
    t.f2 = 0.0f;
    t.s2 = 0;
    switch (dt) {
        // Integer sums by __dp4a (four int8 products added exactly); activation blocks are 32-byte aligned.
        case DT_Q4_0: {
            // Σ (q - 8)·x = Σ q·x - 8·Σ x, the same integer.
            const int* xw = (const int*)qx;
            int s = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 w4 = ld2_u32(blk + 2 + 4 * k);
                s = __dp4a((int)(w4 & 0x0f0f0f0fu), xw[k], s);
                s = __dp4a((int)((w4 >> 4) & 0x0f0f0f0fu), xw[4 + k], s);
            }
            t.f1 = ld_f16(blk) * dx;
            t.s1 = s - 8 * (int)sums[0];
            break;
        }
        case DT_Q4_1: {
            const int* xw = (const int*)qx;
            int s = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 w4 = ld_u32(blk + 4 + 4 * k);
                s = __dp4a((int)(w4 & 0x0f0f0f0fu), xw[k], s);
                s = __dp4a((int)((w4 >> 4) & 0x0f0f0f0fu), xw[4 + k], s);
            }
            t.f1 = ld_f16(blk) * dx;
            t.s1 = s;
            t.f2 = ld_f16(blk + 2) * dx;
            t.s2 = sums[0];
            break;
        }
        case DT_Q5_0: {
            u32 qh = ld_u32(blk + 2);
            int s = 0;
            for (int i = 0; i < 32; i++) s += (nib32(blk + 6, i) + 16 * (int)((qh >> i) & 1) - 16) * qx[i];
            t.f1 = ld_f16(blk) * dx;
            t.s1 = s;
            break;
        }
        case DT_Q5_1: {
            u32 qh = ld_u32(blk + 4);
            int s = 0;
            for (int i = 0; i < 32; i++) s += (nib32(blk + 8, i) + 16 * (int)((qh >> i) & 1)) * qx[i];
            t.f1 = ld_f16(blk) * dx;
            t.s1 = s;
            t.f2 = ld_f16(blk + 2) * dx;
            t.s2 = sums[0];
            break;
        }
        case DT_Q8_0:
        case DT_Q8_1: {
            const u8* qs = blk + (dt == DT_Q8_0 ? 2 : 4);
            const int* xw = (const int*)qx;
            int s = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) s = __dp4a((int)ld2_u32(qs + 4 * k), xw[k], s);
            t.f1 = ld_f16(blk) * dx;
            t.s1 = s;
            break;
        }
        case DT_Q2K: {
            int S = 0, M = 0;
            for (int j = e0 / 16; j < e1 / 16; j++) {
                int sub = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++) sub += crumb(blk + 16, i) * qx[i];
                S += (blk[j] & 15) * sub;
                M += (blk[j] >> 4) * sums[j];
            }
            t.f1 = ld_f16(blk + 80) * dx;
            t.s1 = S;
            t.f2 = -(ld_f16(blk + 82) * dx);
            t.s2 = M;
            break;
        }
        case DT_Q3K: {
            int S = 0;
            for (int j = e0 / 16; j < e1 / 16; j++) {
                int sub = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++) {
                    int q = crumb(blk + 32, i) + 4 * ((blk[i % 32] >> (i / 32)) & 1) - 4;
                    sub += q * qx[i];
                }
                S += q3k_scale(blk + 96, j) * sub;
            }
            t.f1 = ld_f16(blk + 108) * dx;
            t.s1 = S;
            break;
        }
        case DT_Q4K:
        case DT_Q5K: {
            int S = 0, M = 0;
            const u8* qs = blk + (dt == DT_Q4K ? 16 : 48);
            for (int j = e0 / 32; j < e1 / 32; j++) {
                // Slice j: bytes qs[32 (j / 2) + l] at nibble j % 2 (16-byte aligned: blocks of 144 and 176 bytes).
                const u32* qw = (const u32*)(qs + 32 * (j / 2));
                const u32* hw = (const u32*)(blk + 16);
                const int* xw = (const int*)(qx + 32 * j);
                int sh = 4 * (j % 2);
                int sub = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    u32 q4 = (qw[k] >> sh) & 0x0f0f0f0fu;
                    if (dt == DT_Q5K) q4 |= ((hw[k] >> j) & 0x01010101u) << 4;
                    sub = __dp4a((int)q4, xw[k], sub);
                }
                S += q4k_scale(blk + 4, j) * sub;
                M += q4k_min(blk + 4, j) * ((int)sums[2 * j] + (int)sums[2 * j + 1]);
            }
            t.f1 = ld_f16(blk) * dx;
            t.s1 = S;
            t.f2 = -(ld_f16(blk + 2) * dx);
            t.s2 = M;
            break;
        }
        case DT_Q6K: {
            int S = 0;
            for (int j = e0 / 16; j < e1 / 16; j++) {
                // Sub-block j: elements 16j.. with h = j / 8, t = (j % 8) / 4, l = 16 (j % 2) ..: low nibbles at
                // ql[64 h + 32 (t % 2) + l] >> 4 (t / 2), high bits at qh[32 h + l] >> 2 t; Σ (q - 32)·x =
                // Σ q·x - 32·Σ x (sums[j]), the same integer.
                int e = 16 * j;
                int h = e / 128, tt = (e % 128) / 32, l = e % 32;
                const u8* ql = blk + 64 * h + 32 * (tt % 2) + l;
                const u8* qh = blk + 128 + 32 * h + l;
                const int* xw = (const int*)(qx + e);
                int sub = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 lo = (ld2_u32(ql + 4 * k) >> (4 * (tt / 2))) & 0x0f0f0f0fu;
                    u32 hi = (ld2_u32(qh + 4 * k) >> (2 * tt)) & 0x03030303u;
                    sub = __dp4a((int)(lo | (hi << 4)), xw[k], sub);
                }
                sub -= 32 * (int)sums[j];
                S += (int)(i8)blk[192 + j] * sub;
            }
            t.f1 = ld_f16(blk + 208) * dx;
            t.s1 = S;
            break;
        }
        default: {  // DT_Q8K
            int s = 0;
            for (int i = e0; i < e1; i++) s += (int)(i8)blk[4 + i] * qx[i];
            t.f1 = __uint_as_float(ld_u32(blk)) * dx;
            t.s1 = s;
            break;
        }
    }
    return t;
}

__device__ __forceinline__ bool two_terms(int dt) {
    return dt == DT_Q4_1 || dt == DT_Q5_1 || dt == DT_Q2K || dt == DT_Q4K || dt == DT_Q5K;
}

// Warp per (column n, group of QUANT_ROWS rows). 32-element blocks: lane l computes the terms of block 32c + l.
// 256-element blocks: the 8 lanes of group g share block 4c + g, each summing one 32-element slice, and their
// integer sums are added across the group (exact). Then every lane folds the chunk's blocks in increasing order
// (the same values in every lane). grid (N, ceil(R / QUANT_ROWS)), 32 threads. q/d/sums from quantize_rows with
// block = block_elems(dt).
extern "C" __global__ void matmul_quant(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w,
                                        int dt, int N, const u8* bias, int bias_dt, float* y) {
    int n = blockIdx.x, lane = threadIdx.x;
    int r0 = blockIdx.y * QUANT_ROWS;
    int nr = min(QUANT_ROWS, R - r0);
    int be = block_elems(dt), bb = block_bytes(dt);
    int nblocks = K / be;
    bool big = be == 256;
    int per = big ? 4 : 32;              // blocks per chunk
    int mine = big ? lane / 8 : lane;    // this lane's block within the chunk
    int e0 = big ? 32 * (lane % 8) : 0;  // and its slice
    int e1 = big ? e0 + 32 : 32;
    int src = big ? 8 : 1;               // lane stride between the chunk's blocks
    int groups = big ? 16 : 1;           // sums per block
    const u8* wr = w + (i64)n * nblocks * bb;
    bool two = two_terms(dt);
    float acc[QUANT_ROWS];
#pragma unroll
    for (int t = 0; t < QUANT_ROWS; t++) acc[t] = 0.0f;
    for (int c = 0; c < nblocks; c += per) {
        int b = c + mine;
        Terms tm[QUANT_ROWS];
#pragma unroll
        for (int t = 0; t < QUANT_ROWS; t++) {
            if (t < nr && b < nblocks) {
                i64 r = r0 + t;
                tm[t] = block_terms(dt, wr + (i64)b * bb, q + r * K + (i64)b * be, d[r * nblocks + b],
                                    sums + (r * nblocks + b) * groups, e0, e1);
            } else {
                tm[t].f1 = 0.0f;
                tm[t].f2 = 0.0f;
                tm[t].s1 = 0;
                tm[t].s2 = 0;
            }
            if (big) {
#pragma unroll
                for (int off = 1; off < 8; off <<= 1) {
                    tm[t].s1 += __shfl_xor_sync(FULL_MASK, tm[t].s1, off);
                    tm[t].s2 += __shfl_xor_sync(FULL_MASK, tm[t].s2, off);
                }
            }
        }
        int cnt = min(per, nblocks - c);
        for (int k = 0; k < cnt; k++) {
#pragma unroll
            for (int t = 0; t < QUANT_ROWS; t++) {
                float f1 = __shfl_sync(FULL_MASK, tm[t].f1, k * src);
                int s1 = __shfl_sync(FULL_MASK, tm[t].s1, k * src);
                float f2 = __shfl_sync(FULL_MASK, tm[t].f2, k * src);
                int s2 = __shfl_sync(FULL_MASK, tm[t].s2, k * src);
                acc[t] = fmaf(f1, (float)s1, acc[t]);
                if (two) acc[t] = fmaf(f2, (float)s2, acc[t]);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < QUANT_ROWS; t++) {
            if (t < nr) {
                float s = acc[t];
                if (bias) s = s + deq_elem(bias_dt, bias, n);
                y[(i64)(r0 + t) * N + n] = s;
            }
        }
    }
}
