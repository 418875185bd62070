// Checkpoint-precision matmul of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights
// (`mmq_<type>`), bit-equal to tf_quant::reference::matmul::matmul_ref as `matmul_quant` is, built to stream each
// weight row once for up to QD_ROWS activation rows (decode, verify windows, shared rounds).
//
// A warp owns one output column n and QD_ROWS rows (grid (ceil(N / QD_WARPS), ceil(R / QD_ROWS))). It walks the
// weight row in steps of QD_BPS blocks: the step's bytes are loaded with aligned 16-byte loads (not allocated in
// L1) into the warp's shared stage, the next step's loads are issued, then lanes read their block's bytes from
// the stage (any 2-byte alignment: the blocks of Q6_K, Q3_K, Q8_0, Q5_1 and Q2_K are not 16-byte aligned in the
// file). Each block's integer sums are exact in any order: a lane (32-element blocks) or four lanes (K-quants,
// added by shuffles) give each (row, block) its float terms (the reference's rounded `dw * dx` and the i32 sums
// converted with round to nearest even), written to shared memory; lane r then folds row r's blocks in increasing
// block order with the reference's one or two fmas per block (CheckpointBlock::update). A row's arithmetic never
// sees another row: rows only share the weight bytes. The first step's weights are loaded before griddep_wait (PDL).

#define QD_ROWS 8
#define QD_WARPS 4

// 32-bit word at an even byte offset of a shared stage (the word after it is readable).
__device__ __forceinline__ u32 st_word(const u32* s, int off) {
    return __funnelshift_r(s[off >> 2], s[(off >> 2) + 1], (off & 3) * 8);
}

// Four consecutive words from an even byte offset: five loads and four funnel shifts.
__device__ __forceinline__ void st_words4(const u32* s, int off, u32* w) {
    int i = off >> 2, sh = (off & 3) * 8;
    u32 a0 = s[i], a1 = s[i + 1], a2 = s[i + 2], a3 = s[i + 3], a4 = s[i + 4];
    w[0] = __funnelshift_r(a0, a1, sh);
    w[1] = __funnelshift_r(a1, a2, sh);
    w[2] = __funnelshift_r(a2, a3, sh);
    w[3] = __funnelshift_r(a3, a4, sh);
}

__device__ __forceinline__ int st_byte(u32 w0, u32 w1, u32 w2, int i) {
    u32 w = i < 4 ? w0 : (i < 8 ? w1 : w2);
    return (int)((w >> (8 * (i & 3))) & 255u);
}

template <int DT>
struct QdSpec;
template <>
struct QdSpec<DT_Q8_0> {
    static constexpr int BB = 34, BE = 32, BPS = 32, LANES = 1, LOADS = 3, TERMS = 2;
};
template <>
struct QdSpec<DT_Q4_0> {
    static constexpr int BB = 18, BE = 32, BPS = 32, LANES = 1, LOADS = 2, TERMS = 2;
};
template <>
struct QdSpec<DT_Q4_1> {
    static constexpr int BB = 20, BE = 32, BPS = 32, LANES = 1, LOADS = 2, TERMS = 4;
};
template <>
struct QdSpec<DT_Q5_0> {
    static constexpr int BB = 22, BE = 32, BPS = 32, LANES = 1, LOADS = 2, TERMS = 2;
};
template <>
struct QdSpec<DT_Q5_1> {
    static constexpr int BB = 24, BE = 32, BPS = 32, LANES = 1, LOADS = 2, TERMS = 4;
};
template <>
struct QdSpec<DT_Q4K> {
    static constexpr int BB = 144, BE = 256, BPS = 8, LANES = 4, LOADS = 3, TERMS = 4;
};
template <>
struct QdSpec<DT_Q6K> {
    static constexpr int BB = 210, BE = 256, BPS = 8, LANES = 4, LOADS = 4, TERMS = 2;
};
template <>
struct QdSpec<DT_Q5K> {
    static constexpr int BB = 176, BE = 256, BPS = 8, LANES = 4, LOADS = 3, TERMS = 4;
};
template <>
struct QdSpec<DT_Q3K> {
    static constexpr int BB = 110, BE = 256, BPS = 8, LANES = 4, LOADS = 2, TERMS = 2;
};
template <>
struct QdSpec<DT_Q2K> {
    static constexpr int BB = 84, BE = 256, BPS = 8, LANES = 4, LOADS = 2, TERMS = 4;
};

