// Checkpoint-precision matmul of Q4_K and Q6_K weights for 2 to a few dozen rows (verify windows, shared decode
// rounds) on the tensor cores, streaming each weight row once per 16 rows (`mmqm_<type>`, `mmqm_glu_<type>`,
// `mmqm_many_<type>` and their K-split forms `mmqm_*_ks`): bit-equal to `mmq_<type>` (kernels/matmul_q.cu) and so
// to tf_quant::reference::matmul::matmul_ref.
//
// Why the bits are the reference's: a block's terms are integers, exact in any order (Q4_K: S = Σ_j sc_j ·
// Σ_{i∈j} q_i x_i and M = Σ_j m_j · Σ_{i∈j} x_i over its 8 sub-blocks of 32; Q6_K: S = Σ_j sc_j · Σ_{i∈j}
// (q_i - 32) x_i over its 16 sub-blocks of 16), then the reference's fmas per block in block order:
// acc = fma(dw · dx, S, acc), and for Q4_K acc = fma(-(dmin · dx), M, acc). Here `mma.sync` on int8 fragments
// (m16n8k32 per Q4_K sub-block, m16n8k16 per Q6_K sub-block) gives each (row, column, sub-block) dot product
// exactly; the lane that holds a (row, column) pair of the accumulator fragment multiplies and adds the sub-blocks'
// integers (Q4_K's M by dp2a on the activations' 16-element sums), and each output's float terms are folded into
// one accumulator in increasing block order. A row's result never depends on another row, the row count, the tile
// or the split.
//
// Geometry: a column group is 8 weight columns (one n8 fragment) against 16 activation rows (one m16 fragment).
// Lane (g, t) (g = lane / 4, t = lane % 4) holds column g of the B fragment, and rows g, g + 8 × columns 2t, 2t + 1
// of the accumulator fragment, whose block headers it reads. The mma's k positions are a permutation of a
// sub-block's elements, the same for both operands (sums are order-free); the types differ only in it and in how a
// lane gets its bytes (`QmType`):
// - Q4_K: lane t holds elements 8t..8t+3 at k 4t.., and 8t+4..8t+7 at k 16+4t.., so its weight bytes (qs[32p + 8t
//   .. +8] of column g: low nibbles sub-block 2p, high nibbles 2p + 1) and its activation bytes (8 contiguous per
//   row) are single 8-byte loads; the headers (d, dmin, the 6-bit scales and mins) are unpacked four to a word.
// - Q6_K: k in element order, lane t holding elements 4t..4t+3 of each sub-block. In the block seen as rows of 16
//   bytes (ql rows 0..7, qh rows 8..11, the 16 scales row 12) that is word t of every row, and of every activation
//   sub-block. The 210-byte blocks are only 2-byte aligned: a lane loads the aligned words at or below its own and
//   funnel-shifts each with the next aligned word, which its right neighbour loaded (a shuffle); the scales and d
//   reach the accumulator lanes by shuffles too.
// Weights are loaded one of the warp's blocks ahead into registers, and the row's bytes QM_PF of the warp's blocks
// ahead are asked of L2 by a bulk prefetch.
//
// `mmqm_*`: a warp owns one column group and walks the whole K, folding its 4 accumulator elements itself; a block
// is QM_WARPS groups. `mmqm_*_ks` (narrow weights, whose N / 8 groups are too few warps to keep the weight bytes in
// flight: src/geometry.rs, `mmqm_splits`): the QM_KSPLIT warps of a block share one column group and walk K in
// rounds of QM_KSPLIT consecutive blocks, warp s taking block QM_KSPLIT · j + s of round j. It computes that block's
// integer terms and writes the fold's inputs ((float)S, (float)M per output, d and dmin per column, the activation
// scale per row: `QmSlot`) to shared memory; after the block's barrier each lane folds one accumulator element (warp
// s element s) over the round's blocks in increasing order, the same fmas on the same values as the warp that walks
// the whole K. The slots of two rounds alternate, so one barrier per round orders both the writes before the fold
// and the fold before the slots are written again.
//
// grid (ceil(R / 16), column blocks): the row groups of the same columns run side by side, so a weight row read for
// the first comes from L2 for the others.

