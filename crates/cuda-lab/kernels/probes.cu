// The lab's probe kernels (src/probes.rs): compiled after the backend's kernels (their helpers: griddep_*,
// spin_ns, ld_stream, vec_elem) into a module of their own, never into the product's.

// One programmatic launch boundary measured alone (Probes::boundary, the bench example's
// TF_BENCH_BOUNDARY): each block lets the next launch be scheduled, waits on the previous kernel, then spins until
// ns nanoseconds of %globaltimer have passed since its wait returned. A chain of n launches then takes about
// n · (ns + one boundary) of GPU time while the host enqueues faster than that. Reads and writes nothing.
extern "C" __global__ void pdl_probe(int ns) {
    griddep_launch();
    griddep_wait();
    spin_ns(ns);
}

// A grid barrier's per-block half (barrier_probe below, chain_persist), run by one thread of each block between
// two __syncthreads: adds 1 to *count (release), then polls until it reads `want` (acquire).
__device__ __forceinline__ void counter_barrier_arrive_wait(u32* count, u32 want) {
    u32 seen;
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < want);
}

// A grid barrier in global memory measured alone (Probes::barrier, next to pdl_probe): one launch of
// blocks that must all be resident runs `rounds` rounds, each a spin of ns nanoseconds of %globaltimer, then a
// barrier: thread 0 of each block adds 1 to *count (release) and spins until it reads (round + 1) · gridDim.x
// (acquire), then the block syncs. The time per round over the spin is what a persistent kernel would pay where
// the decode chain pays a launch boundary. count: one u32, zero at entry.
extern "C" __global__ void barrier_probe(u32* count, int rounds, int ns) {
    for (int r = 0; r < rounds; r++) {
        spin_ns(ns);
        __syncthreads();
        if (threadIdx.x == 0) counter_barrier_arrive_wait(count, (u32)(r + 1) * gridDim.x);
        __syncthreads();
    }
}

