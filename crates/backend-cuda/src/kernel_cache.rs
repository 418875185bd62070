//! The kernels' PTX kept on disk between runs, so a start compiles with NVRTC only when the kernel sources, the
//! options (architecture, tuning defines) or the NVRTC version changed: a file named by the SHA-256 of all of
//! them. The driver keeps its own cache of the machine code it makes from the PTX, so a later start on the same
//! machine does neither. A file that does not check out (truncated, edited) is ignored and rewritten; a folder
//! that cannot be written only costs the compile (a start never fails for the cache).
//!
//! Where: `TF_KERNEL_CACHE` (a folder, or `off`), else `$XDG_CACHE_HOME/tensorfold/kernels`, else
//! `$HOME/.cache/tensorfold/kernels`.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// How many compiles the folder keeps.
const KEEP: usize = 8;

/// The last line of every cached file: the SHA-256 of the PTX before it.
const FOOTER: &str = "// tensorfold kernel cache, sha256 of the above: ";

pub struct KernelCache {
    dir: PathBuf,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl KernelCache {
    /// The folder the environment names (module docs), or None when the cache is off or no folder is known.
    pub fn from_env() -> Option<KernelCache> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        match var("TF_KERNEL_CACHE") {
            Some(p) if p.as_os_str() == "off" => None,
            Some(p) => Some(KernelCache::at(p)),
            None => var("XDG_CACHE_HOME")
                .or_else(|| var("HOME").map(|h| h.join(".cache")))
                .map(|c| KernelCache::at(c.join("tensorfold").join("kernels"))),
        }
    }

    pub fn at(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of the compile of `program` with `options` by `compiler` (e.g. "nvrtc 12.9"): every input that
    /// can change the PTX, each length-prefixed so no two lists hash alike.
    pub fn key(program: &str, options: &[String], compiler: &str) -> String {
        let mut h = Sha256::new();
        for part in std::iter::once(compiler).chain(options.iter().map(String::as_str)).chain([program]) {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        hex(&h.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.ptx"))
    }

    /// The PTX stored under `key`, if a whole, unaltered file is there.
    pub fn get(&self, key: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(key)).ok()?;
        let (ptx, footer) = text.rsplit_once('\n')?;
        let sum = footer.strip_prefix(FOOTER)?;
        (sum == hex(&Sha256::digest(ptx.as_bytes())) && !ptx.is_empty()).then(|| ptx.to_string())
    }

    /// Stores `ptx` under `key`: written to a temporary file and renamed, so a reader never sees half a file.
    /// Errors are returned for the caller to ignore (or report).
    pub fn put(&self, key: &str, ptx: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!("{key}.{}.tmp", std::process::id()));
        let text = format!("{ptx}\n{FOOTER}{}", hex(&Sha256::digest(ptx.as_bytes())));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.path(key)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        self.prune(key);
        Ok(())
    }

    /// Keeps the `KEEP` most recently written compiles (each ~8 MB; older tensorfold versions and tuning variants
    /// leave theirs behind), never removing `key`'s.
    fn prune(&self, key: &str) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "ptx") && *p != self.path(key))
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, p) in files.into_iter().skip(KEEP - 1) {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tf-kernel-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_stored_compile_comes_back_and_only_under_its_own_key() {
        let c = KernelCache::at(scratch("roundtrip"));
        let opts = vec!["--gpu-architecture=compute_90".to_string()];
        let k = KernelCache::key("kernel source", &opts, "nvrtc 12.9");
        assert_eq!(c.get(&k), None, "an empty cache");
        let ptx = ".version 8.8\n.target sm_90\n.entry k() { ret; }";
        c.put(&k, ptx).unwrap();
        assert_eq!(c.get(&k).as_deref(), Some(ptx));
        // Any input that can change the PTX is another key.
        let others = [
            KernelCache::key("kernel source ", &opts, "nvrtc 12.9"),
            KernelCache::key("kernel source", &["--gpu-architecture=compute_80".to_string()], "nvrtc 12.9"),
            KernelCache::key("kernel source", &[opts[0].clone(), "-DIL_PIPE=0".into()], "nvrtc 12.9"),
            KernelCache::key("kernel source", &opts, "nvrtc 13.0"),
            // Boundaries between the parts count: the same bytes split differently.
            KernelCache::key("source", &["--gpu-architecture=compute_90kernel ".to_string()], "nvrtc 12.9"),
        ];
        for o in &others {
            assert_ne!(o, &k);
            assert_eq!(c.get(o), None);
        }
        let _ = std::fs::remove_dir_all(c.dir());
    }

    #[test]
    fn a_damaged_file_is_ignored_and_rewritten() {
        let c = KernelCache::at(scratch("damaged"));
        let k = KernelCache::key("src", &[], "nvrtc 12.9");
        let ptx = ".version 8.8\n.target sm_90\n.entry k() { ret; }\n.entry j() { ret; }";
        c.put(&k, ptx).unwrap();
        let path = c.path(&k);
        let whole = std::fs::read_to_string(&path).unwrap();
        for damaged in [
            whole[..whole.len() / 2].to_string(),               // truncated
            whole.replacen(".entry j", ".entry x", 1),          // edited
            whole.rsplit_once('\n').unwrap().0.to_string(),     // footer lost
            String::new(),                                      // empty
            format!("\n{FOOTER}{}", hex(&Sha256::digest(b""))), // an empty PTX with a valid sum
        ] {
            std::fs::write(&path, &damaged).unwrap();
            assert_eq!(c.get(&k), None, "{damaged:?}");
        }
        c.put(&k, ptx).unwrap();
        assert_eq!(c.get(&k).as_deref(), Some(ptx));
        let _ = std::fs::remove_dir_all(c.dir());
    }

    #[test]
    fn the_folder_keeps_the_newest_compiles_and_always_the_one_just_written() {
        let c = KernelCache::at(scratch("prune"));
        let keys: Vec<String> = (0..KEEP + 3).map(|i| KernelCache::key(&format!("src {i}"), &[], "nvrtc")).collect();
        for (i, k) in keys.iter().enumerate() {
            c.put(k, &format!("ptx {i}")).unwrap();
            // Distinct modification times, oldest first, whatever the file system's resolution.
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            std::fs::File::options().write(true).open(c.path(k)).unwrap().set_modified(t).unwrap();
        }
        let kept: Vec<bool> = keys.iter().map(|k| c.get(k).is_some()).collect();
        let want: Vec<bool> = (0..keys.len()).map(|i| i + KEEP >= keys.len()).collect();
        assert_eq!(kept, want);
        // Rewriting an old compile keeps it, even though its file is the oldest until it is written.
        c.put(&keys[0], "ptx 0").unwrap();
        assert_eq!(c.get(&keys[0]).as_deref(), Some("ptx 0"));
        let _ = std::fs::remove_dir_all(c.dir());
    }

    #[test]
    fn an_unwritable_folder_is_an_error_not_a_panic() {
        let base = scratch("unwritable");
        std::fs::create_dir_all(&base).unwrap();
        let file = base.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let c = KernelCache::at(file.join("kernels")); // a folder under a regular file cannot be made
        assert!(c.put("k", "ptx").is_err());
        assert_eq!(c.get("k"), None);
        let _ = std::fs::remove_dir_all(&base);
    }
}
