//! An mmap'd GGUF (v2/v3) reader.
//!
//! Layout of a GGUF file (little-endian):
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, value_type u32, value)
//! n_tensors × (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! ```
//! Strings are a u64 byte length followed by UTF-8 bytes; arrays are an element type u32, a u64 count and the
//! elements. Every length, count, dimension and offset is checked against the bytes that remain in the file
//! before anything is allocated or read, so a corrupt file gives a [`WeightsError`], never a panic, an
//! out-of-bounds read or an allocation larger than the file.

use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use tf_core::{DType, SharedBytes, TensorInfo, WeightSource, WeightsError};

const MAGIC: &[u8; 4] = b"GGUF";
/// GGML tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (real files use depth 1).
const MAX_ARRAY_DEPTH: u32 = 4;
/// Keys and tensor names longer than this are refused (llama.cpp caps names at 64 bytes; keys are short).
const MAX_NAME_LEN: u64 = 1 << 16;
const DEFAULT_ALIGNMENT: u64 = 32;

/// A typed array value. Numeric arrays are stored unboxed (a 150k-entry vocabulary's scores are one `Vec<f32>`).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's GGUF name.
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "u8",
            GgufArray::I8(_) => "i8",
            GgufArray::U16(_) => "u16",
            GgufArray::I16(_) => "i16",
            GgufArray::U32(_) => "u32",
            GgufArray::I32(_) => "i32",
            GgufArray::U64(_) => "u64",
            GgufArray::I64(_) => "i64",
            GgufArray::F32(_) => "f32",
            GgufArray::F64(_) => "f64",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::Array(_) => "array",
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

