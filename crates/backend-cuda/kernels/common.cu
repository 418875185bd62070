// Shared device helpers: fixed-width integers, unaligned little-endian loads, our own f16 conversion and
// transcendentals (bit-identical to tf_quant::reference::math), and the canonical 16-lane reduction tree.
//
// Compiled by NVRTC with --fmad=false, so `a * b + c` stays two rounded operations; an fma is written as
// fmaf() exactly where the reference uses mul_add. Division and sqrt are IEEE (prec-div, prec-sqrt), no FTZ.

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Programmatic dependent launch (sm_90+; no-ops before). A kernel launched with it (src/device.rs, Launch::pdl)
// may start while the previous kernel in the stream still runs: it must call griddep_wait() before it reads
// anything that kernel wrote or writes anything at all; what it reads before (the weights, never written after
// upload) it may load early. griddep_launch() lets the next such kernel be scheduled once every block of this one
// has called it; without it that happens when this kernel's blocks exit.
__device__ __forceinline__ void griddep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// griddepcontrol.wait, placed after the loads that produced f: two predicated copies on f, one of which runs. ptxas
// schedules a plain wait independently of earlier loads and may sink them below it (matmul_il.cu); a
// wait that depends on their values cannot pass them.
__device__ __forceinline__ void griddep_wait_on(u32 f) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0x5bd1e995;\n\t@p griddepcontrol.wait;\n\t"
        "@!p griddepcontrol.wait;\n\t}" ::"r"(f)
        : "memory");
#endif
}

// PRE_WAIT (on by default; PRE_WAIT=0 is a `CudaTuning` define): kernels launched early
// (PDL) load what cannot change under them before griddep_wait: norm weights (written once at upload), and what
// the host uploaded for the step (RoPE tables, slots, block tables, the rows' metadata; an upload is ordered after
// every earlier kernel); attention also asks L2 for the K and V rows of the positions it visits. Changes no bits:
// the same values, loaded sooner.
#ifndef PRE_WAIT
#define PRE_WAIT 1
#endif

// The GGML dtype tags the host passes (`dtype_code` in src/geometry.rs).
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_Q4_0 3
#define DT_Q4_1 4
#define DT_Q5_0 5
#define DT_Q5_1 6
#define DT_Q8_0 7
#define DT_Q8_1 8
#define DT_Q2K 9
#define DT_Q3K 10
#define DT_Q4K 11
#define DT_Q5K 12
#define DT_Q6K 13
#define DT_Q8K 14
// Added to a float tag (`CudaWeight::tag`) when the weight's rows are interleaved (il_index below).
#define DT_INTERLEAVED 256
// Or-ed into a matmul's bias tag (the tensor-core kernels in kernels/mma.cu, matmul_float's row groups in
// kernels/matmul.cu): add the outputs into y, y = y + (x·wᵀ + bias) with `add`'s arithmetic, instead of writing
// them (Backend::matmul_add in one launch).
#define EPI_ADD 512

__device__ __forceinline__ u32 ld_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// tf_quant::f16_bits_to_f32: NumPy's conversion (NaN payloads kept, signalling NaNs stay signalling).
__device__ __forceinline__ float f16_bits_to_f32(u32 h) {
    const u32 SHIFTED_EXP = 0x0f800000u;
    const u32 MAGIC = 113u << 23;
    u32 sign = (h & 0x8000u) << 16;
    u32 mag = (h & 0x7fffu) << 13;
    u32 ex = mag & SHIFTED_EXP;
    u32 bits;
    if (ex == SHIFTED_EXP) {
        bits = mag + ((255u - 31u) << 23);
    } else if (ex == 0) {
        bits = __float_as_uint(__uint_as_float(mag + MAGIC) - __uint_as_float(MAGIC));
    } else {
        bits = mag + ((127u - 15u) << 23);
    }
    return __uint_as_float(bits | sign);
}

__device__ __forceinline__ float ld_f16(const u8* p) { return f16_bits_to_f32(ld_u16(p)); }
__device__ __forceinline__ float bf16_bits_to_f32(u32 h) { return __uint_as_float(h << 16); }

// ---- tf_quant::reference::math ------------------------------------------------------------------------------

__device__ __forceinline__ float pow2i(int k) { return __uint_as_float(((u32)(k + 127)) << 23); }

