// Tensor-core matmul of the `tensor` arithmetic (docs/cuda.md, "Arithmetic: tensor"): y [R, N] = x [R, K] · wᵀ
// (+ bias) for w [N, K] in BF16 or F16, by mma.sync.aligned.m16n8k16 with f32 accumulators. Not equal to the
// portable kernels (activations are rounded to the weight type, and the tensor core sums 16 products its own way),
// but row-exact: the value of output (r, n) is fixed by row r of x, column n of w and K, never by R.
//
// The arithmetic of one output (r, n), the same in every kernel below and for every row count:
// - x[r, k] is rounded to bf16 (f16 for F16 weights) by one cvt.rn per element (round to nearest even).
// - K is cut into chunks of MMA_CHUNK = 32 elements (K % 32 == 0; other shapes take the portable kernel). Chunk c
//   is two mma k-steps: step 0 holds the elements 32c + 8q + {0, 1, 2, 3}, step 1 the elements 32c + 8q + {4, 5,
//   6, 7}, for q = 0..3 (a fixed permutation of the chunk, the same for x and w, so each step is a 16-element dot
//   product; it lets a thread load 8 consecutive elements at once).
// - Chunk c belongs to K-part c % MMA_SPLIT. Part p accumulates its chunks in increasing order, step 0 then step 1,
//   acc = mma(a, b, acc) from acc = 0, in one warp.
// - y = ((part 0 + part 1) + part 2) + part 3 (plain f32 additions), then + bias.
// The mma's own 16-product sum depends only on the 16 (x, w) pairs of that output and its accumulator input: a row
// of the 16-row MMA tile never enters another row's outputs. Rows past R are zeros (padding) and are not stored; a
// one-row window runs exactly the instructions of row 0 of a full tile.
//
// Kernels differ only in how outputs are grouped (which outputs share weight and activation loads): `_s` for up to
// 16 rows (one 16-row tile, two 8-column tiles per warp, two column groups per block; `_sn` one tile per block for
// narrow matrices, `_s_many` for several weights, `_s_glu` with the GLU), `_l` for more (four row tiles and four
// column tiles per warp). The grouping never changes an output's arithmetic; tests/tensor.rs checks that rows
// alone and rows in windows of 2..256 (every kernel) are bitwise equal.

#define MMA_CHUNK 32
#define MMA_SPLIT 4

// Two floats rounded to the weight type and packed (lo in bits 0..15), as one cvt.rn.{bf16x2,f16x2}.f32.
template <bool F16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 d = 0;
#if __CUDA_ARCH__ >= 800
    if (F16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    }
#else
    __trap();
#endif
    return d;
}