impl GgufValue {
    /// The value as a non-negative integer, from any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, from any float or integer type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v as f64),
            GgufValue::I16(v) => Some(v as f64),
            GgufValue::I32(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// A short human-readable rendering (arrays summarized), for `tensorfold info`.
    pub fn summary(&self) -> String {
        match self {
            GgufValue::String(s) if s.len() > 60 => {
                format!("{:?}… ({} bytes)", truncate_chars(s, 60), s.len())
            }
            GgufValue::String(s) => format!("{s:?}"),
            GgufValue::Bool(b) => b.to_string(),
            GgufValue::F32(v) => v.to_string(),
            GgufValue::F64(v) => v.to_string(),
            GgufValue::Array(a) => format!("[{}; {}]", a.elem_type_name(), a.len()),
            other => other.as_u64().map(|v| v.to_string()).unwrap_or_else(|| format!("{other:?}")),
        }
    }
}

fn truncate_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The key/value metadata of a GGUF file, in file order.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer value that is ≥ 0.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any float or integer value.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        match self.get(key)? {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        match self.get_array(key)? {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        match self.get_array(key)? {
            GgufArray::I32(v) => Some(v),
            _ => None,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// Name, dtype and shape (outermost-first, i.e. `ne` reversed).
    pub info: TensorInfo,
    /// GGML dimensions, innermost first: `ne[0]` is the contiguous row length.
    pub ne: Vec<u64>,
    /// Byte offset from the start of the data section (a multiple of the alignment).
    pub offset: u64,
}

/// An open GGUF file: parsed metadata and tensor infos over a read-only memory map.
pub struct GgufFile {
    path: String,
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<GgufTensor>,
    /// `TensorInfo`s in file order (the `WeightSource` view).
    infos: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    /// Absolute file offset of the data section.
    data_start: u64,
    /// The mapped file, shared with the weights a backend keeps in place.
    mmap: Arc<Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .field("metadata", &self.metadata.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates `path`. Nothing is read beyond the header until a tensor's bytes are asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, WeightsError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|e| WeightsError::new(&name, None, format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only; like every mmap-based reader we assume the file is not truncated by
        // another process while it is open.
        let mmap =
            unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::new(&name, None, format!("cannot map: {e}")))?;
        let parsed = parse_header(&mmap, &name)?;
        let infos = parsed.tensors.iter().map(|t| t.info.clone()).collect();
        let by_name = parsed.tensors.iter().enumerate().map(|(i, t)| (t.info.name.clone(), i)).collect();
        Ok(GgufFile {
            path: name,
            version: parsed.version,
            alignment: parsed.alignment,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            infos,
            by_name,
            data_start: parsed.data_start,
            mmap: Arc::new(mmap),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensors in file order, with their GGML dims and offsets.
    pub fn gguf_tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute file offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// File size in bytes.
    pub fn file_size(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// The architecture (`general.architecture`), if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture")
    }
}

impl WeightSource for GgufFile {
    fn format(&self) -> &str {
        "gguf"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor(name).map(|t| &t.info)
    }

    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let t = self.tensor(name).ok_or_else(|| WeightsError::new(&self.path, Some(name), "no such tensor"))?;
        // Validated at open: data_start + offset + nbytes ≤ file size.
        let start = (self.data_start + t.offset) as usize;
        let end = start + t.info.nbytes() as usize;
        Ok(&self.mmap[start..end])
    }

    fn shared_bytes(&self, name: &str) -> Option<SharedBytes> {
        let t = self.tensor(name)?;
        let start = (self.data_start + t.offset) as usize;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.mmap.clone();
        let map = self.mmap.clone();
        let release = move |r: std::ops::Range<usize>| {
            // Whole pages inside the range only (neighbouring tensors keep theirs); 4 KiB pages, and where the
            // pages are larger madvise refuses the unaligned range, which is harmless.
            const PAGE: usize = 4096;
            let (from, to) = (r.start.next_multiple_of(PAGE), r.end / PAGE * PAGE);
            if from < to {
                // SAFETY: the map is a read-only shared file mapping: MADV_DONTNEED drops this process's page
                // table entries and the next read faults the same bytes back in from the file. A failure only
                // means the pages stay resident.
                #[cfg(unix)]
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from) };
            }
        };
        SharedBytes::new(owner, start..start + t.info.nbytes() as usize).map(|b| b.with_release(Arc::new(release)))
    }
}

/// A validated GGUF header: what [`parse_header`] reads from the bytes of a file.
#[derive(Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    /// Tensors in file order; each one's data lies inside the file (`data_start + offset + nbytes ≤ len`).
    pub tensors: Vec<GgufTensor>,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn err(&self, problem: impl Into<String>) -> WeightsError {
        WeightsError::new(self.file, None, problem)
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], WeightsError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {} bytes",
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WeightsError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, WeightsError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, WeightsError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str, max_len: u64) -> Result<String, WeightsError> {
        let len = self.u64(what)?;
        if len > max_len {
            return Err(self.err(format!("{what}: string length {len} exceeds the limit of {max_len} bytes")));
        }
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(format!("{what}: invalid UTF-8 at offset {at}")))
    }

    /// Checks, without allocating, that `n` length-prefixed strings follow in the file.
    fn scan_strings(&self, n: usize, what: &str) -> Result<(), WeightsError> {
        let mut pos = self.pos as u64;
        let end = self.buf.len() as u64;
        for i in 0..n {
            let len = match pos.checked_add(8).filter(|&p| p <= end) {
                Some(p) => u64::from_le_bytes(self.buf[pos as usize..p as usize].try_into().expect("8 bytes")),
                None => u64::MAX,
            };
            match pos.checked_add(8).and_then(|p| p.checked_add(len)).filter(|&p| p <= end) {
                Some(p) => pos = p,
                None => {
                    return Err(self.err(format!(
                        "{what}: string #{i} of {n} runs past the end of the file (corrupt or truncated)"
                    )))
                }
            }
        }
        Ok(())
    }

    /// How many `T`s to reserve for `n` elements about to be parsed: never more bytes than remain in the file, so
    /// a corrupt count cannot become an allocation larger than the file.
    fn prealloc<T>(&self, n: usize) -> usize {
        n.min(self.remaining() as usize / std::mem::size_of::<T>().max(1))
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit in the rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<usize, WeightsError> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(count as usize),
            _ => Err(self.err(format!(
                "{what}: count {count} cannot fit in the {} bytes left in the file (corrupt or truncated)",
                self.remaining()
            ))),
        }
    }
}

/// Minimum encoded size of one value of GGUF value type `t` (for count validation).
fn min_value_size(t: u32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,  // string: u64 length
        9 => 12, // array: u32 type + u64 count
        _ => return None,
    })
}

fn read_scalar_array<T, const N: usize>(
    c: &mut Cursor,
    n: usize,
    what: &str,
    f: fn([u8; N]) -> T,
) -> Result<Vec<T>, WeightsError> {
    let bytes = c.take(n as u64 * N as u64, what)?;
    Ok(bytes.chunks_exact(N).map(|ch| f(ch.try_into().expect("chunk of N bytes"))).collect())
}