#define QM_WARPS 4
// Warps of a `_ks` block that share one column group's K: all of the block's, so `__syncthreads` is the group's
// barrier (src/geometry.rs mirrors it).
#define QM_KSPLIT QM_WARPS
// Blocks per SM the `_ks` kernels are compiled for (their __launch_bounds__ minimum): left to itself ptxas gives them
// 122-128 registers, 4 blocks per SM; at 5 they fit 96 registers without spilling (sm_90), and warps in flight are
// what the split is for (at 6, 80 registers, they spill).
#define QM_KS_BLOCKS 5
// Blocks of a weight row, of the warp's own sequence, between the L2 prefetch and the block computed (a `CudaTuning`
// define; 0: no prefetch).
#ifndef QM_PF
#define QM_PF 8
#endif

// A Q4_K block header (bytes 0..16: d, dmin as f16, then the 12 bytes of 6-bit scales and mins) unpacked: the 8
// scales as bytes of sc[0] (sub-blocks 0..3) and sc[1] (4..7), the 8 mins likewise in mn[0], mn[1].
struct QmQ4kHead {
    float d, dmin;
    u32 sc[2], mn[2];
};

__device__ __forceinline__ QmQ4kHead qm_q4k_head(uint4 h) {
    // s0 = scales bytes 0..3, s1 = 4..7, s2 = 8..11 (j < 4: sc = s0[j] & 63, m = s1[j] & 63; j >= 4: sc =
    // (s2[j-4] & 15) | (s0[j-4] >> 6) << 4, m = (s2[j-4] >> 4) | (s1[j-4] >> 6) << 4: q4k_scale, q4k_min).
    u32 s0 = h.y, s1 = h.z, s2 = h.w;
    QmQ4kHead r;
    r.d = f16_bits_to_f32(h.x & 0xffffu);
    r.dmin = f16_bits_to_f32(h.x >> 16);
    r.sc[0] = s0 & 0x3f3f3f3fu;
    r.mn[0] = s1 & 0x3f3f3f3fu;
    r.sc[1] = (s2 & 0x0f0f0f0fu) | (((s0 >> 6) & 0x03030303u) << 4);
    r.mn[1] = ((s2 >> 4) & 0x0f0f0f0fu) | (((s1 >> 6) & 0x03030303u) << 4);
    return r;
}

// Byte k (0..3) of w, zero-extended.
__device__ __forceinline__ int qm_byte(u32 w, int k) { return (int)__byte_perm(w, 0u, 0x4440u + (u32)k); }

__device__ __forceinline__ uint2 qm_ld8(const u8* p) { return *(const uint2*)p; }

// Byte k (0..3) of w, sign-extended.
__device__ __forceinline__ int qm_sbyte(u32 w, int k) { return (int)(w << (24 - 8 * k)) >> 24; }

// An L2 prefetch of the BB-byte block at p (cp.async.bulk wants a 16-byte aligned start and size): blocks that are
// not 16-byte aligned are asked from p's aligned piece up to the last aligned bound inside the block (the rest is
// the next block's first piece). sm_90 and newer; before, nothing.
template <int BB>
__device__ __forceinline__ void qm_prefetch(const u8* p) {
#if __CUDA_ARCH__ >= 900
    u64 a = (u64)p, e = a + BB;
    if constexpr (BB % 16 != 0) {
        a &= ~(u64)15;
        e &= ~(u64)15;
    }
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((u32)(e - a)) : "memory");
#endif
}

// The per-type part of a block: its bytes; how lane (g, t) loads them (`Raw`, one block ahead: the block at byte o of
// the weight rows of columns g, 2t, 2t + 1, column g's from `lane_at` bytes into its row) and unpacks them (`Blk`);
// the activation bytes it loads (`Act`); its integer terms for the lane's four accumulator elements e (row
// g + 8 (e >> 1), column 2t + (e & 1)) with the scales of its columns.
template <int DT>
struct QmType;