// acc [4] += A [16, 16] · B [16, 8] for this lane's fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
// g = lane / 4, q = lane % 4; a0 = (row g, k 2q..2q+1), a1 = (row g+8, k 2q..), a2 = (row g, k 2q+8..), a3 = (row
// g+8, k 2q+8..); b0 = (k 2q..2q+1, col g), b1 = (k 2q+8..2q+9, col g); acc = (row g, cols 2q, 2q+1), (row g+8,
// cols 2q, 2q+1).
template <bool F16>
__device__ __forceinline__ void mma16816(float* acc, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    if (F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
#else
    __trap();
#endif
}

// One output's y = ((part 0 + part 1) + part 2) + part 3 (the header's merge), its parts `stride` floats apart.
__device__ __forceinline__ float sum_parts(const float* src, int stride) {
    float v = src[0];
#pragma unroll
    for (int s = 1; s < MMA_SPLIT; s++) v = v + src[s * stride];
    return v;
}

// Block: NB × MMA_SPLIT warps; warp (nb, p) = (warp / MMA_SPLIT, warp % MMA_SPLIT) computes K-part p of the MT row
// tiles blockIdx.y·MT.. and the NT column tiles (blockIdx.x·NB + nb)·NT.., loading the weight fragments of U chunks
// one round ahead. grid (ceil(N / (8·NT·NB)), ceil(R / (16·MT))), 32·NB·MMA_SPLIT threads.
// x [R, K] f32, w [N, K] bf16/f16 bits, bias [N] of type bias_dt (or null), y [R, N] f32.
template <bool F16, int MT, int NT, int NB, int U>
__device__ void mma_matmul(const float* x, int R, int K, const u16* w, int N, const u8* bias, int bias_dt,
                           float* y) {
    // parts [NB, MMA_SPLIT, MT·NT tiles, 32 lanes, 4]: every warp's accumulators, merged in part order at the end.
    __shared__ float parts[NB * MMA_SPLIT * MT * NT * 128];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nb = warp / MMA_SPLIT, p = warp % MMA_SPLIT;
    int g = lane >> 2, q = lane & 3;
    int tn0 = (blockIdx.x * NB + nb) * NT;  // first column tile of this warp
    int tm0 = blockIdx.y * MT;              // first row tile of this block
    int chunks = K / MMA_CHUNK;
    // This lane's weight column of each column tile (past N: the last column, computed and dropped), at element 8q
    // of chunk 0; chunk c is 4 uint4 further per chunk.
    const uint4* wp[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int n = min(8 * (tn0 + nt) + g, N - 1);
        wp[nt] = (const uint4*)(w + (i64)n * K + 8 * q);
    }
    // This lane's activation rows g and g + 8 of each row tile, at element 8q (null past R: padding zeros).
    const float* xp[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = 16 * (tm0 + mt) + g + 8 * h;
            xp[mt][h] = r < R ? x + (i64)r * K + 8 * q : nullptr;
        }
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[mt][nt][j] = 0.0f;

    const int stride = MMA_SPLIT * U;  // chunks per round of this part
    uint4 cur[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = p + MMA_SPLIT * u;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) cur[u][nt] = c < chunks ? __ldg(wp[nt] + 4 * c) : make_uint4(0, 0, 0, 0);
    }
    for (int c0 = p; c0 < chunks; c0 += stride) {
        uint4 nxt[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + stride + MMA_SPLIT * u;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) nxt[u][nt] = c < chunks ? __ldg(wp[nt] + 4 * c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + MMA_SPLIT * u;
            if (c < chunks) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (16 * (tm0 + mt) < R) {
                        // a[h][i]: row g + 8h, elements 32c + 8q + 2i, +1, rounded and packed.
                        u32 a[2][4];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            if (xp[mt][h]) {
                                const float4* xv = (const float4*)(xp[mt][h] + MMA_CHUNK * c);
                                float4 lo = xv[0], hi = xv[1];
                                a[h][0] = pack2<F16>(lo.x, lo.y);
                                a[h][1] = pack2<F16>(lo.z, lo.w);
                                a[h][2] = pack2<F16>(hi.x, hi.y);
                                a[h][3] = pack2<F16>(hi.z, hi.w);
                            } else {
                                a[h][0] = a[h][1] = a[h][2] = a[h][3] = 0u;
                            }
                        }
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            uint4 b = cur[u][nt];
                            // step 0: elements 8q + {0, 1} as k 2q.., 8q + {2, 3} as k 2q + 8..
                            mma16816<F16>(acc[mt][nt], a[0][0], a[1][0], a[0][1], a[1][1], b.x, b.y);
                            // step 1: elements 8q + {4, 5} as k 2q.., 8q + {6, 7} as k 2q + 8..
                            mma16816<F16>(acc[mt][nt], a[0][2], a[1][2], a[0][3], a[1][3], b.z, b.w);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) cur[u][nt] = nxt[u][nt];
    }

    const int per = MT * NT * 128;  // floats per warp in `parts`
    float* mine = parts + (nb * MMA_SPLIT + p) * per;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) mine[((mt * NT + nt) * 32 + lane) * 4 + j] = acc[mt][nt][j];
    __syncthreads();
    for (int e = threadIdx.x; e < NB * per; e += blockDim.x) {
        int b = e / per, t = e % per;
        const float* src = parts + b * MMA_SPLIT * per + t;
        float v = sum_parts(src, per);
        int tile = t / 128, ln = (t / 4) % 32, j = t % 4;
        int mt = tile / NT, nt = tile % NT;
        int row = 16 * (tm0 + mt) + (ln >> 2) + 8 * (j >> 1);
        int col = 8 * ((blockIdx.x * NB + b) * NT + nt) + 2 * (ln & 3) + (j & 1);
        if (row < R && col < N) {
            if (bias) v = v + deq_elem(bias_dt & ~EPI_ADD, bias, col);
            if (bias_dt & EPI_ADD) v = y[(i64)row * N + col] + v;
            y[(i64)row * N + col] = v;
        }
    }
}