fn read_array(c: &mut Cursor, what: &str, depth: u32) -> Result<GgufArray, WeightsError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(c.err(format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
    }
    let t = c.u32(what)?;
    let count = c.u64(what)?;
    let min = min_value_size(t).ok_or_else(|| c.err(format!("{what}: unknown array element type {t}")))?;
    let n = c.check_count(count, min, what)?;
    Ok(match t {
        0 => GgufArray::U8(c.take(n as u64, what)?.to_vec()),
        1 => GgufArray::I8(c.take(n as u64, what)?.iter().map(|&b| b as i8).collect()),
        2 => GgufArray::U16(read_scalar_array(c, n, what, u16::from_le_bytes)?),
        3 => GgufArray::I16(read_scalar_array(c, n, what, i16::from_le_bytes)?),
        4 => GgufArray::U32(read_scalar_array(c, n, what, u32::from_le_bytes)?),
        5 => GgufArray::I32(read_scalar_array(c, n, what, i32::from_le_bytes)?),
        6 => GgufArray::F32(read_scalar_array(c, n, what, f32::from_le_bytes)?),
        7 => {
            let bytes = c.take(n as u64, what)?;
            let mut v = Vec::with_capacity(n);
            for &b in bytes {
                v.push(read_bool(c, b, what)?);
            }
            GgufArray::Bool(v)
        }
        8 => {
            // Walk the length prefixes first, so a corrupt count fails before anything is allocated.
            c.scan_strings(n, what)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string(what, u64::MAX)?);
            }
            GgufArray::String(v)
        }
        9 => {
            let mut v = Vec::with_capacity(c.prealloc::<GgufArray>(n));
            for _ in 0..n {
                v.push(read_array(c, what, depth + 1)?);
            }
            GgufArray::Array(v)
        }
        10 => GgufArray::U64(read_scalar_array(c, n, what, u64::from_le_bytes)?),
        11 => GgufArray::I64(read_scalar_array(c, n, what, i64::from_le_bytes)?),
        12 => GgufArray::F64(read_scalar_array(c, n, what, f64::from_le_bytes)?),
        _ => unreachable!("checked by min_value_size"),
    })
}

fn read_bool(c: &Cursor, b: u8, what: &str) -> Result<bool, WeightsError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(c.err(format!("{what}: invalid bool byte {b}"))),
    }
}

fn read_value(c: &mut Cursor, t: u32, what: &str) -> Result<GgufValue, WeightsError> {
    Ok(match t {
        0 => GgufValue::U8(c.array::<1>(what)?[0]),
        1 => GgufValue::I8(c.array::<1>(what)?[0] as i8),
        2 => GgufValue::U16(u16::from_le_bytes(c.array(what)?)),
        3 => GgufValue::I16(i16::from_le_bytes(c.array(what)?)),
        4 => GgufValue::U32(c.u32(what)?),
        5 => GgufValue::I32(i32::from_le_bytes(c.array(what)?)),
        6 => GgufValue::F32(f32::from_le_bytes(c.array(what)?)),
        7 => {
            let b = c.array::<1>(what)?[0];
            GgufValue::Bool(read_bool(c, b, what)?)
        }
        8 => GgufValue::String(c.string(what, u64::MAX)?),
        9 => GgufValue::Array(read_array(c, what, 1)?),
        10 => GgufValue::U64(c.u64(what)?),
        11 => GgufValue::I64(i64::from_le_bytes(c.array(what)?)),
        12 => GgufValue::F64(f64::from_le_bytes(c.array(what)?)),
        _ => return Err(c.err(format!("{what}: unknown value type {t}"))),
    })
}

