//! `WeightSource`: one read-only view over the tensors of a checkpoint, whatever its file format.

use crate::DType;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// What a source knows about one tensor.
///
/// `shape` is outermost-first (row-major, as PyTorch and safetensors write it): a GGUF tensor with
/// `ne = [cols, rows]` has `shape = [rows, cols]`. The last dimension is the contiguous one; for quantized types
/// it is a whole number of blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of data. Sources validate this against the file before handing a tensor out.
    pub fn nbytes(&self) -> u64 {
        self.dtype.bytes_for(self.numel()).unwrap_or(u64::MAX)
    }
}

/// An error reading weights: names the file, the tensor (when there is one) and the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsError {
    pub file: String,
    pub tensor: Option<String>,
    pub problem: String,
}

impl WeightsError {
    /// The parts are kept on one line: control characters (a tensor name or key read from a corrupt file may hold
    /// any) are written as escapes ([`escape_controls`]).
    pub fn new(file: impl Into<String>, tensor: Option<&str>, problem: impl Into<String>) -> Self {
        WeightsError {
            file: escape_controls(file.into()),
            tensor: tensor.map(|t| escape_controls(t.to_owned())),
            problem: escape_controls(problem.into()),
        }
    }
}

/// `s` with every control character (newlines, NUL, ...) written as its Rust escape (`\n`, `\u{0}`), so text
/// read from a file or a request stays on one line in a message. Other text is unchanged.
pub fn escape_controls(s: String) -> String {
    if !s.chars().any(char::is_control) {
        return s;
    }
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tensor {
            Some(t) => write!(f, "{}: tensor '{}': {}", self.file, t, self.problem),
            None => write!(f, "{}: {}", self.file, self.problem),
        }
    }
}

impl std::error::Error for WeightsError {}

/// Read-only access to a checkpoint's tensors. Implemented by the GGUF and safetensors readers in `loader`.
///
/// Every tensor a source lists has been validated: its bytes lie inside the file and match its dtype and shape.
pub trait WeightSource: Send + Sync {
    /// A short description of the format ("gguf", "safetensors").
    fn format(&self) -> &str;
    /// Tensor infos in file order.
    fn tensors(&self) -> &[TensorInfo];
    /// The info of tensor `name`, if present.
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors().iter().find(|t| t.name == name)
    }
    /// The raw little-endian bytes of tensor `name`, exactly `info(name).nbytes()` long.
    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError>;
    /// The same bytes as [`WeightSource::bytes`], held by a shared owner (the mapped file) that a backend may
    /// keep instead of copying them; `None` when the source cannot share them.
    fn shared_bytes(&self, _name: &str) -> Option<SharedBytes> {
        None
    }
}

/// A byte range of a shared owner (an mmap'd checkpoint): kept alive by whoever holds a clone, so a backend can
/// use weights in place (no second copy in memory).
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
    /// How the owner drops a range from this process's resident memory without changing it (a mapped file's
    /// pages, read back from the file when touched again); `None`: it cannot.
    release: Option<Release>,
}

/// See [`SharedBytes::with_release`].
pub type Release = Arc<dyn Fn(Range<usize>) + Send + Sync>;

impl SharedBytes {
    /// `range` of `owner`'s bytes; `None` when it lies outside them.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<SharedBytes> {
        let total = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= total).then(|| SharedBytes {
            owner,
            start: range.start,
            len: range.end - range.start,
            release: None,
        })
    }

    /// These bytes with a way for the owner to drop a range of its bytes from resident memory; `release` must
    /// leave the bytes unchanged (e.g. `MADV_DONTNEED` on a read-only file mapping, never on anonymous memory).
    pub fn with_release(mut self, release: Release) -> SharedBytes {
        self.release = Some(release);
        self
    }

    /// Tells the owner these bytes will not be read for a while (a backend that copied them into its own
    /// layout): a mapped file drops their pages from this process's resident set. The bytes stay readable and
    /// unchanged; owners without a way to release ignore it.
    pub fn release(&self) {
        self.release_part(0..self.len);
    }

    /// As [`SharedBytes::release`] for `part` of these bytes (offsets into [`SharedBytes::as_slice`], clamped).
    pub fn release_part(&self, part: Range<usize>) {
        let (from, to) = (part.start.min(self.len), part.end.min(self.len));
        if let (Some(f), true) = (&self.release, from < to) {
            f(self.start + from..self.start + to);
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.start)
    }
}