// Up to 16 rows (decode steps, verify windows, small shared rounds): one 16-row tile, streamed like the one-row
// float kernels (kernels/matmul.cu, `_il1`). Block: NB column groups × MMA_SPLIT warps; warp (nb, p) computes
// K-part p of NT column tiles of 8 columns. Weights go through ld_stream (not allocated in L1: read once), U chunks
// × NT tiles ahead, and the first batch is requested before griddep_wait() (launched with programmatic dependence,
// src/device.rs); the activations (read by every column group, rows ≥ R never) are loaded for U chunks before
// their mma steps. The arithmetic is the header's; only the grouping differs from `mma_matmul`.
// GLU: NT = 2 and tile 1 is `w_up`'s rows for tile 0's columns of `w` (the gate); the block then writes
// act(gate) · up for those columns with exactly `glu`'s arithmetic (kernels/ops.cu) instead of two outputs.
// XH (the `_h` kernels, for windows whose x comes with a copy): xh is x already rounded to the weight type
// (round_half, written by the kernel that produced x), read instead of x: the same a-fragments from half the bytes.
// yh (GLU, may be null): the outputs rounded likewise, for the down-projection.
// bx: this block's index among the weight's blocks; grid of one weight ceil(N / (8·NT·NB)) (GLU: ceil(N / (8·NB))),
// 32·NB·MMA_SPLIT threads.
#define MMA_S_NT 2
#define MMA_S_NB 2
#define MMA_S_U 4
template <bool F16, int NT, int NB, int U, bool GLU, bool XH = false>
__device__ __forceinline__ void mma_small(const float* x, int R, int K, const u16* w, const u16* w_up, int N,
                                          const u8* bias, int bias_dt, float* y, int act, int bx, const u16* xh,
                                          u16* yh) {
    // parts [NB, MMA_SPLIT, NT tiles, 32 lanes, 4]: every warp's accumulators, merged in part order at the end.
    __shared__ float parts[NB * MMA_SPLIT * NT * 128];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nb = warp / MMA_SPLIT, p = warp % MMA_SPLIT;
    int g = lane >> 2, q = lane & 3;
    int chunks = K / MMA_CHUNK;
    // This lane's weight column of each tile (past N: the last column, computed and dropped), at element 8q of
    // chunk 0; chunk c is 4 uint4 further per chunk.
    const uint4* wp[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int tile = GLU ? bx * NB + nb : (bx * NB + nb) * NT + nt;
        int n = min(8 * tile + g, N - 1);
        const u16* base = GLU && (nt & 1) ? w_up : w;
        wp[nt] = (const uint4*)(base + (i64)n * K + 8 * q);
    }
    const int stride = MMA_SPLIT * U;  // chunks per round of this part
    griddep_launch();
    uint4 cur[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = p + MMA_SPLIT * u;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) cur[u][nt] = c < chunks ? ld_stream(wp[nt] + 4 * c) : make_uint4(0, 0, 0, 0);
    }
    // The previous kernel wrote x: wait for it only now, with the first weights on their way.
    griddep_wait();
    // This lane's activation rows g and g + 8 at element 8q (null past R: padding zeros).
    const float* xp0 = g < R ? x + (i64)g * K + 8 * q : nullptr;
    const float* xp1 = g + 8 < R ? x + (i64)(g + 8) * K + 8 * q : nullptr;
    const u16* xq0 = XH && g < R ? xh + (i64)g * K + 8 * q : nullptr;
    const u16* xq1 = XH && g + 8 < R ? xh + (i64)(g + 8) * K + 8 * q : nullptr;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[nt][j] = 0.0f;
    for (int c0 = p; c0 < chunks; c0 += stride) {
        uint4 nxt[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + stride + MMA_SPLIT * u;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                nxt[u][nt] = c < chunks ? ld_stream(wp[nt] + 4 * c) : make_uint4(0, 0, 0, 0);
        }
        // a[u][h][i]: row g + 8h, elements 32c + 8q + 2i, +1 of chunk c = c0 + 4u, rounded and packed.
        u32 a[U][2][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + MMA_SPLIT * u;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float* xr = h ? xp1 : xp0;
                const u16* xq = h ? xq1 : xq0;
                if (XH) {
                    // Eight rounded elements 32c + 8q.. in memory order: exactly pack2's four pairs.
                    uint4 v = xq && c < chunks ? *(const uint4*)(xq + MMA_CHUNK * c) : make_uint4(0, 0, 0, 0);
                    a[u][h][0] = v.x;
                    a[u][h][1] = v.y;
                    a[u][h][2] = v.z;
                    a[u][h][3] = v.w;
                } else if (xr && c < chunks) {
                    const float4* xv = (const float4*)(xr + MMA_CHUNK * c);
                    float4 lo = xv[0], hi = xv[1];
                    a[u][h][0] = pack2<F16>(lo.x, lo.y);
                    a[u][h][1] = pack2<F16>(lo.z, lo.w);
                    a[u][h][2] = pack2<F16>(hi.x, hi.y);
                    a[u][h][3] = pack2<F16>(hi.z, hi.w);
                } else {
                    a[u][h][0] = a[u][h][1] = a[u][h][2] = a[u][h][3] = 0u;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + MMA_SPLIT * u < chunks) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint4 b = cur[u][nt];
                    // step 0: elements 8q + {0, 1} as k 2q.., 8q + {2, 3} as k 2q + 8..
                    mma16816<F16>(acc[nt], a[u][0][0], a[u][1][0], a[u][0][1], a[u][1][1], b.x, b.y);
                    // step 1: elements 8q + {4, 5} as k 2q.., 8q + {6, 7} as k 2q + 8..
                    mma16816<F16>(acc[nt], a[u][0][2], a[u][1][2], a[u][0][3], a[u][1][3], b.z, b.w);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) cur[u][nt] = nxt[u][nt];
    }

    const int per = NT * 128;  // floats per warp in `parts`
    float* mine = parts + (nb * MMA_SPLIT + p) * per;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 4; j++) mine[(nt * 32 + lane) * 4 + j] = acc[nt][j];
    __syncthreads();
    // Output e of column group b: tile t, lane ln, accumulator j (GLU: the gate tile's outputs only).
    const int outs = GLU ? 128 : per;
    for (int e = threadIdx.x; e < NB * outs; e += blockDim.x) {
        int b = e / outs, t = e % outs;
        const float* src = parts + b * MMA_SPLIT * per + t;
        float v = sum_parts(src, per);
        int nt = t / 128, ln = (t / 4) % 32, j = t % 4;
        int row = (ln >> 2) + 8 * (j >> 1);
        int tile = GLU ? bx * NB + b : (bx * NB + b) * NT + nt;
        int col = 8 * tile + 2 * (ln & 3) + (j & 1);
        if (row < R && col < N) {
            if (GLU) {
                // The up tile's output at the same place, merged in the same order.
                float u = sum_parts(src + 128, per);
                float av = act == 0 ? tf_silu(v) : tf_gelu_tanh(v);
                float o = av * u;
                y[(i64)row * N + col] = o;
                if (yh) yh[(i64)row * N + col] = round_half(o, F16);
            } else {
                if (bias) v = v + deq_elem(bias_dt & ~EPI_ADD, bias, col);
                if (bias_dt & EPI_ADD) v = y[(i64)row * N + col] + v;
                y[(i64)row * N + col] = v;
            }
        }
    }
}

