//! What a MODEL argument names: a GGUF file, a Hugging Face-style directory, or a hub id found in the local
//! Hugging Face cache.

use std::path::{Path, PathBuf};

/// A resolved MODEL argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelRef {
    /// A single GGUF file.
    Gguf(PathBuf),
    /// A directory with `config.json` and safetensors weights (and usually `tokenizer.json`).
    HfDir(PathBuf),
}

impl ModelRef {
    pub fn path(&self) -> &Path {
        match self {
            ModelRef::Gguf(p) | ModelRef::HfDir(p) => p,
        }
    }
}

fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
        && &magic == b"GGUF"
}

/// Classifies an existing path.
pub fn classify_path(path: &Path) -> Result<ModelRef, String> {
    if path.is_file() {
        if is_gguf(path) {
            return Ok(ModelRef::Gguf(path.to_owned()));
        }
        if path.extension().is_some_and(|e| e == "gguf") {
            return Err(format!("{}: not a GGUF file (its first bytes are not \"GGUF\")", path.display()));
        }
        return Err(format!(
            "{}: not a model: expected a .gguf file or a directory with config.json and *.safetensors",
            path.display()
        ));
    }
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ModelRef::HfDir(path.to_owned()));
        }
        let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: cannot read directory: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "gguf") && p.is_file())
            .collect();
        return match ggufs.as_slice() {
            [one] => classify_path(one),
            [] => Err(format!("{}: directory has neither config.json nor a .gguf file", path.display())),
            many => Err(format!(
                "{}: directory holds {} .gguf files; name one of them: {}",
                path.display(),
                many.len(),
                many.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
            )),
        };
    }
    Err(format!("{}: no such file or directory", path.display()))
}

/// Resolves MODEL: an existing path first; otherwise a hub id (`org/name[@revision][:file]`) looked up in the
/// local Hugging Face cache (never the network: `tensorfold pull` downloads).
pub fn resolve(spec: &str) -> Result<ModelRef, String> {
    let path = Path::new(spec);
    if path.exists() {
        return classify_path(path);
    }
    let looks_like_hub_id = !spec.starts_with(['.', '/', '~'])
        && spec.split(['@', ':']).next().is_some_and(|s| {
            let parts: Vec<_> = s.split('/').collect();
            parts.len() == 2 && parts.iter().all(|p| !p.is_empty())
        });
    if !looks_like_hub_id {
        return Err(format!("{spec}: no such file or directory"));
    }
    let repo = tf_loader::hub::parse_repo_spec(spec).map_err(|e| e.to_string())?;
    let cache = tf_loader::hub::default_cache_dir()
        .ok_or_else(|| format!("{spec}: no such file, and no Hugging Face cache directory (set HF_HUB_CACHE)"))?;
    let found = tf_loader::hub::resolve_cached(&repo, &cache).map_err(|e| e.to_string())?;
    classify_path(&found)
}
