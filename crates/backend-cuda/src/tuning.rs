//! [`CudaTuning`]: every choice of the CUDA backend that changes speed and never an output's bits, as one typed
//! value. Its [`Default`] is what the product runs (the measured best, docs/perf-notes-cuda.md); `tensorfold
//! bench` and the lab (crates/cuda-lab) may set other values, `serve` and `run` refuse to ([`CudaTuning::from_env`],
//! [`env_overrides`]). Each field's alternatives are covered by tests that compare bits (tests/ops.rs,
//! tests/kv_writes.rs) or, for kernel defines, compile them (tests/compile.rs).

/// The CUDA backend's tuning (module docs). Fields other than `defines` may change on a live backend
/// (`CudaBackend::tune`); `defines` are fixed when the kernels are compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTuning {
    /// Upload float matrices of the portable arithmetic interleaved (`il_index` in kernels/common.cu): one-row
    /// steps run about 25% faster, and row groups read them at `matmul_float`'s speed. Default on.
    pub interleave: bool,
    /// Columns per block of the one-row interleaved kernels: 0 by shape ([`crate::geometry::il_cols`]), else a
    /// power of two from 2 to 16. Default 0.
    pub il_cols: u32,
    /// Which one-row projections norm their own input (bit 0 q/k/v, bit 1 gate/up; the others take `rms_norm`
    /// first). Default 2: gate/up only (below K 4,096, `geometry::GLU_NORM_BELOW_K`), which is 3% faster on the
    /// 1.5B shape on the H200; q/k/v norming their row was 4% slower.
    pub norm_fuse: u8,
    /// One row's `norm_qkv_rope_kv_write` rotates and writes the cache in the projections' epilogue (else the
    /// projections, then `rope_kv_write`). Default on.
    pub qkv_rope: bool,
    /// Which `_il1_qkv_rope` one row's fused q/k/v runs: `None` the shallower `_il1_qkv_rope_w` when the default's
    /// grid is more than the GPU holds at once (the default), `Some(true)` always, `Some(false)` never.
    pub qkv_wide: Option<bool>,
    /// Which `_il1_add` one row's `matmul_add` runs: `None` the deeper `_il1_add_d` when its grid fits the GPU at
    /// once (few columns: the 1.5B's o and down, 2–3% faster on the H200), else `_il1_add` (the default);
    /// `Some(true)` / `Some(false)` forced.
    pub add_deep: Option<bool>,
    /// Query heads of one KV group per attention block: 0 by block count (the default), 1..=7 at most that many.
    pub attn_heads: usize,
    /// Checkpoint matmuls of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights on the
    /// streaming kernels (kernels/matmul_q.cu); off: `matmul_quant`, as every other type. Default on.
    pub quant_stream: bool,
    /// Row count from which those checkpoint matmuls run on the tensor cores instead (kernels/matmul_qt.cu, the
    /// same bits; needs sm_80 or newer); 0: never. Default 24: near where a forward of the 7B Q4_K_M shape costs
    /// the same both ways (H100, docs/benchmarks.md).
    pub quant_tiles: u32,
    /// Row count from which Q4_K and Q6_K checkpoint matmuls of up to `geometry::QM_MAX_ROWS` rows take the
    /// tensor-core streaming kernels (kernels/matmul_qm.cu: `mma` on each weight row read once per 16 rows, the same
    /// bits; needs sm_80 or newer) instead of `mmq_q4k`/`mmq_q6k`'s integer dot products per row or the tiles; 0:
    /// never. Default 4: at 4 rows a forward of the 7B Q4_K_M shape costs 5.1 ms with both types on them against 6.7
    /// ms on the per-row kernels; at 2–3 rows the per-row kernels are cheaper (H100, docs/benchmarks.md).
    pub quant_mma: u32,
    /// Kernel preprocessor defines (default none: the kernels' own values).
    pub defines: Vec<KernelDefine>,
}

impl Default for CudaTuning {
    fn default() -> CudaTuning {
        CudaTuning {
            interleave: true,
            il_cols: 0,
            norm_fuse: 2,
            qkv_rope: true,
            qkv_wide: None,
            add_deep: None,
            attn_heads: 0,
            quant_stream: true,
            quant_tiles: 24,
            quant_mma: 4,
            defines: Vec::new(),
        }
    }
}