template <>
struct QmType<DT_Q4K> {
    static constexpr int BB = 144;      // d, dmin, 12 bytes of scales and mins, qs [128]; 16-byte aligned
    static constexpr bool MINS = true;  // the second fma, fma(-(dmin · dx), M, acc)
    struct Raw {
        uint2 qs[4];    // [p]: column g's qs[32p + 8t .. + 8]
        uint4 h0, h1;   // the 16-byte headers of columns 2t, 2t + 1
    };
    struct Blk {
        uint2 qs[4];
        QmQ4kHead h0, h1;
    };
    static __device__ __forceinline__ int lane_at(int t) { return 16 + 8 * t; }  // qs[8t]
    // wq: byte lane_at(t) of column g's row; w0, w1: the rows of columns 2t, 2t + 1.
    static __device__ __forceinline__ void load(Raw& r, const u8* wq, const u8* w0, const u8* w1, i64 o, int) {
#pragma unroll
        for (int p = 0; p < 4; p++) r.qs[p] = qm_ld8(wq + o + 32 * p);
        r.h0 = *(const uint4*)(w0 + o);
        r.h1 = *(const uint4*)(w1 + o);
    }
    static __device__ __forceinline__ Blk take(const Raw& r, int) {
        Blk k;
#pragma unroll
        for (int p = 0; p < 4; p++) k.qs[p] = r.qs[p];
        k.h0 = qm_q4k_head(r.h0);
        k.h1 = qm_q4k_head(r.h1);
        return k;
    }
    struct Act {
        uint2 xl[8], xh[8];    // [sub-block]: bytes 8t .. 8t + 8 of rows g, g + 8
        uint4 ga[2], gb[2];    // the 16 sums of 16 of rows g, g + 8
    };
    // Block b of rows g, g + 8: their bytes at q + xa, q + xb, their 16 sums of 16 per block at sa, sb (rows out of
    // range: ra, rb false, zeros; their sums are read, not used).
    static __device__ __forceinline__ Act act(const i8* q, i64 xa, i64 xb, const i16* sa, const i16* sb, int b,
                                              bool ra, bool rb, int t) {
        Act x;
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            x.xl[jj] = ra ? *(const uint2*)(q + xa + (i64)b * 256 + 32 * jj + 8 * t) : make_uint2(0, 0);
            x.xh[jj] = rb ? *(const uint2*)(q + xb + (i64)b * 256 + 32 * jj + 8 * t) : make_uint2(0, 0);
        }
        x.ga[0] = *(const uint4*)(sa + (i64)b * 16), x.ga[1] = *(const uint4*)(sa + (i64)b * 16 + 8);
        x.gb[0] = *(const uint4*)(sb + (i64)b * 16), x.gb[1] = *(const uint4*)(sb + (i64)b * 16 + 8);
        return x;
    }
    // S, M per accumulator element; dw, dm: d, dmin of columns 2t, 2t + 1.
    static __device__ __forceinline__ void terms(const Blk& k, const Act& x, int* S, int* M, float* dw, float* dm) {
#pragma unroll
        for (int e = 0; e < 4; e++) S[e] = 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            u32 lo0 = k.qs[p].x & 0x0f0f0f0fu, lo1 = k.qs[p].y & 0x0f0f0f0fu;
            u32 hi0 = (k.qs[p].x >> 4) & 0x0f0f0f0fu, hi1 = (k.qs[p].y >> 4) & 0x0f0f0f0fu;
            int dl[4], dh[4];
            int j0 = 2 * p, j1 = 2 * p + 1;
            qt_mma32(dl, x.xl[j0].x, x.xh[j0].x, x.xl[j0].y, x.xh[j0].y, lo0, lo1);
            qt_mma32(dh, x.xl[j1].x, x.xh[j1].x, x.xl[j1].y, x.xh[j1].y, hi0, hi1);
            int s00 = qm_byte(k.h0.sc[j0 >> 2], j0 & 3), s01 = qm_byte(k.h1.sc[j0 >> 2], j0 & 3);
            int s10 = qm_byte(k.h0.sc[j1 >> 2], j1 & 3), s11 = qm_byte(k.h1.sc[j1 >> 2], j1 & 3);
            S[0] += s00 * dl[0] + s10 * dh[0];
            S[1] += s01 * dl[1] + s11 * dh[1];
            S[2] += s00 * dl[2] + s10 * dh[2];
            S[3] += s01 * dl[3] + s11 * dh[3];
        }
        // M = Σ_j m_j · (sums[2j] + sums[2j+1]): dp2a of each pair of i16 sums with (m_j, m_j).
        u32 gar[8] = {x.ga[0].x, x.ga[0].y, x.ga[0].z, x.ga[0].w, x.ga[1].x, x.ga[1].y, x.ga[1].z, x.ga[1].w};
        u32 gbr[8] = {x.gb[0].x, x.gb[0].y, x.gb[0].z, x.gb[0].w, x.gb[1].x, x.gb[1].y, x.gb[1].z, x.gb[1].w};
