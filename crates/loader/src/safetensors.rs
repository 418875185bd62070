//! An mmap'd safetensors reader: single files and sharded checkpoint directories.
//!
//! Layout of a safetensors file:
//! ```text
//! header_len u64 (little-endian) | header: header_len bytes of UTF-8 JSON | data section
//! ```
//! The header is a JSON object mapping each tensor name to `{"dtype": "F32", "shape": [2, 3],
//! "data_offsets": [begin, end]}` (offsets relative to the start of the data section), plus an optional
//! `"__metadata__"` object of string to string. A sharded checkpoint is a directory holding
//! `model.safetensors.index.json` (`{"metadata": {...}, "weight_map": {tensor: shard file}}`) and the shards.
//!
//! The header is parsed here (not by the `safetensors` crate) so that every check is ours: the header length
//! against the file and a cap, the JSON, duplicate names, known dtypes, overflow-checked shapes, offsets inside
//! the data section whose length matches dtype × shape, and no two tensors sharing bytes. Every problem is a
//! [`WeightsError`] naming the file, the tensor and the problem; nothing panics, reads out of bounds or
//! allocates more than a small multiple of the header.
//!
//! Tensor data is not realigned: a tensor's bytes start wherever the writer put them (writers pad the header so
//! the data section starts 8-aligned, and tensors are usually packed in order), so consumers must not assume
//! more than byte alignment.

use memmap2::Mmap;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use tf_core::{DType, TensorInfo, WeightSource, WeightsError};

/// Headers longer than this are refused (the reference implementation uses the same cap).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Index files longer than this are refused (real ones are tens of kilobytes).
pub const MAX_INDEX_LEN: u64 = 64 << 20;
/// The index file name of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The file name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Tensors with more dimensions than this are refused (real checkpoints use at most 5).
const MAX_DIMS: usize = 64;

fn err(file: &Path, tensor: Option<&str>, problem: impl Into<String>) -> WeightsError {
    WeightsError::new(file.display().to_string(), tensor, problem)
}

/// One safetensors file, mmap'd, with its header validated.
pub struct SafetensorsFile {
    /// The path the file was opened from (used in error messages).
    path: PathBuf,
    /// The whole file, mapped read-only.
    mmap: Mmap,
    /// Tensor infos in data order (ascending begin offset, then name).
    tensors: Vec<TensorInfo>,
    /// Absolute byte ranges in `mmap`, parallel to `tensors`; validated inside the data section.
    ranges: Vec<Range<usize>>,
    /// Tensor name → index into `tensors`.
    by_name: HashMap<String, usize>,
    /// The `__metadata__` string map (empty when absent).
    metadata: BTreeMap<String, String>,
    /// Offset of the data section in the file (8 + header length).
    data_start: usize,
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .field("data_start", &self.data_start)
            .finish()
    }
}

/// The header's top-level entries in file order, keeping duplicates (serde_json's map would drop them).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Validates one tensor entry and returns its info and data-relative byte range.
fn parse_entry(path: &Path, name: &str, v: &Value, data_len: u64) -> Result<(TensorInfo, Range<u64>), WeightsError> {
    let e = |p: String| err(path, Some(name), p);
    let obj = v.as_object().ok_or_else(|| e(format!("header entry is not an object: {}", short(v))))?;
    let dtype_v = obj.get("dtype").ok_or_else(|| e("header entry has no \"dtype\"".into()))?;
    let dtype_s = dtype_v.as_str().ok_or_else(|| e(format!("\"dtype\" is not a string: {}", short(dtype_v))))?;
    let dtype = DType::from_safetensors(dtype_s)
        .ok_or_else(|| e(format!("unsupported dtype \"{}\"", truncate(dtype_s, 32))))?;
    let shape_v = obj.get("shape").ok_or_else(|| e("header entry has no \"shape\"".into()))?;
    let dims = shape_v.as_array().ok_or_else(|| e(format!("\"shape\" is not an array: {}", short(shape_v))))?;
    if dims.len() > MAX_DIMS {
        return Err(e(format!("shape has {} dimensions (at most {MAX_DIMS} accepted)", dims.len())));
    }
    let mut shape = Vec::with_capacity(dims.len());
    let mut numel: u64 = 1;
    for d in dims {
        let d = d.as_u64().ok_or_else(|| e(format!("shape dimension {} is not a non-negative integer", short(d))))?;
        numel =
            numel.checked_mul(d).ok_or_else(|| e(format!("shape {} overflows the element count", short(shape_v))))?;
        shape.push(d);
    }
    let nbytes = dtype
        .bytes_for(numel)
        .ok_or_else(|| e(format!("shape {} of {dtype} overflows the byte count", short(shape_v))))?;
    let off_v = obj.get("data_offsets").ok_or_else(|| e("header entry has no \"data_offsets\"".into()))?;
    let offs = off_v
        .as_array()
        .filter(|a| a.len() == 2)
        .ok_or_else(|| e(format!("\"data_offsets\" is not a pair [begin, end]: {}", short(off_v))))?;
    let (begin, end) = match (offs[0].as_u64(), offs[1].as_u64()) {
        (Some(b), Some(en)) => (b, en),
        _ => return Err(e(format!("\"data_offsets\" {} are not non-negative integers", short(off_v)))),
    };
    if begin > end {
        return Err(e(format!("data_offsets [{begin}, {end}] end before they begin")));
    }
    if end > data_len {
        return Err(e(format!("data_offsets [{begin}, {end}] run past the data section ({data_len} bytes)")));
    }
    if end - begin != nbytes {
        return Err(e(format!(
            "data_offsets [{begin}, {end}] hold {} bytes but {dtype} {:?} needs {nbytes}",
            end - begin,
            shape
        )));
    }
    Ok((TensorInfo { name: name.to_owned(), dtype, shape }, begin..end))
}