template <int DT>
struct QdSmem {
    typedef QdSpec<DT> S;
    static constexpr int STAGE = S::LOADS * 32 * 4 + 4;         // words per stage (+ one word read past the end)
    static constexpr int FOLD = S::BPS * S::TERMS + S::TERMS;  // floats per row (padded against bank conflicts)
};

// The step at shared stage `stage` of one warp's column: blocks s·BPS .. s·BPS + cnt of the weight row (their
// bytes from byte off0 of the stage) against rows r0 .. r0 + nr; lane r < nr adds row r's block terms into acc in
// increasing block order. `fold` is the warp's shared fold area (QdSmem sizes).
template <int DT>
__device__ __forceinline__ void mmq_step(const i8* q, const float* d, const i16* sums, int K, int nb, int s, int cnt,
                                         int off0, int r0, int nr, int lane, const u32* stage, float* fold,
                                         float& acc) {
    typedef QdSpec<DT> S;
    constexpr int FOLD = QdSmem<DT>::FOLD;
    int bl = lane / S::LANES, part = lane % S::LANES;
    bool on = bl < cnt;
    int b = s * S::BPS + bl;  // block index in the row
    int off = off0 + (on ? bl : 0) * S::BB;
    if constexpr (S::BE == 32) {
        // One block per lane: its 32 weights as signed bytes in element order (Q4_0 q - 8, Q5_0 q - 16, Q5_1
        // q = nibble | bit << 4: the reference's integers), then per row 8 dp4a against the activation block.
        u32 wq[8];
        u32 hd = st_word(stage, off);
        float dw = f16_bits_to_f32(hd & 0xffffu);
        float mw = f16_bits_to_f32(hd >> 16);  // Q4_1's and Q5_1's m
        if constexpr (DT == DT_Q8_0) {
            st_words4(stage, off + 2, wq);
            st_words4(stage, off + 18, wq + 4);
        } else {
            // qs at byte 2 (Q4_0), 4 (Q4_1), 6 (Q5_0), 8 (Q5_1); qh (a little-endian u32) at 2 (Q5_0), 4 (Q5_1).
            u32 nb4[4];
            st_words4(stage, off + (DT == DT_Q4_0 ? 2 : (DT == DT_Q4_1 ? 4 : (DT == DT_Q5_0 ? 6 : 8))), nb4);
            u32 qh = DT == DT_Q5_0 ? st_word(stage, off + 2) : (DT == DT_Q5_1 ? st_word(stage, off + 4) : 0u);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 lo = nb4[k] & 0x0f0f0f0fu, hi = (nb4[k] >> 4) & 0x0f0f0f0fu;
                if constexpr (DT == DT_Q5_0 || DT == DT_Q5_1) {
                    // Four bits of qh spread to bit 4 of four bytes (the shifted copies never overlap): elements
                    // 4k..4k+3 (low nibbles) and 16+4k.. (high nibbles).
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
                wq[k] = lo;
                wq[4 + k] = hi;
            }
        }
        for (int t = 0; t < nr; t++) {
            if (on) {
                i64 r = r0 + t;
                const int4* xq = (const int4*)(q + r * K + (i64)b * 32);
                int4 x0 = xq[0], x1 = xq[1];
                int sm = __dp4a((int)wq[0], x0.x, 0);
                sm = __dp4a((int)wq[1], x0.y, sm);
                sm = __dp4a((int)wq[2], x0.z, sm);
                sm = __dp4a((int)wq[3], x0.w, sm);
                sm = __dp4a((int)wq[4], x1.x, sm);
                sm = __dp4a((int)wq[5], x1.y, sm);
                sm = __dp4a((int)wq[6], x1.z, sm);
                sm = __dp4a((int)wq[7], x1.w, sm);
                float dx = d[r * nb + b];
                if constexpr (S::TERMS == 4) {
                    float sx = (float)sums[r * nb + b];
                    *(float4*)(fold + t * FOLD + 4 * bl) = make_float4(dw * dx, (float)sm, mw * dx, sx);
                } else {
                    *(float2*)(fold + t * FOLD + 2 * bl) = make_float2(dw * dx, (float)sm);
                }
            }
        }
    } else if constexpr (DT == DT_Q4K || DT == DT_Q5K) {
        // Part p: qs bytes [32p, 32p + 32) of the block (Q4_K's qs at byte 16, Q5_K's at 48): byte l's low nibble is
        // element 64p + l (sub-block 2p), its high nibble element 64p + 32 + l (sub-block 2p + 1). Q5_K's fifth bit
        // of element 32j + l is bit j of qh[l] (qh at byte 16): bit 2p for the low nibbles, 2p + 1 for the high.
        constexpr int QS = DT == DT_Q4K ? 16 : 48;
        u32 hd[4], wq[8];
        st_words4(stage, off, hd);
        st_words4(stage, off + QS + 32 * part, wq);
        st_words4(stage, off + QS + 16 + 32 * part, wq + 4);
        int j0 = 2 * part, j1 = j0 + 1;
        // Q5_K: the 5-bit values, low nibbles in wq, high nibbles in wh (Q4_K masks wq in the loop).
        u32 wh[8];
        if constexpr (DT == DT_Q5K) {
            u32 qh[8];
            st_words4(stage, off + 16, qh);
            st_words4(stage, off + 32, qh + 4);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                wh[k] = ((wq[k] >> 4) & 0x0f0f0f0fu) | (((qh[k] >> j1) & 0x01010101u) << 4);
                wq[k] = (wq[k] & 0x0f0f0f0fu) | (((qh[k] >> j0) & 0x01010101u) << 4);
            }
        }
        int sc0 = j0 < 4 ? (st_byte(hd[1], hd[2], hd[3], j0) & 63)
                         : ((st_byte(hd[1], hd[2], hd[3], j0 + 4) & 15) |
                            ((st_byte(hd[1], hd[2], hd[3], j0 - 4) >> 2) & 48));
        int m0 = j0 < 4 ? (st_byte(hd[1], hd[2], hd[3], j0 + 4) & 63)
                        : ((st_byte(hd[1], hd[2], hd[3], j0 + 4) >> 4) |
                           ((st_byte(hd[1], hd[2], hd[3], j0) >> 2) & 48));
        int sc1 = j1 < 4 ? (st_byte(hd[1], hd[2], hd[3], j1) & 63)
                         : ((st_byte(hd[1], hd[2], hd[3], j1 + 4) & 15) |
                            ((st_byte(hd[1], hd[2], hd[3], j1 - 4) >> 2) & 48));
        int m1 = j1 < 4 ? (st_byte(hd[1], hd[2], hd[3], j1 + 4) & 63)
                        : ((st_byte(hd[1], hd[2], hd[3], j1 + 4) >> 4) |
                           ((st_byte(hd[1], hd[2], hd[3], j1) >> 2) & 48));
        float dw = f16_bits_to_f32(hd[0] & 0xffffu), dmin = f16_bits_to_f32(hd[0] >> 16);
        for (int t = 0; t < nr; t++) {
            int Sv = 0, Mv = 0;
            i64 r = r0 + t;
            if (on) {
                const int4* xq = (const int4*)(q + r * K + (i64)b * 256 + 64 * part);
                int4 x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3];
                int xs[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                              x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
                int lo = 0, hi = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    if constexpr (DT == DT_Q5K) {
                        lo = __dp4a((int)wq[k], xs[k], lo);
                        hi = __dp4a((int)wh[k], xs[8 + k], hi);
                    } else {
                        lo = __dp4a((int)(wq[k] & 0x0f0f0f0fu), xs[k], lo);
                        hi = __dp4a((int)((wq[k] >> 4) & 0x0f0f0f0fu), xs[8 + k], hi);
                    }
                }
                uint2 g = *(const uint2*)(sums + (r * nb + b) * 16 + 4 * part);
                int g0 = (int)(i16)(g.x & 0xffffu), g1 = (int)(i16)(g.x >> 16);
                int g2 = (int)(i16)(g.y & 0xffffu), g3 = (int)(i16)(g.y >> 16);
                Sv = sc0 * lo + sc1 * hi;
                Mv = m0 * (g0 + g1) + m1 * (g2 + g3);
            }
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 1);
            Mv += __shfl_xor_sync(FULL_MASK, Mv, 1);
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 2);
            Mv += __shfl_xor_sync(FULL_MASK, Mv, 2);
            if (on && part == 0) {
                float dx = d[r * nb + b];
                *(float4*)(fold + t * FOLD + 4 * bl) = make_float4(dw * dx, (float)Sv, -(dmin * dx), (float)Mv);
            }
        }
    } else if constexpr (DT == DT_Q3K || DT == DT_Q2K) {
        // Part p = 2h + lh: elements 128h + 32s + 16lh + i (s < 4, i < 16), i.e. sub-blocks j = 8h + 2s + lh. Their
        // 2-bit fields are (qs[32h + 16lh + i] >> 2s) & 3 (qs at byte 16 in Q2_K, 32 in Q3_K). Q3_K: the high bit of
        // element 32(4h + s) + 16lh + i is bit 4h + s of hmask[16lh + i] (hmask at byte 0), q = crumb + 4·bit - 4;
        // scale j (q3k_scales) is nibble h of scales[2s + lh] | bits 2(2h + s/2) of scales[8 + (2s + lh) % 4] << 4,
        // minus 32 (scales at 96, d at 108). Q2_K: scales[j] (byte j) & 15 is the scale, >> 4 the min (d at 80,
        // dmin at 82); M adds min_j · sums[j].
        int h = part >> 1, lh = part & 1;
        constexpr int QS = DT == DT_Q2K ? 16 : 32;
        u32 qa[4], v[4][4];
        st_words4(stage, off + QS + 32 * h + 16 * lh, qa);
        int sc[4], mn[4];
        float dw, dmin = 0.0f;
        if constexpr (DT == DT_Q3K) {
            u32 hm[4], sw[4];
            st_words4(stage, off + 16 * lh, hm);
            st_words4(stage, off + 96, sw);  // scales 0..11, then d
#pragma unroll
            for (int k = 0; k < 4; k++) hm[k] = (hm[k] >> (4 * h)) << 2;  // bit 4h + s of each byte at bit s + 2
#pragma unroll
            for (int s = 0; s < 4; s++) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 hb = (hm[k] >> s) & 0x04040404u;
                    v[s][k] = __vsub4(((qa[k] >> (2 * s)) & 0x03030303u) | hb, 0x04040404u);
                }
                int i = 2 * s + lh;  // j % 8: byte i of sw[s >> 1], byte 8 + i % 4 of sw[2]
                int lo4 = (int)((sw[s >> 1] >> (8 * (i & 3) + 4 * h)) & 15u);
                int hi2 = (int)((sw[2] >> (8 * (i & 3) + 2 * (2 * h + (s >> 1)))) & 3u);
                sc[s] = (lo4 | (hi2 << 4)) - 32;
                mn[s] = 0;
            }
            dw = f16_bits_to_f32(sw[3] & 0xffffu);
        } else {
            // Scales 8h .. 8h + 7; byte 2s + lh is byte 2(s % 2) of word s / 2 shifted right by 8lh.
            u32 sw[2] = {st_word(stage, off + 8 * h) >> (8 * lh), st_word(stage, off + 8 * h + 4) >> (8 * lh)};
#pragma unroll
            for (int s = 0; s < 4; s++) {
#pragma unroll
                for (int k = 0; k < 4; k++) v[s][k] = (qa[k] >> (2 * s)) & 0x03030303u;
                int sb = (int)((sw[s >> 1] >> (16 * (s & 1))) & 255u);
                sc[s] = sb & 15;
                mn[s] = sb >> 4;
            }
            u32 dd = st_word(stage, off + 80);
            dw = f16_bits_to_f32(dd & 0xffffu);
            dmin = f16_bits_to_f32(dd >> 16);
        }
        for (int t = 0; t < nr; t++) {
            int Sv = 0, Mv = 0;
            i64 r = r0 + t;
            if (on) {
                const i8* xr = q + r * K + (i64)b * 256 + 128 * h + 16 * lh;
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    int4 x = *(const int4*)(xr + 32 * s);
                    int sub = __dp4a((int)v[s][0], x.x, 0);
                    sub = __dp4a((int)v[s][1], x.y, sub);
                    sub = __dp4a((int)v[s][2], x.z, sub);
                    sub = __dp4a((int)v[s][3], x.w, sub);
                    Sv += sc[s] * sub;
                }
                if constexpr (DT == DT_Q2K) {
                    // sums[8h + i] for i = 2s + lh: word s of the 16 bytes, half lh.
                    uint4 g = *(const uint4*)(sums + (r * nb + b) * 16 + 8 * h);
                    u32 gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
                    for (int s = 0; s < 4; s++) Mv += mn[s] * (int)(i16)((gw[s] >> (16 * lh)) & 0xffffu);
                }
            }
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 1);
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 2);
            if constexpr (DT == DT_Q2K) {
                Mv += __shfl_xor_sync(FULL_MASK, Mv, 1);
                Mv += __shfl_xor_sync(FULL_MASK, Mv, 2);
            }
            if (on && part == 0) {
                float dx = d[r * nb + b];
                if constexpr (DT == DT_Q2K) {
                    *(float4*)(fold + t * FOLD + 4 * bl) = make_float4(dw * dx, (float)Sv, -(dmin * dx), (float)Mv);
                } else {
                    *(float2*)(fold + t * FOLD + 2 * bl) = make_float2(dw * dx, (float)Sv);
                }
            }
        }
    } else {  // DT_Q6K
        // Part p = 2h + lh: elements 128h + 32tt + 16lh + (0..16) for tt = 0..3, i.e. sub-blocks 8h + 2tt + lh:
        // low bits ql[64h + 16lh ..] (tt 0, 2: low, high nibble) and ql[64h + 32 + 16lh ..] (tt 1, 3), high bits
        // qh[32h + 16lh ..] >> 2tt.
        int h = part >> 1, lh = part & 1;
        u32 qa[4], qb[4], qh[4], sw[4];
        st_words4(stage, off + 64 * h + 16 * lh, qa);
        st_words4(stage, off + 64 * h + 32 + 16 * lh, qb);
        st_words4(stage, off + 128 + 32 * h + 16 * lh, qh);
        st_words4(stage, off + 192 + 8 * h, sw);  // scales 8h .. 8h + 7 (+ d, unused here)
        int sc[4];
#pragma unroll
        for (int tt = 0; tt < 4; tt++) {
            int i = 2 * tt + lh;  // scale index within the 8 read
            sc[tt] = (int)(i8)((sw[i >> 2] >> (8 * (i & 3))) & 255u);
        }
        float dw = f16_bits_to_f32(st_word(stage, off + 208) & 0xffffu);
        u32 v[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[0][k] = __vsub4((qa[k] & 0x0f0f0f0fu) | ((qh[k] & 0x03030303u) << 4), 0x20202020u);
            v[1][k] = __vsub4((qb[k] & 0x0f0f0f0fu) | (((qh[k] >> 2) & 0x03030303u) << 4), 0x20202020u);
            v[2][k] = __vsub4(((qa[k] >> 4) & 0x0f0f0f0fu) | (((qh[k] >> 4) & 0x03030303u) << 4), 0x20202020u);
            v[3][k] = __vsub4(((qb[k] >> 4) & 0x0f0f0f0fu) | (((qh[k] >> 6) & 0x03030303u) << 4), 0x20202020u);
        }
        for (int t = 0; t < nr; t++) {
            int Sv = 0;
            i64 r = r0 + t;
            if (on) {
                const i8* xr = q + r * K + (i64)b * 256 + 128 * h + 16 * lh;
#pragma unroll
                for (int tt = 0; tt < 4; tt++) {
                    int4 x = *(const int4*)(xr + 32 * tt);
                    int sub = __dp4a((int)v[tt][0], x.x, 0);
                    sub = __dp4a((int)v[tt][1], x.y, sub);
                    sub = __dp4a((int)v[tt][2], x.z, sub);
                    sub = __dp4a((int)v[tt][3], x.w, sub);
                    Sv += sc[tt] * sub;
                }
            }
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 1);
            Sv += __shfl_xor_sync(FULL_MASK, Sv, 2);
            if (on && part == 0) {
                float dx = d[r * nb + b];
                *(float2*)(fold + t * FOLD + 2 * bl) = make_float2(dw * dx, (float)Sv);
            }
        }
    }
    __syncwarp();
    if (lane < nr) {
        const float* f = fold + lane * FOLD;
        for (int k = 0; k < cnt; k++) {
            if constexpr (S::TERMS == 4) {
                float4 tm = *(const float4*)(f + 4 * k);
                acc = fmaf(tm.x, tm.y, acc);
                acc = fmaf(tm.z, tm.w, acc);
            } else {
                float2 tm = *(const float2*)(f + 2 * k);
                acc = fmaf(tm.x, tm.y, acc);
            }
        }
    }
}