#pragma unroll
        for (int e = 0; e < 4; e++) M[e] = 0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int k2 = 0; k2 < 2; k2++) {
                // sub-blocks j = 4h + 2k2, 4h + 2k2 + 1: their mins duplicated (m_j, m_j, m_j+1, m_j+1).
                u32 m0 = __byte_perm(k.h0.mn[h], 0u, k2 ? 0x3322u : 0x1100u);
                u32 m1 = __byte_perm(k.h1.mn[h], 0u, k2 ? 0x3322u : 0x1100u);
                int jm = 4 * h + 2 * k2;
                M[0] = __dp2a_hi((int)gar[jm + 1], (int)m0, __dp2a_lo((int)gar[jm], (int)m0, M[0]));
                M[1] = __dp2a_hi((int)gar[jm + 1], (int)m1, __dp2a_lo((int)gar[jm], (int)m1, M[1]));
                M[2] = __dp2a_hi((int)gbr[jm + 1], (int)m0, __dp2a_lo((int)gbr[jm], (int)m0, M[2]));
                M[3] = __dp2a_hi((int)gbr[jm + 1], (int)m1, __dp2a_lo((int)gbr[jm], (int)m1, M[3]));
            }
        }
        dw[0] = k.h0.d, dw[1] = k.h1.d;
        dm[0] = k.h0.dmin, dm[1] = k.h1.dmin;
    }
};