/// The kernel defines a [`CudaTuning`] may set, with the kernels' defaults: `IL_PIPE` 1 (kernels/matmul_il.cu:
/// software-pipelined weight loads), `IL_DEPTH` 4, `IL1_DEPTH` 6, `GLU_DEPTH` and `MANY_DEPTH` (loads in flight per
/// lane), `BULK_PF` 0 (bulk L2 prefetch of the next weight rows), `PRE_WAIT` 1 (kernels/common.cu: loads before
/// the programmatic-launch wait), `NORM_PER` 4 (kernels/ops.cu: elements per thread of the norms), `ATTN_VSPLIT` 2
/// (kernels/attention.cu: blocks per head of the one-row attention kernel), `QM_PF` 8 (kernels/matmul_qm.cu: blocks
/// between a weight row's L2 prefetch and its use; 0 none). None changes an output's bits.
pub const KERNEL_DEFINES: [&str; 10] = [
    "IL_PIPE",
    "IL_DEPTH",
    "IL1_DEPTH",
    "GLU_DEPTH",
    "MANY_DEPTH",
    "BULK_PF",
    "PRE_WAIT",
    "NORM_PER",
    "ATTN_VSPLIT",
    "QM_PF",
];

/// One kernel define `NAME=VALUE`, NAME one of [`KERNEL_DEFINES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelDefine {
    pub name: &'static str,
    pub value: i64,
}

impl KernelDefine {
    /// `NAME=INTEGER` with NAME one of [`KERNEL_DEFINES`].
    pub fn parse(s: &str) -> Result<KernelDefine, String> {
        let (n, v) = s.split_once('=').ok_or_else(|| format!("kernel define {s:?}: expected NAME=INTEGER"))?;
        let value = v.parse::<i64>().map_err(|_| format!("kernel define {s:?}: expected NAME=INTEGER"))?;
        let name = KERNEL_DEFINES.iter().find(|&&k| k == n).ok_or_else(|| {
            format!("kernel define {s:?}: NAME=INTEGER with NAME one of {}", KERNEL_DEFINES.join(", "))
        })?;
        Ok(KernelDefine { name, value })
    }

    /// Whitespace-separated defines (`"IL_PIPE=0 PRE_WAIT=0"`).
    pub fn parse_list(s: &str) -> Result<Vec<KernelDefine>, String> {
        s.split_whitespace().map(KernelDefine::parse).collect()
    }
}

impl std::fmt::Display for KernelDefine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// The environment variables [`CudaTuning::from_env`] reads, each naming one field.
pub const ENV_VARS: [&str; 11] = [
    "TF_CUDA_INTERLEAVE",
    "TF_CUDA_IL_COLS",
    "TF_CUDA_NORM_FUSE",
    "TF_CUDA_QKV_ROPE",
    "TF_CUDA_QKV_WIDE",
    "TF_CUDA_ADD_DEEP",
    "TF_CUDA_ATTN_HEADS",
    "TF_CUDA_QUANT_STREAM",
    "TF_CUDA_QUANT_TILES",
    "TF_CUDA_QUANT_MMA",
    "TF_CUDA_DEFINES",
];

/// Every `TF_CUDA_*` variable set in the environment, sorted: what `serve` and `run` refuse (they run the
/// defaults only).
pub fn env_overrides() -> Vec<String> {
    overrides_in(std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()))
}

fn overrides_in(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = names.filter(|k| k.starts_with("TF_CUDA_")).collect();
    v.sort();
    v
}

impl CudaTuning {
    /// The defaults with the environment's overrides ([`ENV_VARS`]: `TF_CUDA_INTERLEAVE=0|1`, `TF_CUDA_IL_COLS=N`,
    /// `TF_CUDA_NORM_FUSE=0..3`, `TF_CUDA_QKV_ROPE=0|1`, `TF_CUDA_QKV_WIDE=0|1`, `TF_CUDA_ADD_DEEP=0|1`,
    /// `TF_CUDA_ATTN_HEADS=0..7`, `TF_CUDA_QUANT_STREAM=0|1`, `TF_CUDA_QUANT_TILES=0..65536`, `TF_CUDA_QUANT_MMA=0..65536`, `TF_CUDA_DEFINES="NAME=INTEGER ..."`), for `tensorfold bench` and the lab. A value
    /// out of range, or another `TF_CUDA_*` variable, is an error naming it.
    pub fn from_env() -> Result<CudaTuning, String> {
        CudaTuning::from_vars(|k| std::env::var(k).ok(), &env_overrides())
    }