/// Validates the bytes of a whole GGUF file (`file` names it in errors): what [`GgufFile::open`] does after
/// mapping the file. Errors are one line.
pub fn parse_header(buf: &[u8], file: &str) -> Result<GgufHeader, WeightsError> {
    let mut c = Cursor { buf, pos: 0, file };
    let magic = c.take(4, "magic").map_err(|_| c.err("not a GGUF file: shorter than its 4-byte magic"))?;
    if magic != MAGIC {
        return Err(c.err(format!("not a GGUF file: magic is {magic:02x?}, expected \"GGUF\"")));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(c.err("GGUF version 1 is not supported (re-convert the model with a current llama.cpp)")),
        v if v.swap_bytes() <= 3 => return Err(c.err("big-endian GGUF files are not supported")),
        v => return Err(c.err(format!("unsupported GGUF version {v} (supported: 2, 3)"))),
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8 + 4 + 4 + 8.
    let n_kv = c.check_count(n_kv, 13, "metadata count")?;
    let n_tensors_usize = c.check_count(n_tensors, 24, "tensor count")?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"), MAX_NAME_LEN)?;
        let what = format!("metadata '{key}'");
        let t = c.u32(&what)?;
        let value = read_value(&mut c, t, &what)?;
        if metadata.index.contains_key(&key) {
            return Err(c.err(format!("duplicate metadata key '{key}'")));
        }
        metadata.index.insert(key.clone(), metadata.entries.len());
        metadata.entries.push((key, value));
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(c.err(format!("general.alignment must be a power of two ≤ 1 MiB, got {}", v.summary()))),
        },
    };

    let mut tensors = Vec::with_capacity(c.prealloc::<GgufTensor>(n_tensors_usize));
    let mut seen: HashMap<String, ()> = HashMap::new();
    for i in 0..n_tensors_usize {
        let name = c.string(&format!("tensor #{i} name"), MAX_NAME_LEN)?;
        let terr = |p: String| WeightsError::new(file, Some(&name), p);
        let n_dims = c.u32("tensor dims").map_err(|e| terr(e.problem))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(terr(format!("{n_dims} dimensions (GGML tensors have 1 to {MAX_DIMS})")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64("tensor dim").map_err(|e| terr(e.problem))?);
        }
        let type_id = c.u32("tensor type").map_err(|e| terr(e.problem))?;
        let offset = c.u64("tensor offset").map_err(|e| terr(e.problem))?;
        let dtype = DType::from_ggml_id(type_id).ok_or_else(|| {
            terr(format!("unsupported tensor type {} (GGML type id {type_id})", DType::ggml_id_name(type_id)))
        })?;
        if ne.contains(&0) {
            return Err(terr(format!("zero-sized dimension in {ne:?}")));
        }
        let numel = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let numel = numel
            .filter(|&n| n <= buf.len() as u64 * 8)
            .ok_or_else(|| terr(format!("absurd dimensions {ne:?}: more elements than the file could hold")))?;
        if ne[0] % dtype.block_size() as u64 != 0 {
            return Err(terr(format!(
                "row length {} is not a multiple of the {dtype} block size {}",
                ne[0],
                dtype.block_size()
            )));
        }
        if offset % alignment != 0 {
            return Err(terr(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        if seen.insert(name.clone(), ()).is_some() {
            return Err(terr("duplicate tensor name".into()));
        }
        let _ = numel;
        let shape = ne.iter().rev().copied().collect();
        tensors.push(GgufTensor { info: TensorInfo { name, dtype, shape }, ne, offset });
    }

    let header_end = c.pos as u64;
    let data_start = header_end.div_ceil(alignment) * alignment;
    let data_len = (buf.len() as u64).saturating_sub(data_start);
    if n_tensors > 0 && data_start > buf.len() as u64 {
        return Err(c.err(format!("truncated: the data section would start at {data_start}, past the end")));
    }

    // Bounds and overlap: sort by offset and check each tensor ends before the next begins.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    let mut prev_end = 0u64;
    let mut prev_name: Option<&str> = None;
    for &i in &order {
        let t = &tensors[i];
        let nbytes = t.info.nbytes();
        let end = t.offset.checked_add(nbytes).filter(|&e| e <= data_len).ok_or_else(|| {
            WeightsError::new(
                file,
                Some(&t.info.name),
                format!(
                    "data [{}, {}+{nbytes}) lies past the end of the data section ({data_len} bytes): truncated file?",
                    t.offset, t.offset
                ),
            )
        })?;
        if t.offset < prev_end {
            return Err(WeightsError::new(
                file,
                Some(&t.info.name),
                format!("data overlaps tensor '{}'", prev_name.unwrap_or("?")),
            ));
        }
        prev_end = end;
        prev_name = Some(&t.info.name);
    }

    Ok(GgufHeader { version, alignment, metadata, tensors, data_start })
}

#[cfg(test)]
mod tests;