template <>
struct QmType<DT_Q6K> {
    static constexpr int BB = 210;       // ql [128], qh [64], scales [16] (i8), d; 2-byte aligned
    static constexpr bool MINS = false;  // one fma per block
    struct Raw {
        u32 a[13];  // [m]: the aligned word at or below byte 16m + 4t of column g's block
        u32 a13;    // lane t = 0: the aligned word at or below byte 208 (d in its high half) where the block is not
                    // 4-byte aligned, else d (f16 bits); other lanes 0
        u32 sh;     // the block's start & 3, in bits: 0 or 16
    };
    struct Blk {
        u32 q[12];          // [m]: column g's bytes 16m + 4t .. + 4 (ql rows 0..7, qh rows 8..11)
        u32 s0[4], s1[4];   // the 16 scales of columns 2t, 2t + 1, four to a word
        float d0, d1;       // d of columns 2t, 2t + 1
    };
    static __device__ __forceinline__ int lane_at(int) { return 0; }
    // wg: the row of column g (the accumulator columns' d come from their own lanes). Every byte read lies in the
    // block or, below a start that is not 4-byte aligned, in the 2 bytes just before it.
    static __device__ __forceinline__ void load(Raw& r, const u8* wg, const u8*, const u8*, i64 o, int t) {
        const u8* wb = wg + o;
        const u32* y = (const u32*)((u64)wb & ~(u64)3);
        r.sh = ((u32)(u64)wb & 2u) * 8;
#pragma unroll
        for (int m = 0; m < 13; m++) r.a[m] = y[4 * m + t];
        r.a13 = t != 0 ? 0u : (r.sh ? y[52] : (u32)*(const u16*)(wb + 208));
    }
    // Word m of lane t is the funnel shift of its aligned word and the next one: lane t + 1's word m, or for lane 3
    // lane 0's word m + 1 (a13 for m = 12). Row 12 (scales 4t'..4t'+3 of column g' in lane (g', t')) and d (in lane
    // (g', 0)) then go to the accumulator lanes: column 2t's from lanes 8t .. 8t + 3, column 2t + 1's from 8t + 4 ..
    // 8t + 7.
    static __device__ __forceinline__ Blk take(const Raw& r, int lane) {
        int t = lane % 4, src = (lane & ~3) | ((lane + 1) & 3);
        Blk k;
        u32 sc = 0;
#pragma unroll
        for (int m = 0; m < 13; m++) {
            u32 send = t == 0 ? (m < 12 ? r.a[m + 1] : r.a13) : r.a[m];  // what lane t - 1 (lane 3 for t = 0) needs
            u32 v = __funnelshift_r(r.a[m], __shfl_sync(FULL_MASK, send, src), r.sh);
            if (m < 12) {
                k.q[m] = v;
            } else {
                sc = v;
            }
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            k.s0[w] = __shfl_sync(FULL_MASK, sc, 8 * t + w);
            k.s1[w] = __shfl_sync(FULL_MASK, sc, 8 * t + 4 + w);
        }
        u32 dg = __funnelshift_r(r.a13, 0u, r.sh) & 0xffffu;
        k.d0 = f16_bits_to_f32(__shfl_sync(FULL_MASK, dg, 8 * t));
        k.d1 = f16_bits_to_f32(__shfl_sync(FULL_MASK, dg, 8 * t + 4));
        return k;
    }
    struct Act {
        u32 xl[16], xh[16];  // [sub-block]: bytes 4t .. 4t + 4 of rows g, g + 8
    };
    // Block b of rows g, g + 8: their bytes at q + xa, q + xb (rows out of range: ra, rb false, zeros).
    static __device__ __forceinline__ Act act(const i8* q, i64 xa, i64 xb, const i16*, const i16*, int b, bool ra,
                                              bool rb, int t) {
        Act x;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            x.xl[j] = ra ? *(const u32*)(q + xa + (i64)b * 256 + 16 * j + 4 * t) : 0u;
            x.xh[j] = rb ? *(const u32*)(q + xb + (i64)b * 256 + 16 * j + 4 * t) : 0u;
        }
        return x;
    }
    // S per accumulator element (M zero); dw: d of columns 2t, 2t + 1.
    static __device__ __forceinline__ void terms(const Blk& k, const Act& x, int* S, int* M, float* dw, float* dm) {
#pragma unroll
        for (int e = 0; e < 4; e++) S[e] = 0, M[e] = 0;
        // Sub-block j = 8h + 2tp + lh: elements 128h + 32tp + 16lh + i, low 4 bits in ql[64h + 32(tp & 1) + 16lh + i]
        // >> 4(tp >> 1) (row 4h + 2(tp & 1) + lh), high 2 bits in qh[32h + 16lh + i] >> 2tp (row 8 + 2h + lh); the
        // value minus 32. In the order (h, lh, tp), so that each (h, lh)'s three rows are done with together.
#pragma unroll
        for (int u = 0; u < 16; u++) {
            int h = u >> 3, lh = (u >> 2) & 1, tp = u & 3, j = 8 * h + 2 * tp + lh;
            u32 ql = k.q[4 * h + 2 * (tp & 1) + lh], qh = k.q[8 + 2 * h + lh];
            u32 bw = __vsub4(((ql >> (4 * (tp >> 1))) & 0x0f0f0f0fu) | (((qh >> (2 * tp)) & 0x03030303u) << 4),
                             0x20202020u);
            int dot[4];
            qt_mma16(dot, x.xl[j], x.xh[j], bw);
            int s0 = qm_sbyte(k.s0[j >> 2], j & 3), s1 = qm_sbyte(k.s1[j >> 2], j & 3);
            S[0] += s0 * dot[0];
            S[1] += s1 * dot[1];
            S[2] += s0 * dot[2];
            S[3] += s1 * dot[3];
        }
        dw[0] = k.d0, dw[1] = k.d1;
        dm[0] = 0.0f, dm[1] = 0.0f;
    }
};

// Output (r, n) = acc + bias, with EPI_ADD in bias_dt added into y: mmq_store's arithmetic (matmul_q.cu) for one
// output.
__device__ __forceinline__ void qm_store(float acc, int r, int n, int N, const u8* bias, int bias_dt, float* y) {
    float s = acc;
    if (bias) s = s + deq_elem(bias_dt & ~EPI_ADD, bias, n);
    if (bias_dt & EPI_ADD) s = y[(i64)r * N + n] + s;
    y[(i64)r * N + n] = s;
}

// The columns of one weight [N, K] (rows of rb bytes): y = x · wᵀ (+ bias).
struct QmCols1 {
    const u8* w;
    i64 rb;
    int N;
    const u8* bias;
    int bias_dt;
    float* y;
    __device__ __forceinline__ void rows(int c, const u8** wrs) const { wrs[0] = w + c * rb; }
    __device__ __forceinline__ void store1(int c, int r, const float* acc) const {
        qm_store(acc[0], r, c, N, bias, bias_dt, y);
    }
};