    /// [`CudaTuning::from_env`] over `get` and the `TF_CUDA_*` names `set`.
    fn from_vars(get: impl Fn(&str) -> Option<String>, set: &[String]) -> Result<CudaTuning, String> {
        if let Some(k) = set.iter().find(|k| !ENV_VARS.contains(&k.as_str())) {
            return Err(format!("{k}: not a CUDA tuning variable (those are {})", ENV_VARS.join(", ")));
        }
        let mut t = CudaTuning::default();
        let num = |k: &str, max: u32| -> Result<Option<u32>, String> {
            match get(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u32>() {
                    Ok(n) if n <= max => Ok(Some(n)),
                    _ => Err(format!("{k}={v}: expected an integer from 0 to {max}")),
                },
            }
        };
        let flag = |k: &str| -> Result<Option<bool>, String> { Ok(num(k, 1)?.map(|n| n == 1)) };
        if let Some(on) = flag("TF_CUDA_INTERLEAVE")? {
            t.interleave = on;
        }
        if let Some(c) = num("TF_CUDA_IL_COLS", 16)? {
            if c != 0 && !(c.is_power_of_two() && c >= 2) {
                return Err(format!("TF_CUDA_IL_COLS={c}: expected 0, 2, 4, 8 or 16"));
            }
            t.il_cols = c;
        }
        if let Some(b) = num("TF_CUDA_NORM_FUSE", 3)? {
            t.norm_fuse = b as u8;
        }
        if let Some(on) = flag("TF_CUDA_QKV_ROPE")? {
            t.qkv_rope = on;
        }
        t.qkv_wide = flag("TF_CUDA_QKV_WIDE")?;
        t.add_deep = flag("TF_CUDA_ADD_DEEP")?;
        if let Some(h) = num("TF_CUDA_ATTN_HEADS", 7)? {
            t.attn_heads = h as usize;
        }
        if let Some(on) = flag("TF_CUDA_QUANT_STREAM")? {
            t.quant_stream = on;
        }
        if let Some(n) = num("TF_CUDA_QUANT_TILES", 65536)? {
            t.quant_tiles = n;
        }
        if let Some(n) = num("TF_CUDA_QUANT_MMA", 65536)? {
            t.quant_mma = n;
        }
        if let Some(d) = get("TF_CUDA_DEFINES") {
            t.defines = KernelDefine::parse_list(&d).map_err(|e| format!("TF_CUDA_DEFINES: {e}"))?;
        }
        Ok(t)
    }

    /// The defines as the kernels' compiler takes them (`NAME=VALUE`).
    pub fn define_strings(&self) -> Vec<String> {
        self.defines.iter().map(KernelDefine::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<CudaTuning, String> {
        let set: Vec<String> = vars.iter().map(|(k, _)| k.to_string()).collect();
        CudaTuning::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()), &set)
    }

    #[test]
    fn no_variables_give_the_defaults() {
        assert_eq!(parse(&[]), Ok(CudaTuning::default()));
    }

    #[test]
    fn each_variable_sets_its_field() {
        let t = parse(&[
            ("TF_CUDA_INTERLEAVE", "0"),
            ("TF_CUDA_IL_COLS", "8"),
            ("TF_CUDA_NORM_FUSE", "3"),
            ("TF_CUDA_QKV_ROPE", "0"),
            ("TF_CUDA_QKV_WIDE", "1"),
            ("TF_CUDA_ADD_DEEP", "0"),
            ("TF_CUDA_ATTN_HEADS", "1"),
            ("TF_CUDA_QUANT_STREAM", "0"),
            ("TF_CUDA_QUANT_TILES", "0"),
            ("TF_CUDA_QUANT_MMA", "5"),
            ("TF_CUDA_DEFINES", "IL_PIPE=0  PRE_WAIT=0"),
        ])
        .unwrap();
        let want = CudaTuning {
            interleave: false,
            il_cols: 8,
            norm_fuse: 3,
            qkv_rope: false,
            qkv_wide: Some(true),
            add_deep: Some(false),
            attn_heads: 1,
            quant_stream: false,
            quant_tiles: 0,
            quant_mma: 5,
            defines: vec![KernelDefine { name: "IL_PIPE", value: 0 }, KernelDefine { name: "PRE_WAIT", value: 0 }],
        };
        assert_eq!(t, want);
        assert_eq!(t.define_strings(), ["IL_PIPE=0", "PRE_WAIT=0"]);
    }

    #[test]
    fn bad_values_and_unknown_variables_are_refused_by_name() {
        for (k, v) in [
            ("TF_CUDA_IL_COLS", "3"),
            ("TF_CUDA_IL_COLS", "32"),
            ("TF_CUDA_NORM_FUSE", "4"),
            ("TF_CUDA_QKV_WIDE", "yes"),
            ("TF_CUDA_ATTN_HEADS", "8"),
            ("TF_CUDA_QUANT_TILES", "70000"),
            ("TF_CUDA_DEFINES", "ELIDE=1"),
            ("TF_CUDA_DEFINES", "IL_PIPE"),
            ("TF_CUDA_GAPS", "1"),
        ] {
            let e = parse(&[(k, v)]).expect_err(k);
            assert!(e.contains(k) || e.contains(v), "{k}={v}: {e}");
        }
    }

    #[test]
    fn overrides_are_every_tf_cuda_variable() {
        let names = ["PATH", "TF_CUDA_DEFINES", "TF_KERNEL_CACHE", "TF_CUDA_IL_COLS"].map(String::from);
        assert_eq!(overrides_in(names.into_iter()), ["TF_CUDA_DEFINES", "TF_CUDA_IL_COLS"]);
    }
}
