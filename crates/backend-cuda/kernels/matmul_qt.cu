// Checkpoint-precision matmul of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights on the
// tensor cores (`mmqt_<type>`), for many rows (prefill chunks, wide windows): bit-equal to `mmq_<type>`
// (kernels/matmul_q.cu) and so to tf_quant::reference::matmul::matmul_ref.
//
// Why the bits are the reference's: a checkpoint block's terms are integer sums (an int8 activation block times the
// weight's integers, times the sub-block scales), exact in any order, then one or two float fmas per block in block
// order. Here `mma.sync` on int8 fragments gives each (row, column, sub-block) integer dot product exactly (m16n8k32;
// m16n8k16 for the 16-element sub-blocks of Q2_K, Q3_K and Q6_K); the thread that holds a (row, column) pair in its
// accumulator fragment scales and adds the sub-blocks' integers, then folds the block's float terms into its own
// accumulator in increasing block order, as `mmq_*`'s fold lane does. A row's result never depends on another row
// or on the tile.
//
// Tile: QT_M = 64 activation rows × QT_N = 64 weight columns per block of 4 warps (2 × 2, each 32 × 32: two m16 and
// four n8 fragments). The K loop walks stages of 256 elements (8 legacy blocks or one K-quant block): the stage's
// activation bytes [64, 256] and its weights decoded to int8 [64, 256] (row stride QT_LD bytes, padded so that the
// eight fragment rows a load touches fall on distinct banks), with each block's scales, are staged in shared memory.
// grid (ceil(R / QT_M), ceil(N / QT_N)), 128 threads: the row tiles of a column tile run next to each other, so a
// prefill chunk reads each weight tile from DRAM about once while its activations stay in L2.
//
// A stage's activation bytes are copied by cp.async (all of a thread's pieces in flight at once, the weights'
// loads and decode meanwhile), the weights with 16-byte loads where their blocks are 16-byte aligned (Q4_K, Q5_K).

#define QT_M 64
#define QT_N 64
#define QT_K 256
#define QT_LD (QT_K + 16)

