// Matmul kernels: y [R, N] = x [R, K] · wᵀ (+ bias) for w [N, K] in its GGUF block format, bit-equal to
// tf_quant::reference::matmul::matmul_ref. Every output (r, n) is computed by one fixed instruction sequence
// that reads only row r of the activations: row groups only share weight loads, never arithmetic.

// Rows per group in the kernels below (accumulators held per row; a group shorter than this skips the rest).
#define FULL_ROWS 8
#define QUANT_ROWS 4

// ---- activation quantization (reference::matmul::quantize_block / quantize_row) ------------------------------

// One warp per (block b, row r): grid (K / block, R), 32 threads. x [R, K] f32 → q [R, K] i8, d [R, K / block],
// sums [R, K / sum_group] (sum_group = 32 for 32-element blocks, 16 for 256-element blocks).
// Launched with PDL: everything it reads was written by earlier kernels, so it waits first.
extern "C" __global__ void quantize_rows(const float* x, int K, int block, i8* q, float* d, i16* sums) {
    griddep_wait();
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