/// A compact rendering of a JSON value for error messages.
fn short(v: &Value) -> String {
    truncate(&v.to_string(), 64)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

impl SafetensorsFile {
    /// Opens and validates a safetensors file. The file must not be modified while it is open (it is mmap'd).
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, WeightsError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| err(path, None, format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| err(path, None, format!("cannot stat: {e}")))?.len();
        if len < 8 {
            return Err(err(path, None, format!("file is {len} bytes, too short for the 8-byte header length")));
        }
        // SAFETY: the map is read-only; like every mmap'd reader we require that the file is not truncated or
        // rewritten while open (documented on `open`).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| err(path, None, format!("cannot mmap: {e}")))?;
        Self::from_mmap(path.to_path_buf(), mmap)
    }

    fn from_mmap(path: PathBuf, mmap: Mmap) -> Result<SafetensorsFile, WeightsError> {
        let h = parse_header(&path, &mmap)?;
        let by_name = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let SafetensorsHeader { tensors, ranges, metadata, data_start } = h;
        Ok(SafetensorsFile { path, mmap, tensors, ranges, by_name, metadata, data_start })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `__metadata__` map of the header (empty when absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Offset of the data section from the start of the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// The absolute byte range of tensor `name` in the file.
    pub fn file_range(&self, name: &str) -> Option<Range<usize>> {
        self.by_name.get(name).map(|&i| self.ranges[i].clone())
    }
}

/// A validated safetensors header: what [`parse_header`] reads from the bytes of a file.
#[derive(Debug)]
pub struct SafetensorsHeader {
    /// Tensor infos in data order (ascending begin offset, then name).
    pub tensors: Vec<TensorInfo>,
    /// Absolute byte ranges in the file, parallel to `tensors`: inside the data section, not overlapping, each
    /// as long as its dtype and shape need.
    pub ranges: Vec<Range<usize>>,
    /// The `__metadata__` string map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Offset of the data section in the file (8 + header length).
    pub data_start: usize,
}

/// Validates the bytes of a whole safetensors file (`path` names it in errors): what
/// [`SafetensorsFile::open`] does after mapping the file. Errors are one line.
pub fn parse_header(path: &Path, bytes: &[u8]) -> Result<SafetensorsHeader, WeightsError> {
    let p = path;
    let file_len = bytes.len() as u64;
    if file_len < 8 {
        return Err(err(p, None, format!("file is {file_len} bytes, too short for the 8-byte header length")));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&bytes[..8]);
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > file_len - 8 {
        return Err(err(p, None, format!("header length {header_len} exceeds the {} bytes after it", file_len - 8)));
    }
    if header_len > MAX_HEADER_LEN {
        return Err(err(p, None, format!("header length {header_len} exceeds the cap of {MAX_HEADER_LEN} bytes")));
    }
    if header_len < 2 {
        return Err(err(p, None, format!("header length {header_len} is too short for a JSON object")));
    }
    // Both fit usize: they are at most the mapped length.
    let data_start = 8 + header_len as usize;
    let header = &bytes[8..data_start];
    if header[0] != b'{' {
        return Err(err(p, None, "header does not start with '{'"));
    }
    let entries: Entries =
        serde_json::from_slice(header).map_err(|e| err(p, None, format!("header is not valid JSON: {e}")))?;
    let data_len = file_len - data_start as u64;

    let mut metadata = BTreeMap::new();
    let mut seen_metadata = false;
    let mut parsed: Vec<(TensorInfo, Range<u64>)> = Vec::with_capacity(entries.0.len());
    let mut names: HashSet<&str> = HashSet::with_capacity(entries.0.len());
    for (name, v) in &entries.0 {
        if name == "__metadata__" {
            if seen_metadata {
                return Err(err(p, None, "header has two \"__metadata__\" entries"));
            }
            seen_metadata = true;
            metadata = parse_metadata(p, v)?;
            continue;
        }
        if !names.insert(name) {
            return Err(err(p, Some(name), "tensor appears twice in the header"));
        }
        parsed.push(parse_entry(p, name, v, data_len)?);
    }

    // Order by data offset (the "file order"); zero-length tensors sort by name among equal offsets.
    parsed.sort_by(|a, b| (a.1.start, a.1.end, &a.0.name).cmp(&(b.1.start, b.1.end, &b.0.name)));
    let mut prev: Option<(&str, u64)> = None;
    for (info, r) in &parsed {
        if r.is_empty() {
            continue;
        }
        if let Some((pname, pend)) = prev {
            if r.start < pend {
                return Err(err(
                    p,
                    Some(&info.name),
                    format!("data_offsets [{}, {}] overlap tensor '{pname}' (ends at {pend})", r.start, r.end),
                ));
            }
        }
        prev = Some((&info.name, r.end));
    }

    let mut tensors = Vec::with_capacity(parsed.len());
    let mut ranges = Vec::with_capacity(parsed.len());
    for (info, r) in parsed {
        // In bounds of the file: r.end <= data_len, so data_start + r.end <= file_len.
        ranges.push(data_start + r.start as usize..data_start + r.end as usize);
        tensors.push(info);
    }
    Ok(SafetensorsHeader { tensors, ranges, metadata, data_start })
}

fn parse_metadata(p: &Path, v: &Value) -> Result<BTreeMap<String, String>, WeightsError> {
    let obj = v.as_object().ok_or_else(|| err(p, None, format!("\"__metadata__\" is not an object: {}", short(v))))?;
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        let s = v.as_str().ok_or_else(|| {
            err(p, None, format!("\"__metadata__\" value of \"{}\" is not a string: {}", truncate(k, 64), short(v)))
        })?;
        out.insert(k.clone(), s.to_owned());
    }
    Ok(out)
}

impl WeightSource for SafetensorsFile {
    fn format(&self) -> &str {
        "safetensors"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let &i = self.by_name.get(name).ok_or_else(|| err(&self.path, Some(name), "no such tensor"))?;
        self.mmap
            .get(self.ranges[i].clone())
            .ok_or_else(|| err(&self.path, Some(name), "tensor bytes out of bounds (file changed?)"))
    }
}

/// A checkpoint made of one or more safetensors files: a single `model.safetensors`, or shards named by
/// `model.safetensors.index.json`. Each shard is mmap'd once.
#[derive(Debug)]
pub struct SafetensorsModel {
    /// The directory (or index file's directory) the model was opened from.
    dir: PathBuf,
    /// The opened shards, in file-name order.
    shards: Vec<SafetensorsFile>,
    /// All tensors: shard by shard, each in its file order.
    tensors: Vec<TensorInfo>,
    /// Tensor name → (shard index, tensor index within the shard).
    locate: HashMap<String, (usize, usize)>,
    /// The index file's `"metadata"` object (e.g. `total_size`), when there is an index.
    index_metadata: Option<Value>,
}

impl SafetensorsModel {
    /// Opens a checkpoint directory: `model.safetensors.index.json` when present, else `model.safetensors`.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<SafetensorsModel, WeightsError> {
        let dir = dir.as_ref();
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Ok(Self::from_single(dir.to_path_buf(), SafetensorsFile::open(&single)?));
        }
        if !dir.is_dir() {
            return Err(err(dir, None, "not a directory"));
        }
        let mut found: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| err(dir, None, format!("cannot list: {e}")))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        found.sort();
        let hint = if found.is_empty() {
            "it holds no .safetensors files".to_owned()
        } else {
            format!("it holds {}; open one with SafetensorsFile::open", found.join(", "))
        };
        Err(err(dir, None, format!("neither {INDEX_FILE} nor {SINGLE_FILE} found ({hint})")))
    }

    /// Wraps one already opened file as a model.
    pub fn from_single(dir: PathBuf, file: SafetensorsFile) -> SafetensorsModel {
        let tensors = file.tensors.clone();
        let locate = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), (0, i))).collect();
        SafetensorsModel { dir, shards: vec![file], tensors, locate, index_metadata: None }
    }

    /// Opens a sharded checkpoint through its index file; shard paths are relative to the index's directory.
    pub fn open_index(index_path: impl AsRef<Path>) -> Result<SafetensorsModel, WeightsError> {
        let ip = index_path.as_ref();
        let dir = ip.parent().map(Path::to_path_buf).unwrap_or_default();
        let meta = std::fs::metadata(ip).map_err(|e| err(ip, None, format!("cannot open: {e}")))?;
        if meta.len() > MAX_INDEX_LEN {
            return Err(err(ip, None, format!("index is {} bytes (cap {MAX_INDEX_LEN})", meta.len())));
        }
        let text = std::fs::read(ip).map_err(|e| err(ip, None, format!("cannot read: {e}")))?;
        let root: Value =
            serde_json::from_slice(&text).map_err(|e| err(ip, None, format!("index is not valid JSON: {e}")))?;
        let map = root
            .get("weight_map")
            .ok_or_else(|| err(ip, None, "index has no \"weight_map\""))?
            .as_object()
            .ok_or_else(|| err(ip, None, "\"weight_map\" is not an object"))?;
        if map.is_empty() {
            return Err(err(ip, None, "\"weight_map\" is empty"));
        }
        // Shard file → tensors the index assigns to it.
        let mut wanted: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                err(ip, Some(tensor), format!("weight_map value is not a file name: {}", short(shard)))
            })?;
            check_shard_name(ip, tensor, shard)?;
            wanted.entry(shard).or_default().push(tensor);
        }
        let mut shards = Vec::with_capacity(wanted.len());
        let mut tensors = Vec::new();
        let mut locate: HashMap<String, (usize, usize)> = HashMap::new();
        for (shard_name, names) in &wanted {
            let sp = dir.join(shard_name);
            if !sp.is_file() {
                return Err(err(
                    ip,
                    Some(names[0]),
                    format!("weight_map points to shard '{shard_name}', which is missing ({})", sp.display()),
                ));
            }
            let file = SafetensorsFile::open(&sp)?;
            for name in names {
                if file.info(name).is_none() {
                    return Err(err(
                        ip,
                        Some(name),
                        format!("weight_map places the tensor in '{shard_name}', which does not contain it"),
                    ));
                }
            }
            let si = shards.len();
            for (ti, t) in file.tensors().iter().enumerate() {
                if let Some(&(other, _)) = locate.get(&t.name) {
                    let other: &SafetensorsFile = &shards[other];
                    return Err(err(
                        &sp,
                        Some(&t.name),
                        format!("tensor also appears in shard {}", other.path.display()),
                    ));
                }
                match map.get(&t.name).and_then(Value::as_str) {
                    Some(s) if s != *shard_name => {
                        return Err(err(
                            &sp,
                            Some(&t.name),
                            format!("tensor is in this shard but the index places it in '{s}'"),
                        ))
                    }
                    _ => {}
                }
                locate.insert(t.name.clone(), (si, ti));
                tensors.push(t.clone());
            }
            shards.push(file);
        }
        Ok(SafetensorsModel { dir, shards, tensors, locate, index_metadata: root.get("metadata").cloned() })
    }

    /// The directory the checkpoint lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The opened shard files (one for a single-file checkpoint).
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    /// The index's `"metadata"` object, when opened through an index.
    pub fn index_metadata(&self) -> Option<&Value> {
        self.index_metadata.as_ref()
    }

    /// The shard holding tensor `name`.
    pub fn shard_of(&self, name: &str) -> Option<&SafetensorsFile> {
        self.locate.get(name).map(|&(s, _)| &self.shards[s])
    }
}