// One step's bytes [a0, a1) (a0 the first block's address, cnt blocks) as the aligned 16-byte pieces from
// a0 & ~15: piece lane + 32 t (t < LOADS) is lane's; `off0` is a0's offset in the first piece.
template <int DT>
__device__ __forceinline__ u64 mmq_step_base(const u8* wr, int nb, int s, u64* a1) {
    typedef QdSpec<DT> S;
    u64 a0 = (u64)(wr + (i64)s * S::BPS * S::BB);
    *a1 = a0 + (u64)min(S::BPS, nb - s * S::BPS) * S::BB;
    return a0 & ~(u64)15;
}

// One warp's column: rows r0 .. r0 + nr of x · wrᵀ for the weight row `wr` (K elements), the result of row r0 + lane
// in lane `lane` (lanes >= nr: unspecified), for W weight rows one after the other (acc[i] for row wrs[i]; the
// GLU's gate and up). `stage` and `fold` are the warp's shared memory (QdSmem sizes); the first step's weights
// are requested before griddep_wait. One step (1.5 KB of K-quant blocks) is in flight while one is computed: a
// ring of three shared stages filled by cp.async (two in flight) decoded 12% slower (H100, 7B Q4_K_M).
template <int DT, int W>
__device__ __forceinline__ void mmq_cols(const i8* q, const float* d, const i16* sums, int K, const u8* const* wrs,
                                         int r0, int nr, int lane, u32* stage, float* fold, float* acc) {
    typedef QdSpec<DT> S;
    int nb = K / S::BE;
    int steps = (nb + S::BPS - 1) / S::BPS;
#pragma unroll
    for (int i = 0; i < W; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < W; i++) {
        const u8* wr = wrs[i];
        uint4 pre[S::LOADS];
        auto load = [&](int s) {
            u64 a1;
            u64 base = mmq_step_base<DT>(wr, nb, s, &a1);
#pragma unroll
            for (int u = 0; u < S::LOADS; u++) {
                u64 p = base + 16 * (u64)(lane + 32 * u);
                pre[u] = p < a1 ? ld_stream((const uint4*)p) : make_uint4(0, 0, 0, 0);
            }
        };
        load(0);
        if (i == 0) griddep_wait();
        for (int s = 0; s < steps; s++) {
            int cnt = min(S::BPS, nb - s * S::BPS);
            int off0 = (int)((u64)(wr + (i64)s * S::BPS * S::BB) & 15);
            __syncwarp();
#pragma unroll
            for (int u = 0; u < S::LOADS; u++) ((uint4*)stage)[lane + 32 * u] = pre[u];
            __syncwarp();
            if (s + 1 < steps) load(s + 1);
            mmq_step<DT>(q, d, sums, K, nb, s, cnt, off0, r0, nr, lane, stage, fold, acc[i]);
        }
        __syncwarp();
    }
}