// The columns of gate and up [N, K]: out = act(x · gateᵀ) * (x · upᵀ) (act 0 SiLU, 1 GELU tanh: the `glu`
// kernel's arithmetic, as mmq_glu's).
struct QmColsGlu {
    const u8* gate;
    const u8* up;
    i64 rb;
    int N, act;
    float* out;
    __device__ __forceinline__ void rows(int c, const u8** wrs) const {
        wrs[0] = gate + c * rb;
        wrs[1] = up + c * rb;
    }
    __device__ __forceinline__ void store1(int c, int r, const float* acc) const {
        float a = act == 0 ? tf_silu(acc[0]) : tf_gelu_tanh(acc[0]);
        out[(i64)r * N + c] = a * acc[1];
    }
};

// The columns of up to three weights [Ni, K] of one type, one after the other (column c < N0 is w0's column c,
// then w1's, then w2's), each output as QmCols1's.
struct QmCols3 {
    const u8 *w0, *w1, *w2;
    i64 rb;
    int N0, N1, N2;
    const u8 *b0, *b1, *b2;
    int bd0, bd1, bd2;
    float *y0, *y1, *y2;
    __device__ __forceinline__ void rows(int c, const u8** wrs) const {
        wrs[0] = c < N0 ? w0 + c * rb : (c < N0 + N1 ? w1 + (c - N0) * rb : w2 + (c - N0 - N1) * rb);
    }
    __device__ __forceinline__ void store1(int c, int r, const float* acc) const {
        if (c < N0) {
            qm_store(acc[0], r, c, N0, b0, bd0, y0);
        } else if (c < N0 + N1) {
            qm_store(acc[0], r, c - N0, N1, b1, bd1, y1);
        } else {
            qm_store(acc[0], r, c - N0 - N1, N2, b2, bd2, y2);
        }
    }
};

// The fold's inputs of one K block for one column group (16 rows × 8 columns), written by the warp that computed the
// block and read by the warps that fold it (`_ks` kernels). 1,152 bytes.
struct QmSlot {
    float2 sm[4][32];  // [e][lane]: ((float)S, (float)M) of lane (g, t)'s accumulator element e: row g + 8 (e >> 1),
                       // column 2t + (e & 1) of the group (Q6_K: M = 0, not read)
    float2 wd[8];      // [column of the group]: (d, dmin) of its block header (Q6_K: dmin = 0, not read)
    float dx[16];      // [row of the group]: the activation block's scale
};