// One weight, up to 16 rows. grid (ceil(N / 32), 1), 256 threads. The `_h` kernels take x's rounded copy last.
#define MMA_ONE_ARGS const float *x, int R, int K, const u16 *w, int N, const u8 *bias, int bias_dt, float *y
#define MMA_ONE_PASS x, R, K, w, nullptr, N, bias, bias_dt, y, 0, blockIdx.x, nullptr, nullptr
#define MMA_ONE_PASS_H x, R, K, w, nullptr, N, bias, bias_dt, y, 0, blockIdx.x, xh, nullptr
extern "C" __global__ void mma_bf16_s(MMA_ONE_ARGS) {
    mma_small<false, MMA_S_NT, MMA_S_NB, MMA_S_U, false>(MMA_ONE_PASS);
}
extern "C" __global__ void mma_f16_s(MMA_ONE_ARGS) {
    mma_small<true, MMA_S_NT, MMA_S_NB, MMA_S_U, false>(MMA_ONE_PASS);
}
extern "C" __global__ void mma_bf16_s_h(MMA_ONE_ARGS, const u16* xh) {
    mma_small<false, MMA_S_NT, MMA_S_NB, MMA_S_U, false, true>(MMA_ONE_PASS_H);
}
extern "C" __global__ void mma_f16_s_h(MMA_ONE_ARGS, const u16* xh) {
    mma_small<true, MMA_S_NT, MMA_S_NB, MMA_S_U, false, true>(MMA_ONE_PASS_H);
}

