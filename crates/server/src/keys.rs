//! API keys: `--api-key` (one key) and `--api-key-file` (one key per line; blank lines and lines starting with `#`
//! are skipped), the file re-read on SIGHUP. Keys are held only as SHA-256 digests; a presented key is hashed and
//! compared with every digest in constant time (no early exit, and the digest length does not depend on the
//! key's). Keys are never logged: errors name the file and the line number, never a key.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

type KeyDigest = [u8; 32];

/// The keys the API routes accept. No keys at all: the routes are open.
pub struct ApiKeys {
    /// `--api-key`, kept across reloads.
    fixed: Option<KeyDigest>,
    /// `--api-key-file`, re-read by [`ApiKeys::reload`].
    file: Option<PathBuf>,
    /// The file's keys as last read successfully.
    from_file: RwLock<Arc<Vec<KeyDigest>>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys").field("required", &self.required()).field("file", &self.file).finish()
    }
}

impl Default for ApiKeys {
    fn default() -> Self {
        ApiKeys::open()
    }
}

impl ApiKeys {
    /// No keys: every API route is open.
    pub fn open() -> Self {
        ApiKeys { fixed: None, file: None, from_file: RwLock::new(Arc::new(Vec::new())) }
    }

    /// `key` (empty counts as none) and the keys of `file`. A file that cannot be read, or that holds no key, is
    /// an error: starting with an empty key file would shut every client out.
    pub fn new(key: Option<&str>, file: Option<&Path>) -> Result<Self, String> {
        let fixed = key.map(str::trim).filter(|k| !k.is_empty()).map(digest);
        let from_file = match file {
            Some(p) => read_keys(p)?,
            None => Vec::new(),
        };
        Ok(ApiKeys { fixed, file: file.map(Path::to_path_buf), from_file: RwLock::new(Arc::new(from_file)) })
    }

    /// Whether the API routes require a key.
    pub fn required(&self) -> bool {
        self.fixed.is_some() || self.file.is_some()
    }

    /// The key file, if one was given.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Re-reads the key file: the number of keys it now holds. On an error the keys in use stay as they were.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(p) = &self.file else { return Ok(0) };
        let keys = read_keys(p)?;
        let n = keys.len();
        *self.from_file.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        Ok(n)
    }

    /// Whether `presented` is one of the keys. Every digest is compared, whatever matched before.
    pub fn accepts(&self, presented: &str) -> bool {
        let d = digest(presented);
        let from_file = self.from_file.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut hit = 0u8;
        for k in self.fixed.iter().chain(from_file.iter()) {
            hit |= constant_time_eq(k, &d) as u8;
        }
        hit == 1
    }
}

fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality of two digests whose running time does not depend on where they differ.
fn constant_time_eq(a: &KeyDigest, b: &KeyDigest) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The keys of a key file: one per line, surrounding whitespace trimmed, blank lines and `#` lines skipped.
fn read_keys(path: &Path) -> Result<Vec<KeyDigest>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the API key file {}: {e}", path.display()))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "the API key file {}, line {}: a key may not contain spaces or control characters",
                path.display(),
                i + 1
            ));
        }
        keys.push(digest(line));
    }
    if keys.is_empty() {
        return Err(format!(
            "the API key file {} holds no key (one key per line; `#` starts a comment)",
            path.display()
        ));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(text: &str) -> tempfile_like::File {
        tempfile_like::File::new(text)
    }

    /// A file in the system temp directory, removed on drop (the crate has no tempfile dependency).
    mod tempfile_like {
        pub struct File(pub std::path::PathBuf);
        impl File {
            pub fn new(text: &str) -> File {
                use std::sync::atomic::{AtomicU64, Ordering};
                static N: AtomicU64 = AtomicU64::new(0);
                let p = std::env::temp_dir().join(format!(
                    "tf-keys-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, text).unwrap();
                File(p)
            }
        }
        impl Drop for File {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn keys_from_flag_and_file_are_accepted_and_others_are_not() {
        let f = file_with("# team keys\nalpha-1\n\n  beta-2  \n");
        let k = ApiKeys::new(Some("gamma-3"), Some(&f.0)).unwrap();
        assert!(k.required());
        for good in ["alpha-1", "beta-2", "gamma-3"] {
            assert!(k.accepts(good), "{good}");
        }
        for bad in ["", "alpha", "alpha-1 ", "# team keys", "beta-2x", "ALPHA-1"] {
            assert!(!k.accepts(bad), "{bad:?}");
        }
        assert!(!ApiKeys::open().required());
        assert!(!ApiKeys::new(Some("  "), None).unwrap().required());
    }

    #[test]
    fn reload_takes_the_new_file_and_keeps_the_old_keys_on_an_error() {
        let f = file_with("one\ntwo\n");
        let k = ApiKeys::new(None, Some(&f.0)).unwrap();
        assert!(k.accepts("two") && !k.accepts("three"));
        std::fs::write(&f.0, "three\n").unwrap();
        assert_eq!(k.reload(), Ok(1));
        assert!(k.accepts("three") && !k.accepts("one") && !k.accepts("two"));
        // An emptied file is refused; the keys in use stay.
        std::fs::File::create(&f.0).unwrap().write_all(b"# nothing\n").unwrap();
        let e = k.reload().unwrap_err();
        assert!(e.contains("holds no key"), "{e}");
        assert!(k.accepts("three"));
        std::fs::remove_file(&f.0).unwrap();
        assert!(k.reload().unwrap_err().contains("cannot read"));
        assert!(k.accepts("three"));
    }

    #[test]
    fn errors_never_contain_a_key() {
        let f = file_with("good-key\nbad key with spaces\n");
        let e = ApiKeys::new(None, Some(&f.0)).unwrap_err();
        assert!(e.contains("line 2") && !e.contains("bad key") && !e.contains("good-key"), "{e}");
        assert!(!format!("{:?}", ApiKeys::new(Some("secret-xyz"), None).unwrap()).contains("secret"));
    }
}