__device__ float tf_exp(float x) {
    if (x != x) return x;
    if (x < -104.0f) return 0.0f;
    if (x > 88.8f) return __uint_as_float(0x7f800000u);
    const float LOG2E = 1.44269504088896340736f;
    const float ROUND_MAGIC = 12582912.0f;
    const float LN2_HI = __uint_as_float(0x3f317218u);
    const float LN2_LO = __uint_as_float(0xb102e308u);
    float n = (x * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
    float r = fmaf(-n, LN2_HI, x);
    r = fmaf(-n, LN2_LO, r);
    float p = fmaf(__uint_as_float(0x39506967u), r, __uint_as_float(0x3ab743ceu));
    p = fmaf(p, r, __uint_as_float(0x3c088908u));
    p = fmaf(p, r, __uint_as_float(0x3d2aa9c1u));
    p = fmaf(p, r, __uint_as_float(0x3e2aaaaau));
    p = fmaf(p, r, __uint_as_float(0x3f000000u));
    float y = fmaf(p, r * r, r) + 1.0f;
    int k = (int)n;
    int k1 = k >> 1;
    int k2 = k - k1;
    return (y * pow2i(k1)) * pow2i(k2);
}

__device__ __forceinline__ float tf_silu(float x) { return x / (1.0f + tf_exp(-x)); }

__device__ float tf_tanh(float x) {
    float a = fabsf(x);
    float t;
    if (a < 0.625f) {
        float z = a * a;
        float q = fmaf(__uint_as_float(0xbbbaf0eau), z, __uint_as_float(0x3ca9134eu));
        q = fmaf(q, z, __uint_as_float(0xbd5c1e2du));
        q = fmaf(q, z, __uint_as_float(0x3e088393u));
        q = fmaf(q, z, __uint_as_float(0xbeaaaa99u));
        t = fmaf(q * z, a, a);
    } else {
        float e = tf_exp(-2.0f * a);
        t = (1.0f - e) / (1.0f + e);
    }
    return copysignf(t, x);
}

__device__ __forceinline__ float tf_gelu_tanh(float x) {
    const float K0 = __uint_as_float(0x3f4c422au);
    const float K1 = __uint_as_float(0x3d372713u);
    float u = K0 * (x + K1 * ((x * x) * x));
    return x / (1.0f + tf_exp(-2.0f * u));
}

// x rounded to bf16 (f16 when f16 != 0) by one cvt.rn, as the tensor arithmetic rounds activations (kernels/mma.cu,
// pack2: cvt.rn.{bf16x2,f16x2}.f32 rounds each element the same way). Producers of a window's activations write
// such a copy next to the f32 values so the tensor-core kernels read half the bytes (docs/cuda.md).
__device__ __forceinline__ u16 round_half(float x, int f16) {
    u16 h = 0;
#if __CUDA_ARCH__ >= 800
    if (f16) {
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    } else {
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    }
#else
    __trap();
#endif
    return h;
}

// The fixed tree of reference::matmul::tree16 over lanes 0..15 of each 16-lane segment: lane j ends with
// t8[j] = acc[j] + acc[j+8], then t4, t2, and lane 0 of the segment holds t2[0] + t2[1]. Every lane of the
// warp must call it (shuffles); only lane 0 of each segment has the canonical value.
__device__ __forceinline__ float tree16(float acc) {
    acc = acc + __shfl_down_sync(FULL_MASK, acc, 8, 16);
    acc = acc + __shfl_down_sync(FULL_MASK, acc, 4, 16);
    acc = acc + __shfl_down_sync(FULL_MASK, acc, 2, 16);
    acc = acc + __shfl_down_sync(FULL_MASK, acc, 1, 16);
    return acc;
}

// ---- dequantization of one element (tf_quant::dequantize, bit for bit) --------------------------------------

// Bytes per block and elements per block of each dtype tag.
__device__ __forceinline__ int block_bytes(int dt) {
    switch (dt) {
        case DT_F32: return 4;
        case DT_F16: return 2;
        case DT_BF16: return 2;
        case DT_Q4_0: return 18;
        case DT_Q4_1: return 20;
        case DT_Q5_0: return 22;
        case DT_Q5_1: return 24;
        case DT_Q8_0: return 34;
        case DT_Q8_1: return 36;
        case DT_Q2K: return 84;
        case DT_Q3K: return 110;
        case DT_Q4K: return 144;
        case DT_Q5K: return 176;
        case DT_Q6K: return 210;
        default: return 292;  // DT_Q8K
    }
}

__device__ __forceinline__ int block_elems(int dt) {
    if (dt <= DT_BF16) return 1;
    if (dt <= DT_Q8_1) return 32;
    return 256;
}

// Legacy 4-bit field of element i (< 32): qs[i % 16], low nibble for i < 16.
__device__ __forceinline__ int nib32(const u8* qs, int i) { return i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4); }
// Q2_K / Q3_K 2-bit field of element e.
__device__ __forceinline__ int crumb(const u8* qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}
// Q4_K / Q5_K 4-bit field of element e.
__device__ __forceinline__ int nib256(const u8* qs, int e) {
    return (qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 15;
}
// q3k_scales: scale j (-32..=31).
__device__ __forceinline__ int q3k_scale(const u8* s, int j) {
    int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
    int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (low | (high << 4)) - 32;
}
// q4k_scale_min: scale j and min j (6 bits each).
__device__ __forceinline__ int q4k_scale(const u8* s, int j) {
    return j < 4 ? (s[j] & 63) : ((s[j + 4] & 15) | ((s[j - 4] >> 2) & 48));
}
__device__ __forceinline__ int q4k_min(const u8* s, int j) {
    return j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 2) & 48));
}
// Q6_K 6-bit value of element e, minus 32.
__device__ __forceinline__ int q6k_q(const u8* b, int e) {
    int h = e / 128, t = (e % 128) / 32, l = e % 32;
    int low = (b[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
    int high = (b[128 + 32 * h + l] >> (2 * t)) & 3;
    return (low | (high << 4)) - 32;
}

// Interleaved float weights (`CudaWeight::interleaved`, the portable arithmetic's layout for float matrices whose
// rows are whole blocks of 16·EPV elements, EPV = 16 bytes / element size: 8 for F16/BF16, 4 for F32): within each
// block of 16·EPV elements, lane chain j's EPV elements (logical 16t + j, t = 0..EPV-1) are stored contiguously as
// the j-th 16-byte vector, physical[16·EPV·b + EPV·j + t] = logical[16·EPV·b + 16t + j]. Rows are whole blocks, so
// the map applies to an index into the whole tensor as well as to an index into one row. The physical index of
// logical element i:
__device__ __forceinline__ int il_index(int i, int epv) {
    int blk = 16 * epv;
    return i - i % blk + (i % 16) * epv + (i % blk) / 16;
}

// Element `i` of a row stored as `dt` starting at `row` (a float tag plus DT_INTERLEAVED reads through il_index).
__device__ float deq_elem(int dt, const u8* row, int i) {
    if (dt & DT_INTERLEAVED) {
        dt &= ~DT_INTERLEAVED;
        i = il_index(i, dt == DT_F32 ? 4 : 8);
    }
    if (dt == DT_F32) return __uint_as_float(ld_u32(row + 4 * i));
    if (dt == DT_F16) return ld_f16(row + 2 * i);
    if (dt == DT_BF16) return bf16_bits_to_f32(ld_u16(row + 2 * i));
    int be = block_elems(dt);
    const u8* b = row + (i / be) * block_bytes(dt);
    int e = i % be;
    switch (dt) {
        case DT_Q4_0: return ld_f16(b) * (float)(nib32(b + 2, e) - 8);
        case DT_Q4_1: return ld_f16(b) * (float)nib32(b + 4, e) + ld_f16(b + 2);
        case DT_Q5_0: {
            int q = nib32(b + 6, e) | (((ld_u32(b + 2) >> e) & 1) << 4);
            return ld_f16(b) * (float)(q - 16);
        }
        case DT_Q5_1: {
            int q = nib32(b + 8, e) | (((ld_u32(b + 4) >> e) & 1) << 4);
            return ld_f16(b) * (float)q + ld_f16(b + 2);
        }
        case DT_Q8_0: return ld_f16(b) * (float)(i8)b[2 + e];
        case DT_Q8_1: return ld_f16(b) * (float)(i8)b[4 + e];
        case DT_Q2K: {
            int sc = b[e / 16];
            float dl = ld_f16(b + 80) * (float)(sc & 15);
            float ml = ld_f16(b + 82) * (float)(sc >> 4);
            return dl * (float)crumb(b + 16, e) - ml;
        }
        case DT_Q3K: {
            float dl = ld_f16(b + 108) * (float)q3k_scale(b + 96, e / 16);
            int high = (b[e % 32] >> (e / 32)) & 1;
            return dl * (float)(crumb(b + 32, e) - 4 + 4 * high);
        }
        case DT_Q4K: {
            int j = e / 32;
            float ds = ld_f16(b) * (float)q4k_scale(b + 4, j);
            float dm = ld_f16(b + 2) * (float)q4k_min(b + 4, j);
            return ds * (float)nib256(b + 16, e) - dm;
        }
        case DT_Q5K: {
            int j = e / 32;
            float ds = ld_f16(b) * (float)q4k_scale(b + 4, j);
            float dm = ld_f16(b + 2) * (float)q4k_min(b + 4, j);
            int q = nib256(b + 48, e) | (((b[16 + e % 32] >> j) & 1) << 4);
            return ds * (float)q - dm;
        }
        case DT_Q6K: {
            float ds = ld_f16(b + 208) * (float)(i8)b[192 + e / 16];
            return ds * (float)q6k_q(b, e);
        }
        default: return __uint_as_float(ld_u32(b)) * (float)(i8)b[4 + e];  // DT_Q8K
    }
}