// Four bytes from a 2-byte aligned address.
__device__ __forceinline__ u32 ld2w(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// d [4] = A [16, 32] · B [32, 8] (int8, exact int32 sums) from zero (PTX ISA "Matrix Fragments for
// mma.m16n8k32", g = lane / 4, t = lane % 4): a0 = (row g, k 4t..4t+3), a1 = (row g+8, k 4t..), a2 = (row g,
// k 16+4t..), a3 = (row g+8, k 16+4t..); b0 = (k 4t..4t+3, col g), b1 = (k 16+4t.., col g); d = (row g, cols 2t,
// 2t+1), (row g+8, cols 2t, 2t+1).
__device__ __forceinline__ void qt_mma32(int* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();
#endif
}

// d [4] = A [16, 16] · B [16, 8] (int8): a0 = (row g, k 4t..4t+3), a1 = (row g+8, k 4t..); b0 = (k 4t.., col g).
__device__ __forceinline__ void qt_mma16(int* d, u32 a0, u32 a1, u32 b0) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// Four 8 × 8 matrices of 16-bit elements from shared memory (`ldmatrix .x4`): lanes 8i..8i+7 give the 16-byte rows
// of matrix i; register i of lane (g = lane / 4, t = lane % 4) receives bytes 4t..4t+3 of matrix i's row g, which
// is the int8 fragment layout of `mma` (a row's four consecutive k bytes).
__device__ __forceinline__ void qt_ldm4(u32* r, const u8* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// 16 bytes global -> shared, asynchronously (L2 only: activations are read by every column tile).
__device__ __forceinline__ void qt_cp16(u8* dst, const i8* src) {
    u32 a = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(src) : "memory");
}

// The fragments of a 32 × 32 warp tile for one k32 step (xa, wb: this lane's ldmatrix rows, see mmqt).
__device__ __forceinline__ void qt_ldm32(u32 (*a)[4], u32 (*bf)[2], const u8* xa, const u8* wb) {
    qt_ldm4(a[0], xa);
    qt_ldm4(a[1], xa + 16 * QT_LD);
    u32 r[4];
#pragma unroll
    for (int np = 0; np < 2; np++) {
        qt_ldm4(r, wb + np * 16 * QT_LD);
        bf[2 * np][0] = r[0], bf[2 * np][1] = r[1], bf[2 * np + 1][0] = r[2], bf[2 * np + 1][1] = r[3];
    }
}

template <int DT>
struct QtSpec;
template <>
struct QtSpec<DT_Q8_0> {
    static constexpr int BB = 34, BE = 32;
};
template <>
struct QtSpec<DT_Q4_0> {
    static constexpr int BB = 18, BE = 32;
};
template <>
struct QtSpec<DT_Q4_1> {
    static constexpr int BB = 20, BE = 32;
};
template <>
struct QtSpec<DT_Q5_0> {
    static constexpr int BB = 22, BE = 32;
};
template <>
struct QtSpec<DT_Q5_1> {
    static constexpr int BB = 24, BE = 32;
};
template <>
struct QtSpec<DT_Q4K> {
    static constexpr int BB = 144, BE = 256;
};
template <>
struct QtSpec<DT_Q6K> {
    static constexpr int BB = 210, BE = 256;
};
template <>
struct QtSpec<DT_Q5K> {
    static constexpr int BB = 176, BE = 256;
};
template <>
struct QtSpec<DT_Q3K> {
    static constexpr int BB = 110, BE = 256;
};
template <>
struct QtSpec<DT_Q2K> {
    static constexpr int BB = 84, BE = 256;
};

template <int DT>
__device__ __forceinline__ void mmqt(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w, int N,
                                     const u8* bias, int bias_dt, float* y) {
    typedef QtSpec<DT> S;
    constexpr bool LEGACY = S::BE == 32;
    constexpr int BPS = QT_K / S::BE;  // blocks per stage: 8 or 1
    constexpr bool LMIN = DT == DT_Q4_1 || DT == DT_Q5_1;  // legacy with m: fma(mw * dx, Σ qx)
    constexpr bool SUB32 = DT == DT_Q4K || DT == DT_Q5K;  // K-quants of 8 sub-blocks of 32 (the others: 16 of 16)
    constexpr bool KMIN = SUB32 || DT == DT_Q2K;           // K-quants with mins: fma(-(dmin * dx), M)
    __shared__ __align__(16) u8 xs[QT_M * QT_LD];   // activations [64 rows, 256], int8
    __shared__ __align__(16) u8 ws[QT_N * QT_LD];   // weights decoded [64 columns, 256], int8
    __shared__ float dxs[QT_M][BPS];                // activation block scales
    // Q4_1/Q5_1: the block's Σq per block; Q4_K/Q5_K: Σq per sub-block of 32 (8); Q2_K: Σq per 16 (16). Read as u32
    // pairs of sums by the mins' dp2a.
    __shared__ __align__(16) i16 xsum[QT_M][16];
    __shared__ float dws[QT_N][BPS];                // weight block scale d
    __shared__ float mws[QT_N][BPS];                // Q4_1/Q5_1 m, Q2_K/Q4_K/Q5_K dmin
    __shared__ i8 scs[QT_N][16];                    // Q4_K/Q5_K scales (8), Q2_K/Q3_K/Q6_K scales (16)
    __shared__ __align__(16) u8 mins[QT_N][DT == DT_Q2K ? 16 : 8];  // Q4_K/Q5_K mins (8), Q2_K mins (16)
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int g = lane / 4, t = lane % 4;
    int r0 = blockIdx.x * QT_M, n0 = blockIdx.y * QT_N;
    int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    int nb = K / S::BE;
    int stages = (nb + BPS - 1) / BPS;
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
    griddep_wait();
    for (int s = 0; s < stages; s++) {
        int b0 = s * BPS;
        int cnt = min(BPS, nb - b0);  // blocks in this stage
        int kv = cnt * S::BE;         // valid elements in this stage
        __syncthreads();
        // Activations: 16-byte pieces of each row's stage (rows past R repeat row R - 1; never stored), by cp.async.
#pragma unroll
        for (int u = 0; u < QT_M * (QT_K / 16) / 128; u++) {
            int i = tid + 128 * u, row = i / (QT_K / 16), piece = i % (QT_K / 16);
            if (piece * 16 < kv) {
                i64 r = min(r0 + row, R - 1);
                qt_cp16(xs + row * QT_LD + piece * 16, q + r * K + (i64)b0 * S::BE + piece * 16);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        {
            constexpr int U = (QT_M * BPS + 127) / 128;
            float dv[U];
            i16 sv1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = tid + 128 * u, row = i / BPS, bl = i % BPS;
                i64 r = min(r0 + row, R - 1);
                if (i < QT_M * BPS && bl < cnt) {
                    dv[u] = d[r * nb + b0 + bl];
                    if constexpr (LMIN) sv1[u] = sums[r * nb + b0 + bl];
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = tid + 128 * u, row = i / BPS, bl = i % BPS;
                if (i < QT_M * BPS && bl < cnt) {
                    dxs[row][bl] = dv[u];
                    if constexpr (LMIN) xsum[row][bl] = sv1[u];
                }
            }
        }
        if constexpr (KMIN) {
            // Each thread: one row's 8 sums of 16 (16 bytes; a block's 16 sums are 32-byte aligned).
            constexpr int NS = SUB32 ? 8 : 16;  // sums per row kept: per sub-block of 32 (two of 16 added) or of 16
            int row = tid / 2, half = tid % 2;
            i64 r = min(r0 + row, R - 1);
            uint4 v = *(const uint4*)(sums + (r * nb + b0) * 16 + 8 * half);
            u32 w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                i16 lo = (i16)(w4[k] & 0xffffu), hi = (i16)(w4[k] >> 16);
                if constexpr (NS == 8) {
                    xsum[row][4 * half + k] = (i16)(lo + hi);
                } else {
                    xsum[row][8 * half + 2 * k] = lo;
                    xsum[row][8 * half + 2 * k + 1] = hi;
                }
            }
        }
        // Weights: decoded to the reference's integers, in element order.
        if constexpr (LEGACY) {
            for (int i = tid; i < QT_N * BPS; i += 128) {
                int c = i / BPS, bl = i % BPS;
                if (bl >= cnt) continue;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0 + bl) * S::BB;
                u32* dst = (u32*)(ws + c * QT_LD + bl * 32);
                u32 hd = ld2w(p);
                dws[c][bl] = f16_bits_to_f32(hd & 0xffffu);
                if constexpr (LMIN) mws[c][bl] = f16_bits_to_f32(hd >> 16);
                if constexpr (DT == DT_Q8_0) {
#pragma unroll
                    for (int k = 0; k < 8; k++) dst[k] = ld2w(p + 2 + 4 * k);
                } else {
                    // qs at byte 2 (Q4_0), 4 (Q4_1), 6 (Q5_0), 8 (Q5_1); qh at 2 (Q5_0), 4 (Q5_1): elements 4k..4k+3 of
                    // the low nibbles take qh bits 4k.., those of the high nibbles (16 + 4k..) bits 16 + 4k...
                    constexpr int QS = DT == DT_Q4_0 ? 2 : (DT == DT_Q4_1 ? 4 : (DT == DT_Q5_0 ? 6 : 8));
                    u32 qh = DT == DT_Q5_0 ? ld2w(p + 2) : (DT == DT_Q5_1 ? ld2w(p + 4) : 0u);
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        u32 v = ld2w(p + QS + 4 * k);
                        u32 lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;
                        if constexpr (DT == DT_Q5_0 || DT == DT_Q5_1) {
                            lo |= ((((qh >> (4 * k)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
                            hi |= ((((qh >> (16 + 4 * k)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
                        }
                        if constexpr (DT == DT_Q5_0) {
                            lo = __vsub4(lo, 0x10101010u);
                            hi = __vsub4(hi, 0x10101010u);
                        } else if constexpr (DT == DT_Q4_0) {
                            lo = __vsub4(lo, 0x08080808u);
                            hi = __vsub4(hi, 0x08080808u);
                        }
                        dst[k] = lo;
                        dst[4 + k] = hi;
                    }
                }
            }
        } else if constexpr (SUB32) {
            // Part p: qs bytes [32p, 32p + 32) (Q4_K's qs at byte 16, Q5_K's at 48): low nibbles are sub-block 2p,
            // high ones 2p + 1. Q5_K: element 32j + l takes bit j of qh[l] (qh at byte 16) as its bit 4.
            constexpr int QS = DT == DT_Q4K ? 16 : 48;
            // Blocks of 144 and 176 bytes: every block and its qs / qh start 16-byte aligned.
#pragma unroll
            for (int u = 0; u < QT_N * 4 / 128; u++) {
                int i = tid + 128 * u, c = i / 4, part = i % 4;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
                u32* dst = (u32*)(ws + c * QT_LD + 64 * part);
                uint4 qa = *(const uint4*)(p + QS + 32 * part), qb = *(const uint4*)(p + QS + 32 * part + 16);
                u32 qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
                u32 hv[8];
                if constexpr (DT == DT_Q5K) {
                    uint4 ha = *(const uint4*)(p + 16), hb = *(const uint4*)(p + 32);
                    hv[0] = ha.x, hv[1] = ha.y, hv[2] = ha.z, hv[3] = ha.w;
                    hv[4] = hb.x, hv[5] = hb.y, hv[6] = hb.z, hv[7] = hb.w;
                }
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    u32 v = qv[k];
                    u32 lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;
                    if constexpr (DT == DT_Q5K) {
                        u32 qh = hv[k];
                        lo |= ((qh >> (2 * part)) & 0x01010101u) << 4;
                        hi |= ((qh >> (2 * part + 1)) & 0x01010101u) << 4;
                    }
                    dst[k] = lo;
                    dst[8 + k] = hi;
                }
            }
            if (tid < QT_N) {
                int c = tid;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
                u32 hd = ld2w(p);
                dws[c][0] = f16_bits_to_f32(hd & 0xffffu);
                mws[c][0] = f16_bits_to_f32(hd >> 16);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    scs[c][j] = (i8)q4k_scale(p + 4, j);
                    mins[c][j] = (u8)q4k_min(p + 4, j);
                }
            }
        } else if constexpr (DT == DT_Q3K || DT == DT_Q2K) {
            // Part p = 2h + lh: elements 128h + 32s + 16lh + i (s < 4, i < 16) are (qs[32h + 16lh + i] >> 2s) & 3
            // (qs at byte 16 in Q2_K, 32 in Q3_K); Q3_K adds bit 4h + s of hmask[16lh + i] (byte 0) times 4, minus 4.
            constexpr int QS = DT == DT_Q2K ? 16 : 32;
            for (int i = tid; i < QT_N * 4; i += 128) {
                int c = i / 4, part = i % 4, h = part >> 1, lh = part & 1;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
                u32* dst = (u32*)(ws + c * QT_LD + 128 * h + 16 * lh);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 qa = ld2w(p + QS + 32 * h + 16 * lh + 4 * k);
                    u32 hm = DT == DT_Q3K ? ld2w(p + 16 * lh + 4 * k) : 0u;
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        u32 v = (qa >> (2 * s)) & 0x03030303u;
                        if constexpr (DT == DT_Q3K)
                            v = __vsub4(v | (((hm >> (4 * h + s)) & 0x01010101u) << 2), 0x04040404u);
                        dst[8 * s + k] = v;
                    }
                }
            }
            if (tid < QT_N) {
                int c = tid;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
                if constexpr (DT == DT_Q3K) {
#pragma unroll
                    for (int j = 0; j < 16; j++) scs[c][j] = (i8)q3k_scale(p + 96, j);
                    dws[c][0] = ld_f16(p + 108);
                } else {
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        scs[c][j] = (i8)(p[j] & 15);
                        mins[c][j] = p[j] >> 4;
                    }
                    dws[c][0] = ld_f16(p + 80);
                    mws[c][0] = ld_f16(p + 82);
                }
            }
        } else {  // DT_Q6K
            // Part p = 2h + lh: elements 128h + 32tt + 16lh + (0..16) for tt = 0..3, from ql[64h + 16lh ..] (tt 0, 2:
            // low, high nibble), ql[64h + 32 + 16lh ..] (tt 1, 3) and qh[32h + 16lh ..] >> 2tt.
            for (int i = tid; i < QT_N * 4; i += 128) {
                int c = i / 4, part = i % 4, h = part >> 1, lh = part & 1;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
                u8* dst = ws + c * QT_LD + 128 * h + 16 * lh;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 qa = ld2w(p + 64 * h + 16 * lh + 4 * k);
                    u32 qb = ld2w(p + 64 * h + 32 + 16 * lh + 4 * k);
                    u32 qh = ld2w(p + 128 + 32 * h + 16 * lh + 4 * k);
                    ((u32*)(dst + 0))[k] = __vsub4((qa & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4), 0x20202020u);
                    ((u32*)(dst + 32))[k] =
                        __vsub4((qb & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4), 0x20202020u);
                    ((u32*)(dst + 64))[k] =
                        __vsub4(((qa >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4), 0x20202020u);
                    ((u32*)(dst + 96))[k] =
                        __vsub4(((qb >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4), 0x20202020u);
                }
            }
            if (tid < QT_N) {
                int c = tid;
                const u8* p = w + ((i64)min(n0 + c, N - 1) * nb + b0) * S::BB;
#pragma unroll
                for (int j = 0; j < 16; j++) scs[c][j] = (i8)p[192 + j];
                dws[c][0] = f16_bits_to_f32(ld2w(p + 208) & 0xffffu);
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        // This lane's ldmatrix row addresses. k32 steps: A matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15),
        // (rows 0-7, k 16-31), (rows 8-15, k 16-31) = a0..a3; B matrices (columns 0-7, k 0-15), (0-7, k 16-31),
        // (8-15, k 0-15), (8-15, k 16-31) = b0, b1 of two n8 fragments. k16 steps: A rows 0-31 = a0, a1 of both
        // m16 fragments; B columns 0-31 = b0 of the four n8 fragments.
        const u8* xa32 = xs + (wm + (lane & 7) + ((lane >> 3) & 1) * 8) * QT_LD + (lane >> 4) * 16;
        const u8* wb32 = ws + (wn + (lane & 7) + (lane >> 4) * 8) * QT_LD + ((lane >> 3) & 1) * 16;
        const u8* xa16 = xs + (wm + lane) * QT_LD;
        const u8* wb16 = ws + (wn + lane) * QT_LD;
        if constexpr (LEGACY) {
            for (int bl = 0; bl < cnt; bl++) {
                int kk = bl * 32;
                u32 a[2][4], bf[4][2];
                qt_ldm32(a, bf, xa32 + kk, wb32 + kk);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        int dot[4];
                        qt_mma32(dot, a[mi][0], a[mi][1], a[mi][2], a[mi][3], bf[ni][0], bf[ni][1]);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int row = wm + mi * 16 + g + (e >> 1) * 8, c = wn + ni * 8 + 2 * t + (e & 1);
                            float dx = dxs[row][bl];
                            acc[mi][ni][e] = fmaf(dws[c][bl] * dx, (float)dot[e], acc[mi][ni][e]);
                            if constexpr (LMIN)
                                acc[mi][ni][e] = fmaf(mws[c][bl] * dx, (float)xsum[row][bl], acc[mi][ni][e]);
                        }
                    }
                }
            }
        } else {
            int sv[2][4][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sv[mi][ni][e] = 0;
            constexpr int SUBS = SUB32 ? 8 : 16;
#pragma unroll 1
            for (int j = 0; j < SUBS; j++) {
                int kk = j * (SUB32 ? 32 : 16);
                u32 a[2][4], bf[4][2];
                if constexpr (SUB32) {
                    qt_ldm32(a, bf, xa32 + kk, wb32 + kk);
                } else {
                    u32 r[4];
                    qt_ldm4(r, xa16 + kk);
                    a[0][0] = r[0], a[0][1] = r[1], a[1][0] = r[2], a[1][1] = r[3];
                    qt_ldm4(r, wb16 + kk);
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) bf[ni][0] = r[ni];
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        int dot[4];
                        if constexpr (SUB32) {
                            qt_mma32(dot, a[mi][0], a[mi][1], a[mi][2], a[mi][3], bf[ni][0], bf[ni][1]);
                        } else {
                            qt_mma16(dot, a[mi][0], a[mi][1], bf[ni][0]);
                        }
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int c = wn + ni * 8 + 2 * t + (e & 1);
                            sv[mi][ni][e] += (int)scs[c][j] * dot[e];
                        }
                    }
                }
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = wm + mi * 16 + g + (e >> 1) * 8, c = wn + ni * 8 + 2 * t + (e & 1);
                        float dx = dxs[row][0];
                        acc[mi][ni][e] = fmaf(dws[c][0] * dx, (float)sv[mi][ni][e], acc[mi][ni][e]);
                        if constexpr (KMIN) {
                            // M = Σ_j m_j · Σq_j: dp2a of each pair of i16 sums with two of the column's mins bytes.
                            constexpr int NW = SUB32 ? 2 : 4;  // u32 words of mins
                            const u32* xw = (const u32*)xsum[row];
                            const u32* mw = (const u32*)mins[c];
                            int mv = 0;
#pragma unroll
                            for (int w = 0; w < NW; w++)
                                mv = __dp2a_hi((int)xw[2 * w + 1], (int)mw[w], __dp2a_lo((int)xw[2 * w], (int)mw[w], mv));
                            acc[mi][ni][e] = fmaf(-(mws[c][0] * dx), (float)mv, acc[mi][ni][e]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + wm + mi * 16 + g + (e >> 1) * 8, n = n0 + wn + ni * 8 + 2 * t + (e & 1);
                if (r < R && n < N) {
                    float v = acc[mi][ni][e];
                    if (bias) v = v + deq_elem(bias_dt & ~EPI_ADD, bias, n);
                    if (bias_dt & EPI_ADD) v = y[(i64)r * N + n] + v;
                    y[(i64)r * N + n] = v;
                }
            }
        }
    }
}

// (q, d, sums) from quantize_rows of x [R, K]; w [N, K] in the kernel's type; bias (bias_dt) or null; y [R, N]
// (with EPI_ADD in bias_dt: y += the product). grid (ceil(N / QT_N), ceil(R / QT_M)), 128 threads; launched with PDL; sm_80 and newer.
extern "C" __global__ void __launch_bounds__(128) mmqt_q8_0(const i8* q, const float* d, const i16* sums, int R,
                                                            int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                            float* y) {
    mmqt<DT_Q8_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q4_0(const i8* q, const float* d, const i16* sums, int R,
                                                            int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                            float* y) {
    mmqt<DT_Q4_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q4_1(const i8* q, const float* d, const i16* sums, int R,
                                                            int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                            float* y) {
    mmqt<DT_Q4_1>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q5_0(const i8* q, const float* d, const i16* sums, int R,
                                                            int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                            float* y) {
    mmqt<DT_Q5_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q4k(const i8* q, const float* d, const i16* sums, int R,
                                                           int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                           float* y) {
    mmqt<DT_Q4K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q6k(const i8* q, const float* d, const i16* sums, int R,
                                                           int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                           float* y) {
    mmqt<DT_Q6K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q5_1(const i8* q, const float* d, const i16* sums, int R,
                                                            int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                            float* y) {
    mmqt<DT_Q5_1>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q5k(const i8* q, const float* d, const i16* sums, int R,
                                                           int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                           float* y) {
    mmqt<DT_Q5K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q3k(const i8* q, const float* d, const i16* sums, int R,
                                                           int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                           float* y) {
    mmqt<DT_Q3K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(128) mmqt_q2k(const i8* q, const float* d, const i16* sums, int R,
                                                           int K, const u8* w, int N, const u8* bias, int bias_dt,
                                                           float* y) {
    mmqt<DT_Q2K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
