//! A GGUF v3 writer: builds files that `gguf::GgufFile` (and llama.cpp) read. Used to make tiny test
//! checkpoints and by tests of the reader.

use crate::gguf::{GgufArray, GgufValue};
use tf_core::DType;

/// Collects metadata and tensors, then serializes them with `to_bytes`.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: u64,
    kv: Vec<(String, GgufValue)>,
    /// (name, dtype, ne innermost-first, raw data bytes)
    tensors: Vec<(String, DType, Vec<u64>, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { alignment: 32, kv: Vec::new(), tensors: Vec::new() }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `general.alignment` (a power of two) and writes it as metadata.
    pub fn alignment(mut self, a: u32) -> Self {
        self.alignment = a as u64;
        self.kv.push(("general.alignment".into(), GgufValue::U32(a)));
        self
    }

    pub fn kv(mut self, key: &str, value: GgufValue) -> Self {
        self.kv.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor with GGML dims `ne` (innermost first) and its raw bytes (not checked against the dtype,
    /// so tests can write broken files).
    pub fn tensor(mut self, name: &str, dtype: DType, ne: &[u64], data: Vec<u8>) -> Self {
        self.tensors.push((name.to_owned(), dtype, ne.to_vec(), data));
        self
    }

    /// Adds an F32 tensor.
    pub fn tensor_f32(self, name: &str, ne: &[u64], values: &[f32]) -> Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, DType::F32, ne, data)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let lens: Vec<u64> = self.tensors.iter().map(|t| t.3.len() as u64).collect();
        let (mut out, offsets) = self.header(&lens);
        let data_start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Writes the file to `out` without holding it in memory: a tensor added with empty data gets the size its
    /// dtype and dims give, and its bytes from `fill(tensor index, buffer of that size)`; the others are written as
    /// stored. For checkpoints too large to build with [`Self::to_bytes`].
    pub fn write_streamed(
        &self,
        out: &mut impl std::io::Write,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> std::io::Result<()> {
        let lens: Vec<u64> = self
            .tensors
            .iter()
            .map(|(_, dtype, ne, data)| match data.is_empty() {
                true => ne.iter().product::<u64>() / dtype.block_size() as u64 * dtype.block_bytes() as u64,
                false => data.len() as u64,
            })
            .collect();
        let (head, offsets) = self.header(&lens);
        out.write_all(&head)?;
        let mut at = 0u64;
        let mut buf = Vec::new();
        for (i, (_, _, _, data)) in self.tensors.iter().enumerate() {
            out.write_all(&vec![0u8; (offsets[i] - at) as usize])?;
            if data.is_empty() {
                buf.resize(lens[i] as usize, 0);
                fill(i, &mut buf);
                out.write_all(&buf)?;
            } else {
                out.write_all(data)?;
            }
            at = offsets[i] + lens[i];
        }
        Ok(())
    }

    /// Everything before the tensor data (padded to the alignment), and each tensor's offset in the data.
    fn header(&self, lens: &[u64]) -> (Vec<u8>, Vec<u64>) {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for ((name, dtype, ne, _), len) in self.tensors.iter().zip(lens) {
            put_str(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            let id = dtype.ggml_id().expect("a GGML dtype");
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + len).div_ceil(self.alignment) * self.alignment;
        }
        pad_to(&mut out, self.alignment);
        (out, offsets)
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn array_type(a: &GgufArray) -> u32 {
    match a {
        GgufArray::U8(_) => 0,
        GgufArray::I8(_) => 1,
        GgufArray::U16(_) => 2,
        GgufArray::I16(_) => 3,
        GgufArray::U32(_) => 4,
        GgufArray::I32(_) => 5,
        GgufArray::F32(_) => 6,
        GgufArray::Bool(_) => 7,
        GgufArray::String(_) => 8,
        GgufArray::Array(_) => 9,
        GgufArray::U64(_) => 10,
        GgufArray::I64(_) => 11,
        GgufArray::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&array_type(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => out.extend_from_slice(v),
        GgufArray::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        GgufArray::U16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        GgufArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        GgufArray::Array(v) => v.iter().for_each(|x| put_array(out, x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_equals_to_bytes() {
        let q = vec![7u8; 2 * 34];
        let full = GgufWriter::new().kv("k", GgufValue::U32(3)).tensor_f32("a", &[3], &[1., 2., 3.]).tensor(
            "b",
            DType::Q8_0,
            &[32, 2],
            q.clone(),
        );
        let lazy = GgufWriter::new().kv("k", GgufValue::U32(3)).tensor_f32("a", &[3], &[1., 2., 3.]).tensor(
            "b",
            DType::Q8_0,
            &[32, 2],
            Vec::new(),
        );
        let mut out = Vec::new();
        lazy.write_streamed(&mut out, |i, buf| {
            assert_eq!((i, buf.len()), (1, q.len()));
            buf.copy_from_slice(&q);
        })
        .unwrap();
        assert_eq!(out, full.to_bytes());
    }
}