// Output n of rows r0 .. r0 + nr: + bias, then with EPI_ADD in bias_dt added into y (add's arithmetic), stored.
__device__ __forceinline__ void mmq_store(float acc, int r0, int nr, int lane, int n, int N, const u8* bias,
                                          int bias_dt, float* y) {
    if (lane < nr) {
        float s = acc;
        if (bias) s = s + deq_elem(bias_dt & ~EPI_ADD, bias, n);
        if (bias_dt & EPI_ADD) s = y[(i64)(r0 + lane) * N + n] + s;
        y[(i64)(r0 + lane) * N + n] = s;
    }
}

// Block `bx` of the grid (ceil(N / QD_WARPS), ceil(R / QD_ROWS)): its warps' columns of y = x · wᵀ (+ bias).
template <int DT>
__device__ __forceinline__ void mmq_dec_at(int bx, const i8* q, const float* d, const i16* sums, int R, int K,
                                           const u8* w, int N, const u8* bias, int bias_dt, float* y) {
    typedef QdSpec<DT> S;
    __shared__ __align__(16) u32 stage_all[QD_WARPS][QdSmem<DT>::STAGE];
    __shared__ __align__(16) float fold_all[QD_WARPS][QD_ROWS * QdSmem<DT>::FOLD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n = bx * QD_WARPS + warp;
    if (n >= N) return;  // a whole warp: no barrier spans warps
    int r0 = blockIdx.y * QD_ROWS;
    int nr = min(QD_ROWS, R - r0);
    const u8* wr = w + (i64)n * (K / S::BE) * S::BB;
    float acc;
    mmq_cols<DT, 1>(q, d, sums, K, &wr, r0, nr, lane, stage_all[warp], fold_all[warp], &acc);
    mmq_store(acc, r0, nr, lane, n, N, bias, bias_dt, y);
}

template <int DT>
__device__ __forceinline__ void mmq_dec(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w,
                                        int N, const u8* bias, int bias_dt, float* y) {
    mmq_dec_at<DT>(blockIdx.x, q, d, sums, R, K, w, N, bias, bias_dt, y);
}

// out = act(x · gateᵀ) * (x · upᵀ) (act 0 SiLU, 1 GELU tanh: the `glu` kernel's arithmetic) with gate and up [N, K]
// of one type: a warp computes its column of gate, then of up (one stream of steps), each as mmq_dec's.
template <int DT>
__device__ __forceinline__ void mmq_glu(const i8* q, const float* d, const i16* sums, int R, int K, const u8* gate,
                                        const u8* up, int N, int act, float* out) {
    typedef QdSpec<DT> S;
    __shared__ __align__(16) u32 stage_all[QD_WARPS][QdSmem<DT>::STAGE];
    __shared__ __align__(16) float fold_all[QD_WARPS][QD_ROWS * QdSmem<DT>::FOLD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n = blockIdx.x * QD_WARPS + warp;
    if (n >= N) return;
    int r0 = blockIdx.y * QD_ROWS;
    int nr = min(QD_ROWS, R - r0);
    i64 row_bytes = (i64)(K / S::BE) * S::BB;
    const u8* wrs[2] = {gate + n * row_bytes, up + n * row_bytes};
    float gu[2];
    mmq_cols<DT, 2>(q, d, sums, K, wrs, r0, nr, lane, stage_all[warp], fold_all[warp], gu);
    if (lane < nr) {
        float a = act == 0 ? tf_silu(gu[0]) : tf_gelu_tanh(gu[0]);
        out[(i64)(r0 + lane) * N + n] = a * gu[1];
    }
}

// Up to three weights of one type against the same quantized rows in one launch (q/k/v): blocks [0, B0) take w0's
// columns, [B0, B0 + B1) w1's, the rest w2's (Bi = ceil(Ni / QD_WARPS)); each output as mmq_dec's.
template <int DT>
__device__ __forceinline__ void mmq_many(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0,
                                         int N0, const u8* b0, int bd0, float* y0, const u8* w1, int N1,
                                         const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
                                         int bd2, float* y2) {
    int B0 = (N0 + QD_WARPS - 1) / QD_WARPS, B1 = (N1 + QD_WARPS - 1) / QD_WARPS;
    int bx = blockIdx.x;
    if (bx < B0) {
        mmq_dec_at<DT>(bx, q, d, sums, R, K, w0, N0, b0, bd0, y0);
    } else if (bx < B0 + B1) {
        mmq_dec_at<DT>(bx - B0, q, d, sums, R, K, w1, N1, b1, bd1, y1);
    } else {
        mmq_dec_at<DT>(bx - B0 - B1, q, d, sums, R, K, w2, N2, b2, bd2, y2);
    }
}

// (q, d, sums) from quantize_rows of x [R, K]; w [N, K] in the kernel's type; bias (bias_dt) or null; y [R, N]
// (with EPI_ADD in bias_dt: y += the product, add's arithmetic). grid (ceil(N / QD_WARPS), ceil(R / QD_ROWS)), 32 * QD_WARPS threads; launched with PDL.
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q8_0(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q8_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q4_0(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q4_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q4_1(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q4_1>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q5_0(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q5_0>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q4k(const i8* q, const float* d, const i16* sums,
                                                                   int R, int K, const u8* w, int N,
                                                                   const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q4K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q6k(const i8* q, const float* d, const i16* sums,
                                                                   int R, int K, const u8* w, int N,
                                                                   const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q6K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q5_1(const i8* q, const float* d, const i16* sums,
                                                                     int R, int K, const u8* w, int N,
                                                                     const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q5_1>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q5k(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q5K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q3k(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q3K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_q2k(const i8* q, const float* d, const i16* sums,
                                                                    int R, int K, const u8* w, int N,
                                                                    const u8* bias, int bias_dt, float* y) {
    mmq_dec<DT_Q2K>(q, d, sums, R, K, w, N, bias, bias_dt, y);
}

// mmq_glu_<type>: (q, d, sums) of x [R, K]; gate, up [N, K]; out [R, N]; act 0 SiLU, 1 GELU (tanh). Grid as
// mmq_<type>'s.
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q8_0(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q8_0>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q4_0(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q4_0>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q4_1(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q4_1>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q5_0(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q5_0>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q4k(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q4K>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q6k(const i8* q, const float* d, const i16* sums,
                                                                       int R, int K, const u8* gate, const u8* up,
                                                                       int N, int act, float* out) {
    mmq_glu<DT_Q6K>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q5_1(const i8* q, const float* d, const i16* sums,
                                                                         int R, int K, const u8* gate, const u8* up,
                                                                         int N, int act, float* out) {
    mmq_glu<DT_Q5_1>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q5k(const i8* q, const float* d, const i16* sums,
                                                                        int R, int K, const u8* gate, const u8* up,
                                                                        int N, int act, float* out) {
    mmq_glu<DT_Q5K>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q3k(const i8* q, const float* d, const i16* sums,
                                                                        int R, int K, const u8* gate, const u8* up,
                                                                        int N, int act, float* out) {
    mmq_glu<DT_Q3K>(q, d, sums, R, K, gate, up, N, act, out);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS) mmq_glu_q2k(const i8* q, const float* d, const i16* sums,
                                                                        int R, int K, const u8* gate, const u8* up,
                                                                        int N, int act, float* out) {
    mmq_glu<DT_Q2K>(q, d, sums, R, K, gate, up, N, act, out);
}
// mmq_many_<type>: three weights (w, N, bias, bias type, y) against the same rows (a third with N2 = 0 for two);
// grid (B0 + B1 + B2, ceil(R / QD_ROWS)), Bi = ceil(Ni / QD_WARPS).
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q8_0(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q8_0>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q4_0(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q4_0>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q4_1(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q4_1>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q5_0(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q5_0>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q4k(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q4K>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q6k(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q6K>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q5_1(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q5_1>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q5k(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q5K>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q3k(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q3K>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
extern "C" __global__ void __launch_bounds__(32 * QD_WARPS)
mmq_many_q2k(const i8* q, const float* d, const i16* sums, int R, int K, const u8* w0, int N0, const u8* b0, int bd0,
          float* y0, const u8* w1, int N1, const u8* b1, int bd1, float* y1, const u8* w2, int N2, const u8* b2,
          int bd2, float* y2) {
    mmq_many<DT_Q2K>(q, d, sums, R, K, w0, N0, b0, bd0, y0, w1, N1, b1, bd1, y1, w2, N2, b2, bd2, y2);
}