// The bench example's dependent chain in one persistent launch (Probes::chain_persist; measurement only,
// never on the decode path): `steps` one-row matmuls of bf16 weights [K, K] (m distinct ones, taken in turn),
// a += b · W and b += a · W' alternating as the launched chain does, with a grid barrier between steps instead of
// a launch boundary. Each half-warp owns one column and, before it arrives at the barrier, requests its whole next
// weight row (nb = K / 128 16-byte vectors per lane, `_il1`'s loads: a half-warp's 16 vectors of block u are one
// contiguous 256-byte segment), so the weights stream while the grid waits; what is left per step is the barrier,
// the activations' reads (the acquire empties L1) and the fma chain. The fmas, loads and tree are `_il1`'s; the
// element order is not the canonical one (timing only). K ≤ 2,048, a multiple of 128; grid: K / (blockDim.x / 16)
// blocks, all resident at once; sync: gridDim.x + 1 u32, zero at entry.
// mode bit 0: the block copies x into shared memory after the barrier (one round of float4 loads), and the chains
// read it there; else each lane reads its activations from global memory. Bit 1: the barrier is a flag per block
// (its thread 0 stores the step number with release) polled by warp 0 of every block, one flag per lane with
// relaxed loads and one acquire fence when all are set; else barrier_probe's (one counter, every block adds).
// Bit 2: lane 0 keeps its column of both rows in registers (it is their only writer), so a step's residual add
// needs no load after the chain. Bit 3 (with 1 and 4): no barrier; the rows are 8-byte words (the float, and above
// it the number of the step that wrote it plus one), stored and read with relaxed gpu-scope accesses: a block
// copies the step's input into shared memory word by word, reading each word again until it carries the step's
// number (the data is its own flag, as NCCL's LL protocol does), so no acquire empties L1 and no round trip waits
// on a separate flag. a and b then hold 2K u32 each.
#define CP_MAX_NB 16
extern "C" __global__ void chain_persist(const uint4* w, float* a, float* b, u32* sync, int K, int m, int steps,
                                         int mode) {
    __shared__ __align__(16) float xs[CP_MAX_NB * 128];  // [K]: the step's input row (mode bit 0)
    const int nb = K / 128, j = threadIdx.x & 15;
    const int n = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
    const bool live = n < K;
    uint4 v[CP_MAX_NB];  // this lane's vectors of its column's row of the next step's weight
    auto fetch = [&](int s) {
        const uint4* wq = w + ((size_t)(s % m) * K + (live ? n : 0)) * (size_t)(K / 8) + j;
#pragma unroll
        for (int u = 0; u < CP_MAX_NB; u++)
            if (u < nb) v[u] = ld_stream(wq + 16 * u);
    };
    fetch(0);
    float ya = live && !(mode & 8) ? a[n] : 0.f, yb = live && !(mode & 8) ? b[n] : 0.f;  // bit 2: a[n], b[n]
    for (int s = 0; s < steps; s++) {
        const float* x = (s & 1) ? a : b;  // [K], the row the previous step wrote
        float* y = (s & 1) ? b : a;        // [K], this step's residual and output
        if (mode & 8) {
            const unsigned long long* xw = reinterpret_cast<const unsigned long long*>(x);
            for (int i = threadIdx.x; i < K; i += blockDim.x) {
                unsigned long long q;
                int tries = 0;  // bounded: a probe must not hang the GPU if the protocol is wrong
                do {
                    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(q) : "l"(xw + i) : "memory");
                } while ((u32)(q >> 32) != (u32)s && ++tries < (1 << 24));
                xs[i] = __uint_as_float((u32)q);
            }
            __syncthreads();
            x = xs;
        } else if (mode & 1) {
            for (int i = threadIdx.x; i < K / 4; i += blockDim.x)
                reinterpret_cast<float4*>(xs)[i] = reinterpret_cast<const float4*>(x)[i];
            __syncthreads();
            x = xs;
        }
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < CP_MAX_NB; u++)
            if (u < nb) {
#pragma unroll
                for (int t = 0; t < 8; t++) acc = fmaf(x[128 * u + 16 * t + j], vec_elem<DT_BF16>(v[u], t), acc);
            }
        acc += __shfl_down_sync(0xffffffffu, acc, 8, 16);
        acc += __shfl_down_sync(0xffffffffu, acc, 4, 16);
        acc += __shfl_down_sync(0xffffffffu, acc, 2, 16);
        acc += __shfl_down_sync(0xffffffffu, acc, 1, 16);
        if (live && j == 0) {
            if (mode & 4) {
                float& r = (s & 1) ? yb : ya;
                r = r + acc;
                if (mode & 8) {
                    unsigned long long q = ((unsigned long long)(u32)(s + 1) << 32) | __float_as_uint(r);
                    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(
                                     reinterpret_cast<unsigned long long*>(y) + n),
                                 "l"(q)
                                 : "memory");
                } else {
                    y[n] = r;
                }
            } else {
                y[n] = y[n] + acc;
            }
        }
        if (s + 1 < steps) fetch(s + 1);
        __syncthreads();
        if (mode & 8) {
            // the next step's reads of its input are the wait
        } else if (mode & 2) {
            u32* flags = sync + 1;  // [gridDim.x]: the steps each block has finished
            if (threadIdx.x == 0)
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x), "r"((u32)(s + 1))
                             : "memory");
            if (threadIdx.x < 32) {
                bool done;
                do {
                    done = true;
                    for (int g = threadIdx.x; g < gridDim.x; g += 32) {
                        u32 f;
                        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(flags + g) : "memory");
                        done = done && f >= (u32)(s + 1);
                    }
                } while (!__all_sync(0xffffffffu, done));
                asm volatile("fence.acq_rel.gpu;" ::: "memory");
            }
        } else if (threadIdx.x == 0) {
            counter_barrier_arrive_wait(sync, (u32)(s + 1) * gridDim.x);
        }
        __syncthreads();
    }
}