// One column group, columns c0 .. c0 + 7 of W weights of type DT (`cols.rows`) against rows r0 .. r0 + nr (nr ≤ 16)
// of the quantized activations, stored through `cols.store1` (the column sets above). KS warps share the group: this
// is warp ks of them, computing blocks ks, ks + KS, ... and folding and storing accumulator elements e = ks · (4 / KS)
// + p (p < 4 / KS). KS = 1: the warp walks the whole K and folds in registers (slots unused); KS > 1: slots
// [2 · KS] (round parity, then warp) in shared memory, and the KS warps are the whole block.
template <int DT, int W, int KS, class Cols>
__device__ __forceinline__ void qm_warp(const i8* q, const float* d, const i16* sums, int K, const Cols& cols, int c0,
                                        int C, int r0, int nr, int ks, QmSlot* slots) {
    typedef QmType<DT> T;
    constexpr int BB = T::BB;
    constexpr int P = 4 / KS;  // accumulator elements this lane folds
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int nb = K / 256;
    int rounds = (nb + KS - 1) / KS;  // of KS consecutive blocks, one per warp (the last may be partial)
    // B fragment: column c0 + g (a column past C reads column C - 1's bytes and is never stored).
    int cb = min(c0 + g, C - 1);
    // Accumulator columns: c0 + 2t, c0 + 2t + 1; rows r0 + g, r0 + g + 8.
    int ca = min(c0 + 2 * t, C - 1), cc = min(c0 + 2 * t + 1, C - 1);
    bool ra = g < nr, rb = g + 8 < nr;
    i64 xa = (i64)(r0 + (ra ? g : 0)) * K, xb = (i64)(r0 + (rb ? g + 8 : 0)) * K;
    const i16* sa = sums + (i64)(r0 + (ra ? g : 0)) * nb * 16;
    // Row g + 8's sums as an offset from row g's (ptxas then fits the `_ks` kernels in 96 registers without spilling).
    i64 sab = (i64)((rb ? g + 8 : 0) - (ra ? g : 0)) * nb * 16;
    const float* da = d + (i64)(r0 + (ra ? g : 0)) * nb;
    const float* db = d + (i64)(r0 + (rb ? g + 8 : 0)) * nb;
    float acc[W][P];
    int par = 0;  // the slots this round writes: alternating over the rounds of every weight
#pragma unroll
    for (int i = 0; i < W; i++) {
        const u8* wr[W];
        const u8* w0[W];
        const u8* w1[W];
        cols.rows(cb, wr);
        cols.rows(ca, w0);
        cols.rows(cc, w1);
        const u8* wq = wr[i] + T::lane_at(t);  // the lane's bytes of block 0 in column g
        const u8* h0 = w0[i];
        const u8* h1 = w1[i];
        // One L2 prefetch per weight row and block (lane t == 0 of each column) of the warp's j-th block, ks + KS · j.
        auto pf = [&](int j) {
            int b = ks + KS * j;
            if (t == 0 && b < nb) qm_prefetch<BB>(wr[i] + (i64)b * BB);
        };
        for (int j = 0; j < QM_PF; j++) pf(j);
        typename T::Raw nx;
        auto ldw = [&](int b) { T::load(nx, wq, h0, h1, (i64)b * BB, t); };
        if (ks < nb) ldw(ks);
        if (i == 0) griddep_wait();
#pragma unroll
        for (int p = 0; p < P; p++) acc[i][p] = 0.0f;
        for (int j = 0; j < rounds; j++) {
            int b = ks + KS * j;
            if (b < nb) {
                typename T::Blk cur = T::take(nx, lane);
                if (b + KS < nb) ldw(b + KS);
                pf(j + QM_PF);
                typename T::Act xv = T::act(q, xa, xb, sa, sa + sab, b, ra, rb, t);
                float dxa = da[b], dxb = db[b];
                int S[4], M[4];
                float dw[2], dm[2];
                T::terms(cur, xv, S, M, dw, dm);
                if constexpr (KS == 1) {
                    float dx[2] = {dxa, dxb};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = dx[e >> 1];
                        acc[i][e] = fmaf(dw[e & 1] * x, (float)S[e], acc[i][e]);
                        if constexpr (T::MINS) acc[i][e] = fmaf(-(dm[e & 1] * x), (float)M[e], acc[i][e]);
                    }
                } else {
                    QmSlot& sl = slots[par * KS + ks];
#pragma unroll
                    for (int e = 0; e < 4; e++) sl.sm[e][lane] = make_float2((float)S[e], (float)M[e]);
                    if (g == 0) {
                        sl.wd[2 * t] = make_float2(dw[0], dm[0]);
                        sl.wd[2 * t + 1] = make_float2(dw[1], dm[1]);
                    }
                    if (t == 0) {
                        sl.dx[g] = dxa;
                        sl.dx[g + 8] = dxb;
                    }
                }
            }
            if constexpr (KS > 1) {
                // Every warp's block of this round is in the slots: fold them in block order.
                __syncthreads();
                for (int k = 0; k < KS && KS * j + k < nb; k++) {
                    const QmSlot& sl = slots[par * KS + k];
#pragma unroll
                    for (int p = 0; p < P; p++) {
                        int e = ks * P + p;
                        float2 st = sl.sm[e][lane], wd = sl.wd[2 * t + (e & 1)];
                        float x = sl.dx[g + 8 * (e >> 1)];
                        acc[i][p] = fmaf(wd.x * x, st.x, acc[i][p]);
                        if constexpr (T::MINS) acc[i][p] = fmaf(-(wd.y * x), st.y, acc[i][p]);
                    }
                }
                par ^= 1;
            }
        }
    }
#pragma unroll
    for (int p = 0; p < P; p++) {
        int e = ks * P + p;
        int r = g + 8 * (e >> 1), c = c0 + 2 * t + (e & 1);
        if (r < nr && c < C) {
            float v[W];
#pragma unroll
            for (int i = 0; i < W; i++) v[i] = acc[i][p];
            cols.store1(c, r0 + r, v);
        }
    }
}