// The narrow grouping for matrices with few columns (N of a few thousand: q, o, down): one 8-column tile per block
// of MMA_SPLIT warps, twice the chunks in flight per warp, so that a [3584, 18944] down-projection gets 448 blocks
// instead of 112 on 132 SMs. grid (ceil(N / 8), 1), 128 threads.
#define MMA_SN_U 8
extern "C" __global__ void mma_bf16_sn(MMA_ONE_ARGS) { mma_small<false, 1, 1, MMA_SN_U, false>(MMA_ONE_PASS); }
extern "C" __global__ void mma_f16_sn(MMA_ONE_ARGS) { mma_small<true, 1, 1, MMA_SN_U, false>(MMA_ONE_PASS); }

// Up to three weights of one type and K against the same rows in one launch (q/k/v: Backend::matmul_many): nb0
// blocks for weight 0, then nb1 for weight 1, then the rest for weight 2, each running `mma_small<NT, NB, U>` for
// its weight. grid (Σ ceil(N_i / (8·NT·NB)), 1), 32·NB·MMA_SPLIT threads.
template <bool F16, int NT, int NB, int U, bool XH = false>
__device__ __forceinline__ void mma_small_many(const float* x, int R, int K, int nb0, int nb1, const u16* w0, int n0,
                                               const u8* b0, int bdt0, float* y0, const u16* w1, int n1,
                                               const u8* b1, int bdt1, float* y1, const u16* w2, int n2,
                                               const u8* b2, int bdt2, float* y2, const u16* xh) {
    int bx = blockIdx.x;
    if (bx < nb0) {
        mma_small<F16, NT, NB, U, false, XH>(x, R, K, w0, nullptr, n0, b0, bdt0, y0, 0, bx, xh, nullptr);
    } else if (bx < nb0 + nb1) {
        mma_small<F16, NT, NB, U, false, XH>(x, R, K, w1, nullptr, n1, b1, bdt1, y1, 0, bx - nb0, xh, nullptr);
    } else {
        int b = bx - nb0 - nb1;
        mma_small<F16, NT, NB, U, false, XH>(x, R, K, w2, nullptr, n2, b2, bdt2, y2, 0, b, xh, nullptr);
    }
}

#define MMA_MANY_ARGS                                                                                               \
    const float *x, int R, int K, int nb0, int nb1, const u16 *w0, int n0, const u8 *b0, int bdt0, float *y0,      \
        const u16 *w1, int n1, const u8 *b1, int bdt1, float *y1, const u16 *w2, int n2, const u8 *b2, int bdt2, \
        float *y2
#define MMA_MANY_PASS x, R, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, nullptr
#define MMA_MANY_PASS_H x, R, K, nb0, nb1, w0, n0, b0, bdt0, y0, w1, n1, b1, bdt1, y1, w2, n2, b2, bdt2, y2, xh

// One row (decode): `mma_*_sn`'s grouping. grid (Σ ceil(N_i / 8), 1), 128 threads.
extern "C" __global__ void mma_bf16_s_many(MMA_MANY_ARGS) { mma_small_many<false, 1, 1, MMA_SN_U>(MMA_MANY_PASS); }
extern "C" __global__ void mma_f16_s_many(MMA_MANY_ARGS) { mma_small_many<true, 1, 1, MMA_SN_U>(MMA_MANY_PASS); }

