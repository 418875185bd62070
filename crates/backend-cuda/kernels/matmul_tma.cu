// One-row matmul with the residual add whose weights reach shared memory by bulk copies (sm_90's TMA engine), not
// registers: `_il1_add_t`, Backend::matmul_add for one row when the host picks it (backend/tuning.rs, `add_tma`).
// The arithmetic is `_il1_add`'s (matmul_il.cu): lane j of a half-warp runs dot16's lane chain j over the
// interleaved row in increasing order, tree16, + bias, then the residual add; only where the weight vectors wait
// between DRAM and the fmas moves.
//
// Why: `_il1_add` keeps each lane's weights in flight in its registers (IL1_DEPTH or ADD_DEEP_DEPTH vectors), so the
// bytes in flight are bounded by threads x registers. A matrix with few columns (the 1.5B's down: 1,536 columns, 768
// warps, ~6 per SM) cannot put enough bytes in flight that way. Here one lane of each warp asks the copy engine for
// whole stages of its two rows (TMA_S vectors per lane, TMA_S x 256 bytes per row) into a ring of TMA_R stages in
// shared memory; each stage completes an mbarrier phase, the 32 lanes wait on it, read their vectors from shared
// memory, run their fmas, and the slot is asked for again TMA_R stages ahead. Registers hold only one stage.
//
// Block: TMA_COLS columns (64 threads: two warps, each two half-warps = two columns); grid ceil(N / TMA_COLS).
// TMA_PRE stages are requested before griddepcontrol.wait (weights never change under an early launch).
#ifndef TMA_S
#define TMA_S 8
#endif
#ifndef TMA_R
#define TMA_R 4
#endif
#ifndef TMA_PRE
#define TMA_PRE 1
#endif
#define TMA_COLS 4

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// mbarrier helpers (sm_90): init with one arrival per phase; the arrival also expects `bytes` of transactions.
__device__ __forceinline__ void mbar_init(u64* b, u32 count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive_tx(u64* b, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
#endif
}

// Spins until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
#if __CUDA_ARCH__ >= 900
    u32 done = 0;
    while (!done) {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_u32(b)), "r"(parity)
            : "memory");
    }
#endif
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the copy engine,
// completing as transactions on mbarrier b.
__device__ __forceinline__ void bulk_to_shared(void* dst, const void* src, u32 bytes, u64* b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
#endif
}

template <int DT>
__device__ __forceinline__ void matmul_float_il1_tma(const float* x, int K, const u8* w, int N, const u8* bias,
                                                    int bias_dt, float* y) {
    const int EPV = DT == DT_F32 ? 4 : 8;
    const int BLK = 16 * EPV;
    // ring [TMA_COLS][TMA_R][TMA_S x 16] 16-byte vectors: column c's stage slot r, vector u of lane j at [u * 16 + j].
    __shared__ __align__(128) uint4 ring[TMA_COLS][TMA_R][TMA_S * 16];
    // full [TMA_COLS / 2][TMA_R]: one mbarrier per warp and slot (both of the warp's rows land on it).
    __shared__ __align__(8) u64 full[TMA_COLS / 2][TMA_R];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int half = threadIdx.x / 16, j = threadIdx.x % 16;
    int n = blockIdx.x * TMA_COLS + half;
    bool live = n < N;
    int nb = K / BLK;                        // vectors per lane
    int ns = (nb + TMA_S - 1) / TMA_S;       // stages
    i64 row_bytes = (i64)K * (DT == DT_F32 ? 4 : 2);
    // The warp's two rows (past N: the last row again, computed and not written).
    int c0 = min(blockIdx.x * TMA_COLS + 2 * warp, N - 1), c1 = min(blockIdx.x * TMA_COLS + 2 * warp + 1, N - 1);
    const u8* row0 = w + (i64)c0 * row_bytes;
    const u8* row1 = w + (i64)c1 * row_bytes;
    u64* bars = full[warp];
    uint4(*ring0)[TMA_S * 16] = ring[2 * warp];
    uint4(*ring1)[TMA_S * 16] = ring[2 * warp + 1];
    griddep_launch();
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < TMA_R; r++) mbar_init(&bars[r], 1);
#if __CUDA_ARCH__ >= 900
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncwarp();
    // Stage s of both rows into slot s % TMA_R (lane 0 only).
    auto ask = [&](int s) {
        int r = s % TMA_R, b0 = s * TMA_S;
        u32 bytes = (u32)(min(TMA_S, nb - b0) * 256);
        mbar_arrive_tx(&bars[r], 2 * bytes);
        bulk_to_shared(ring0[r], row0 + (i64)b0 * 256, bytes, &bars[r]);
        bulk_to_shared(ring1[r], row1 + (i64)b0 * 256, bytes, &bars[r]);
    };
    int pre = min(TMA_PRE, min(TMA_R, ns));
    if (lane == 0) {
        for (int s = 0; s < pre; s++) ask(s);
    }
    griddep_wait();
    if (lane == 0) {
        for (int s = pre; s < min(TMA_R, ns); s++) ask(s);
    }
    const float* xr = x + j;
    const uint4(*mine)[TMA_S * 16] = ring[half];
    float acc = 0.0f;
    for (int s = 0; s < ns; s++) {
        int r = s % TMA_R, b0 = s * TMA_S;
        float xv[TMA_S][EPV];
#pragma unroll
        for (int u = 0; u < TMA_S; u++) {
#pragma unroll
            for (int e = 0; e < EPV; e++) xv[u][e] = b0 + u < nb ? xr[(b0 + u) * BLK + 16 * e] : 0.0f;
        }
        mbar_wait(&bars[r], (u32)(s / TMA_R) & 1u);
        uint4 v[TMA_S];
#pragma unroll
        for (int u = 0; u < TMA_S; u++) v[u] = b0 + u < nb ? mine[r][u * 16 + j] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < TMA_S; u++) {
            if (b0 + u < nb) {
#pragma unroll
                for (int e = 0; e < EPV; e++) acc = fmaf(xv[u][e], vec_elem<DT>(v[u], e), acc);
            }
        }
        // Every lane has consumed slot r (its fmas read the vectors): the slot may be asked for again.
        __syncwarp();
        if (lane == 0 && s + TMA_R < ns) ask(s + TMA_R);
    }
    float sum = tree16(acc);
    if (live && j == 0) {
        if (bias) sum = sum + deq_elem(bias_dt, bias, n);
        y[n] = y[n] + sum;
    }
}

// (x, R, K, w, N, bias, bias type, y) as `_il1_add`; blockDim.x == 16 * TMA_COLS. sm_90+ only (the host checks).
extern "C" __global__ void matmul_f32w_il1_add_t(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                                 int bias_dt, float* y) {
    matmul_float_il1_tma<DT_F32>(x, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_f16w_il1_add_t(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                                 int bias_dt, float* y) {
    matmul_float_il1_tma<DT_F16>(x, K, w, N, bias, bias_dt, y);
}

extern "C" __global__ void matmul_bf16w_il1_add_t(const float* x, int R, int K, const u8* w, int N, const u8* bias,
                                                  int bias_dt, float* y) {
    TR_ENTRY(2);
    matmul_float_il1_tma<DT_BF16>(x, K, w, N, bias, bias_dt, y);
    TR_EXIT(2);
}