// The warp's part of the grid (ceil(R / 16), ceil(C / (8 · QM_WARPS / KS))): column group blockIdx.y · QM_WARPS / KS
// + warp / KS, split KS ways (KS = 1 or QM_KSPLIT; slots as qm_warp's).
template <int DT, int W, int KS, class Cols>
__device__ __forceinline__ void qm_block(const i8* q, const float* d, const i16* sums, int R, int K, const Cols& cols,
                                         int C, QmSlot* slots) {
    int warp = threadIdx.x / 32;
    int c0 = (blockIdx.y * (QM_WARPS / KS) + warp / KS) * 8;
    if (c0 >= C) return;  // a whole warp (with KS = QM_WARPS the whole block: the barriers are uniform)
    int r0 = blockIdx.x * 16;
    qm_warp<DT, W, KS>(q, d, sums, K, cols, c0, C, r0, min(16, R - r0), warp % KS, slots);
}

// The entry points, for TY (q4k, q6k) of type DT, each in two forms: one column group per warp (`mmqm_*`: grid
// (ceil(R / 16), ceil(N / (8 · QM_WARPS)))) or split QM_KSPLIT ways (`_ks`: grid (ceil(R / 16), ceil(N / 8)));
// both give the same bits; 32 · QM_WARPS threads, launched with PDL (src/geometry.rs `mmqm_launch`). (q, d, sums)
// come from quantize_rows of x [R, K] (256-element blocks).
// - mmqm_TY: w [N, K]; bias (bias_dt, EPI_ADD) or null; y [R, N]: as mmq_TY.
// - mmqm_glu_TY: gate, up [N, K]; out [R, N] = act(x · gateᵀ) * (x · upᵀ) as mmq_glu_TY (`_ks`: gate's rounds,
//   then up's).
// - mmqm_many_TY: three weights w0 [N0, K], w1 [N1, K], w2 [N2, K] against the same rows (as mmq_many_TY), their
//   columns side by side.
// Launch bounds and the fold's slots by KS (the `_ks` slots: [round parity][warp], 9,216 bytes).
#define QM_BOUNDS_1 __launch_bounds__(32 * QM_WARPS)
#define QM_BOUNDS_QM_KSPLIT __launch_bounds__(32 * QM_WARPS, QM_KS_BLOCKS)
#define QM_SLOTS_1 QmSlot* slots = nullptr;
#define QM_SLOTS_QM_KSPLIT __shared__ QmSlot slots[2 * QM_KSPLIT];
#define QM_ENTRIES(NAME, TY, DT, KS)                                                                                   \
    extern "C" __global__ void QM_BOUNDS_##KS mmqm_##TY##NAME(const i8* q, const float* d, const i16* sums, int R,     \
                                                              int K, const u8* w, int N, const u8* bias, int bias_dt,  \
                                                              float* y) {                                              \
        QM_SLOTS_##KS QmCols1 cols{w, (i64)(K / 256) * QmType<DT>::BB, N, bias, bias_dt, y};                           \
        qm_block<DT, 1, KS>(q, d, sums, R, K, cols, N, slots);                                                         \
    }                                                                                                                  \
    extern "C" __global__ void QM_BOUNDS_##KS mmqm_glu_##TY##NAME(const i8* q, const float* d, const i16* sums, int R, \
                                                                  int K, const u8* gate, const u8* up, int N, int act, \
                                                                  float* out) {                                        \
        QM_SLOTS_##KS QmColsGlu cols{gate, up, (i64)(K / 256) * QmType<DT>::BB, N, act, out};                          \
        qm_block<DT, 2, KS>(q, d, sums, R, K, cols, N, slots);                                                         \
    }                                                                                                                  \
    extern "C" __global__ void QM_BOUNDS_##KS mmqm_many_##TY##NAME(                                                    \
        const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,       \
        float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,         \
        int bd2, float* y2) {                                                                                          \
        QM_SLOTS_##KS QmCols3 cols{w0, w1, w2, (i64)(K / 256) * QmType<DT>::BB, N0, N1, N2, b0, b1, b2, bd0, bd1, bd2, \
                                   y0, y1, y2};                                                                        \
        qm_block<DT, 1, KS>(q, d, sums, R, K, cols, N0 + N1 + N2, slots);                                              \
    }

QM_ENTRIES(, q4k, DT_Q4K, 1)
QM_ENTRIES(_ks, q4k, DT_Q4K, QM_KSPLIT)
QM_ENTRIES(, q6k, DT_Q6K, 1)
QM_ENTRIES(_ks, q6k, DT_Q6K, QM_KSPLIT)
