//! Element types of weights and activations, including GGUF's quantized block types.

use std::fmt;

/// An element type. Quantized types store `block_size()` elements in `block_bytes()` bytes.
///
/// The discriminants of the GGML types are their GGUF type ids (`ggml_type` in GGUF files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    Bool,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ4NL,
    IQ4XS,
    IQ3S,
    IQ3XXS,
    MXFP4,
    IQ2XXS,
    IQ2XS,
    IQ1S,
    IQ2S,
}

impl DType {
    /// Every type we know, in a fixed order.
    pub const ALL: [DType; 31] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::IQ3S,
        DType::IQ3XXS,
        DType::MXFP4,
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ1S,
        DType::IQ2S,
    ];

    /// The GGUF/GGML type id, where GGUF has one.
    pub fn ggml_id(self) -> Option<u32> {
        Some(match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::Q8K => 15,
            DType::IQ2XXS => 16,
            DType::IQ2XS => 17,
            DType::IQ3XXS => 18,
            DType::IQ1S => 19,
            DType::IQ2S => 22,
            DType::IQ4NL => 20,
            DType::IQ3S => 21,
            DType::IQ4XS => 23,
            DType::MXFP4 => 39,
            DType::I8 => 24,
            DType::I16 => 25,
            DType::I32 => 26,
            DType::I64 => 27,
            DType::F64 => 28,
            DType::BF16 => 30,
            DType::U8 | DType::Bool => return None,
        })
    }

    /// The type with GGUF/GGML type id `id`, or `None` for ids we do not support (IQ1_M, TQ*, ...).
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.ggml_id() == Some(id))
    }

    /// The GGML name of a GGML type id, also for ids we do not support (for error messages).
    pub fn ggml_id_name(id: u32) -> &'static str {
        match id {
            4 | 5 => "Q4_2/Q4_3 (removed from GGML)",
            29 => "IQ1_M",
            34 => "TQ1_0",
            35 => "TQ2_0",
            _ => match DType::from_ggml_id(id) {
                Some(d) => d.name(),
                None => "unknown",
            },
        }
    }

    /// The safetensors dtype name (`"F32"`, `"BF16"`, ...) mapped to a type.
    pub fn from_safetensors(name: &str) -> Option<DType> {
        Some(match name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "I8" => DType::I8,
            "I16" => DType::I16,
            "I32" => DType::I32,
            "I64" => DType::I64,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }

    /// Elements per block: 1 for plain types, 32 for the legacy quants, IQ4_NL and MXFP4, 256 for the K-quants,
    /// IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ1_S and IQ2_S.
    pub fn block_size(self) -> usize {
        match self {
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::IQ4NL
            | DType::MXFP4 => 32,
            DType::Q2K
            | DType::Q3K
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::Q8K
            | DType::IQ4XS
            | DType::IQ3S
            | DType::IQ3XXS
            | DType::IQ2XXS
            | DType::IQ2XS
            | DType::IQ1S
            | DType::IQ2S => 256,
            _ => 1,
        }
    }

    /// Bytes per block (per element for plain types). `quant` asserts these against its block structs.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
            DType::Q8K => 292,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
            DType::IQ3S => 110,
            DType::IQ3XXS => 98,
            DType::IQ2XXS => 66,
            DType::IQ2XS => 74,
            DType::IQ1S => 50,
            DType::IQ2S => 82,
            DType::MXFP4 => 17,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// The canonical name, as GGML spells it for GGML types.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::I8 => "I8",
            DType::I16 => "I16",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q8_1 => "Q8_1",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            DType::Q8K => "Q8_K",
            DType::IQ4NL => "IQ4_NL",
            DType::IQ4XS => "IQ4_XS",
            DType::IQ3S => "IQ3_S",
            DType::IQ3XXS => "IQ3_XXS",
            DType::MXFP4 => "MXFP4",
            DType::IQ2XXS => "IQ2_XXS",
            DType::IQ2XS => "IQ2_XS",
            DType::IQ1S => "IQ1_S",
            DType::IQ2S => "IQ2_S",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for d in DType::ALL {
            if let Some(id) = d.ggml_id() {
                assert_eq!(DType::from_ggml_id(id), Some(d), "{d}");
                assert_eq!(DType::ggml_id_name(id), d.name());
            }
        }
        assert_eq!(DType::from_ggml_id(20), Some(DType::IQ4NL));
        assert_eq!(DType::from_ggml_id(23), Some(DType::IQ4XS));
        assert_eq!(DType::from_ggml_id(21), Some(DType::IQ3S));
        assert_eq!(DType::from_ggml_id(39), Some(DType::MXFP4));
        assert_eq!(DType::from_ggml_id(16), Some(DType::IQ2XXS));
        assert_eq!(DType::from_ggml_id(17), Some(DType::IQ2XS));
        assert_eq!(DType::from_ggml_id(19), Some(DType::IQ1S));
        assert_eq!(DType::from_ggml_id(22), Some(DType::IQ2S));
        assert_eq!(DType::from_ggml_id(29), None);
        assert_eq!(DType::ggml_id_name(29), "IQ1_M");
        assert_eq!(DType::from_ggml_id(u32::MAX), None);
    }

    #[test]
    fn bytes_for_checks_blocks_and_overflow() {
        assert_eq!(DType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(DType::Q4_0.bytes_for(33), None);
        assert_eq!(DType::Q6K.bytes_for(512), Some(420));
        assert_eq!(DType::IQ4NL.bytes_for(64), Some(36));
        assert_eq!(DType::IQ4XS.bytes_for(512), Some(272));
        assert_eq!(DType::MXFP4.bytes_for(64), Some(34));
        assert_eq!(DType::MXFP4.bytes_for(48), None);
        assert_eq!(DType::F32.bytes_for(u64::MAX), None);
        assert_eq!(DType::F16.bytes_for(3), Some(6));
    }
}