// Windows (8..16 rows) of narrow matrices: MMA_W_NT column tiles per warp, so every row of x a warp loads (16 rows
// × 32 floats per chunk, from L1/L2) serves twice the weight bytes of the one-tile grouping, at twice the chunks in
// flight of `_s`. grid (ceil(N / (8·MMA_W_NT)), 1), 128 threads; `_sw_many` likewise per weight.
#define MMA_W_NT 2
#define MMA_W_U 8
extern "C" __global__ void mma_bf16_sw(MMA_ONE_ARGS) { mma_small<false, MMA_W_NT, 1, MMA_W_U, false>(MMA_ONE_PASS); }
extern "C" __global__ void mma_f16_sw(MMA_ONE_ARGS) { mma_small<true, MMA_W_NT, 1, MMA_W_U, false>(MMA_ONE_PASS); }
extern "C" __global__ void mma_bf16_sw_h(MMA_ONE_ARGS, const u16* xh) {
    mma_small<false, MMA_W_NT, 1, MMA_W_U, false, true>(MMA_ONE_PASS_H);
}
extern "C" __global__ void mma_f16_sw_h(MMA_ONE_ARGS, const u16* xh) {
    mma_small<true, MMA_W_NT, 1, MMA_W_U, false, true>(MMA_ONE_PASS_H);
}

extern "C" __global__ void mma_bf16_sw_many(MMA_MANY_ARGS) {
    mma_small_many<false, MMA_W_NT, 1, MMA_W_U>(MMA_MANY_PASS);
}
extern "C" __global__ void mma_f16_sw_many(MMA_MANY_ARGS) { mma_small_many<true, MMA_W_NT, 1, MMA_W_U>(MMA_MANY_PASS); }
extern "C" __global__ void mma_bf16_sw_many_h(MMA_MANY_ARGS, const u16* xh) {
    mma_small_many<false, MMA_W_NT, 1, MMA_W_U, true>(MMA_MANY_PASS_H);
}
extern "C" __global__ void mma_f16_sw_many_h(MMA_MANY_ARGS, const u16* xh) {
    mma_small_many<true, MMA_W_NT, 1, MMA_W_U, true>(MMA_MANY_PASS_H);
}

// glu(x · gateᵀ, x · upᵀ) for up to 16 rows in one launch; act 0 = SiLU, 1 = GELU (tanh form); outh: null, or
// the outputs rounded to the weight type. grid (ceil(N / 16), 1), 256 threads.
#define MMA_GLU_ARGS \
    const float *x, int R, int K, const u16 *gate, const u16 *up, int N, int act, float *out, u16 *outh
#define MMA_GLU_PASS(XH) x, R, K, gate, up, N, nullptr, 0, out, act, blockIdx.x, XH, outh
extern "C" __global__ void mma_bf16_s_glu(MMA_GLU_ARGS) {
    mma_small<false, 2, MMA_S_NB, MMA_S_U, true>(MMA_GLU_PASS(nullptr));
}
extern "C" __global__ void mma_f16_s_glu(MMA_GLU_ARGS) {
    mma_small<true, 2, MMA_S_NB, MMA_S_U, true>(MMA_GLU_PASS(nullptr));
}
extern "C" __global__ void mma_bf16_s_glu_h(MMA_GLU_ARGS, const u16* xh) {
    mma_small<false, 2, MMA_S_NB, MMA_S_U, true, true>(MMA_GLU_PASS(xh));
}
extern "C" __global__ void mma_f16_s_glu_h(MMA_GLU_ARGS, const u16* xh) {
    mma_small<true, 2, MMA_S_NB, MMA_S_U, true, true>(MMA_GLU_PASS(xh));
}

// More rows (prefill): four row tiles and four column tiles per warp, one group per block; 128 threads.
// grid (ceil(N / 32), ceil(R / 64)).
extern "C" __global__ void mma_bf16_l(const float* x, int R, int K, const u16* w, int N, const u8* bias,
                                      int bias_dt, float* y) {
    mma_matmul<false, 4, 4, 1, 2>(x, R, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void mma_f16_l(const float* x, int R, int K, const u16* w, int N, const u8* bias,
                                     int bias_dt, float* y) {
    mma_matmul<true, 4, 4, 1, 2>(x, R, K, w, N, bias, bias_dt, y);
}