/// Shard names must stay inside the checkpoint directory: relative, no `..`, no root or prefix.
fn check_shard_name(ip: &Path, tensor: &str, shard: &str) -> Result<(), WeightsError> {
    let p = Path::new(shard);
    let ok = !shard.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(err(
            ip,
            Some(tensor),
            format!("weight_map shard name '{}' is not a plain relative path", truncate(shard, 128)),
        ))
    }
}

impl WeightSource for SafetensorsModel {
    fn format(&self) -> &str {
        "safetensors"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.locate.get(name).map(|&(s, t)| &self.shards[s].tensors[t])
    }

    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        match self.locate.get(name) {
            Some(&(s, _)) => self.shards[s].bytes(name),
            None => Err(err(&self.dir, Some(name), "no such tensor in the checkpoint")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Builds a file from a header string and a data section.
    fn file_with(header: &str, data: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        f.write_all(data).unwrap();
        f.flush().unwrap();
        f
    }

    fn open_err(header: &str, data: &[u8]) -> WeightsError {
        let f = file_with(header, data);
        SafetensorsFile::open(f.path()).expect_err(header)
    }

    #[test]
    fn reads_a_minimal_file() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},
                   "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0,3],"data_offsets":[12,12]}}"#;
        let data: Vec<u8> = (0u8..12).collect();
        let f = file_with(h, &data);
        let st = SafetensorsFile::open(f.path()).unwrap();
        let names: Vec<_> = st.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "z"]);
        assert_eq!(st.bytes("a").unwrap(), &data[..8]);
        assert_eq!(st.bytes("b").unwrap(), &data[8..12]);
        assert_eq!(st.bytes("z").unwrap(), &[] as &[u8]);
        assert_eq!(st.metadata()["format"], "pt");
        assert_eq!(st.info("b").unwrap().shape, vec![2]);
        assert!(st.bytes("nope").is_err());
    }

    #[test]
    fn rejects_bad_headers() {
        let cases: &[(&str, &[u8], &str)] = &[
            (r#"{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}"#, &[0], "unsupported dtype"),
            (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, &[0; 8], "needs 8"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}"#, &[0; 4], "past the data section"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#, &[0; 4], "end before"),
            (r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, &[0; 4], "not a non-negative"),
            (r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#, &[0; 4], "overflows"),
            (r#"{"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4]}}"#, &[0; 4], "overflows"),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
                "overlap",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
                "twice",
            ),
            (r#"{"a":{"dtype":"F32","shape":[1]}}"#, &[0; 4], "no \"data_offsets\""),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, &[0; 4], "pair"),
            (r#"{"__metadata__":{"k":1}}"#, &[], "not a string"),
            (r#"{"a":1}"#, &[], "not an object"),
            (r#"{"a":"#, &[], "not valid JSON"),
            (r#"[1,2]"#, &[], "start with"),
        ];
        for (h, data, want) in cases {
            let e = open_err(h, data);
            assert!(e.to_string().contains(want), "{h}: got {e}");
        }
        // Errors name the tensor.
        assert_eq!(open_err(cases[0].0, cases[0].1).tensor.as_deref(), Some("a"));
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[1, 2, 3]).unwrap();
        assert!(SafetensorsFile::open(f.path()).unwrap_err().problem.contains("too short"));
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&u64::MAX.to_le_bytes()).unwrap();
        f.write_all(b"{}").unwrap();
        assert!(SafetensorsFile::open(f.path()).unwrap_err().problem.contains("exceeds"));
        let e = SafetensorsFile::open("/nonexistent/x.safetensors").unwrap_err();
        assert!(e.problem.contains("cannot open") && e.file.contains("x.safetensors"));
    }

    #[test]
    fn empty_header_object_is_fine() {
        let f = file_with("{}      ", &[]);
        assert!(SafetensorsFile::open(f.path()).unwrap().tensors().is_empty());
    }

    #[test]
    fn shard_names_must_stay_inside() {
        let p = Path::new("i.json");
        assert!(check_shard_name(p, "t", "model-00001-of-00002.safetensors").is_ok());
        assert!(check_shard_name(p, "t", "sub/x.safetensors").is_ok());
        for bad in ["../x.safetensors", "/etc/passwd", "", "a/../../b", "./x"] {
            assert!(check_shard_name(p, "t", bad).is_err(), "{bad}");
        }
    }
}
