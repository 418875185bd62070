//! Models from the Hugging Face hub: repo specs, choosing which files to fetch, resolving repos in the standard
//! local HF cache without the network, and downloading through `hf-hub`.
//!
//! Cache layout (shared with the Python `huggingface_hub`):
//! ```text
//! <cache>/models--{org}--{name}/refs/{revision}          a file holding a commit hash
//! <cache>/models--{org}--{name}/snapshots/{commit}/...    the repo's files (symlinks into blobs/)
//! <cache>/models--{org}--{name}/blobs/{etag}              file contents
//! ```
//! The cache directory is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
//! `~/.cache/huggingface/hub`.

use std::fmt;
use std::path::{Component, Path, PathBuf};

/// Files fetched next to safetensors weights when the repo has them.
pub const METADATA_FILES: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// GGUF quantizations in the order we pick them when the user names none. Only types the engine runs are
/// listed (of the i-quants, IQ4_XS and IQ4_NL only), best quality per byte first.
pub const QUANT_PREFERENCE: [&str; 19] = [
    "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "IQ4_XS", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1",
    "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "BF16", "F16", "F32",
];

/// A hub model reference: `org/name[@revision][:file.gguf | :QUANT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    /// The repo id, `org/name` (or a legacy single-segment id).
    pub repo: String,
    /// Branch, tag or commit hash; `None` means `main`.
    pub revision: Option<String>,
    /// One file inside the repo (`:model-Q4_K_M.gguf`).
    pub file: Option<String>,
    /// A GGUF quantization to pick (`:Q4_K_M`), upper-cased.
    pub quant: Option<String>,
}

impl RepoSpec {
    /// The revision, defaulting to `main`.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The cache folder name, `models--org--name`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

impl fmt::Display for RepoSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(r) = &self.revision {
            write!(f, "@{r}")?;
        }
        if let Some(x) = self.file.as_ref().or(self.quant.as_ref()) {
            write!(f, ":{x}")?;
        }
        Ok(())
    }
}

/// Errors from spec parsing, file selection, cache resolution and downloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HubError {
    /// The spec string is malformed.
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        problem: String,
    },
    /// The repo's files do not determine what to load (ambiguous or missing weights).
    Selection {
        /// The repo (or listing) concerned.
        repo: String,
        /// What is wrong, listing the candidates.
        problem: String,
    },
    /// The model (or part of it) is not in the local cache.
    NotCached {
        /// The spec being resolved.
        spec: String,
        /// What is missing; ends with a `tensorfold pull` suggestion.
        problem: String,
    },
    /// Talking to the hub failed.
    Network {
        /// The spec being pulled.
        spec: String,
        /// The error, with hints.
        problem: String,
    },
    /// A local file operation failed.
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The error.
        problem: String,
    },
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubError::BadSpec { spec, problem } => write!(f, "bad model spec '{spec}': {problem}"),
            HubError::Selection { repo, problem } => write!(f, "{repo}: {problem}"),
            HubError::NotCached { spec, problem } => write!(f, "{spec}: {problem}"),
            HubError::Network { spec, problem } => write!(f, "{spec}: {problem}"),
            HubError::Io { path, problem } => write!(f, "{}: {problem}", path.display()),
        }
    }
}

impl std::error::Error for HubError {}

fn valid_id_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s != "."
        && s != ".."
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A relative path with only normal components (no `..`, no root).
fn is_plain_relative(s: &str) -> bool {
    !s.is_empty() && Path::new(s).components().all(|c| matches!(c, Component::Normal(_)))
}

/// Parses `org/name[@revision][:file.gguf | :QUANT]`. The part after `:` is a file when it ends in `.gguf` or
/// contains `/` or `.`, else a quantization name such as `Q4_K_M` (case-insensitive).
pub fn parse_repo_spec(s: &str) -> Result<RepoSpec, HubError> {
    let bad = |p: &str| HubError::BadSpec { spec: s.to_owned(), problem: p.to_owned() };
    let (left, sel) = match s.split_once(':') {
        Some((l, r)) => (l, Some(r)),
        None => (s, None),
    };
    let (repo, revision) = match left.split_once('@') {
        Some((r, rev)) => (r, Some(rev)),
        None => (left, None),
    };
    let segs: Vec<&str> = repo.split('/').collect();
    if segs.len() > 2 || !segs.iter().all(|x| valid_id_segment(x)) {
        return Err(bad("expected a repo id 'org/name' of letters, digits, '-', '_' and '.'"));
    }
    if let Some(rev) = revision {
        let ok = is_plain_relative(rev)
            && rev.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !ok {
            return Err(bad("revision must be a branch, tag or commit hash (letters, digits, '-', '_', '.', '/')"));
        }
    }
    let (mut file, mut quant) = (None, None);
    if let Some(sel) = sel {
        if sel.is_empty() {
            return Err(bad("nothing after ':' (expected a file name or a quantization such as Q4_K_M)"));
        }
        if sel.contains(['/', '.']) {
            if !is_plain_relative(sel) || sel.contains(':') {
                return Err(bad("file must be a relative path inside the repo"));
            }
            file = Some(sel.to_owned());
        } else if sel.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            quant = Some(sel.to_ascii_uppercase());
        } else {
            return Err(bad("expected a file name or a quantization such as Q4_K_M after ':'"));
        }
    }
    Ok(RepoSpec { repo: repo.to_owned(), revision: revision.map(str::to_owned), file, quant })
}

/// The default HF hub cache directory, from the environment.
pub fn default_cache_dir() -> Option<PathBuf> {
    cache_dir_from(|k| std::env::var(k).ok())
}

/// The HF hub cache directory given an environment lookup (for tests): `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
/// `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, `HOME/.cache/huggingface/hub` (`USERPROFILE` on Windows).
pub fn cache_dir_from(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| {
            var("HOME").or_else(|| var("USERPROFILE")).map(|h| h.join(".cache").join("huggingface").join("hub"))
        })
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// For a split GGUF part `...-00001-of-00003.gguf`: (stem without the part suffix, part, count).
fn split_part(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf").or_else(|| path.strip_suffix(".GGUF"))?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (head, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(part) || !digits(of) {
        return None;
    }
    Some((head, part.parse().ok()?, of.parse().ok()?))
}

/// Whether `name` (any case) contains `quant` as a whole token: not preceded by a letter, digit or `_`, and
/// followed by the end or one of `-`, `.`, `/`.
fn has_quant(name: &str, quant: &str) -> bool {
    let n = name.to_ascii_uppercase();
    let q = quant.to_ascii_uppercase();
    let bytes = n.as_bytes();
    let mut from = 0;
    while let Some(i) = n[from..].find(&q) {
        let at = from + i;
        let end = at + q.len();
        let before_ok = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let after_ok = end == n.len() || matches!(bytes[end], b'-' | b'.' | b'/');
        if before_ok && after_ok {
            return true;
        }
        from = at + 1;
    }
    false
}

/// A GGUF model in a listing: one file or the parts of a split file, in order.
#[derive(Debug)]
struct GgufGroup {
    /// Display name: the file, or the common stem of the parts.
    name: String,
    /// The files, parts in order.
    files: Vec<String>,
}

fn gguf_groups(listing: &[String]) -> Vec<GgufGroup> {
    let mut groups: Vec<GgufGroup> = Vec::new();
    for f in listing {
        if !f.to_ascii_lowercase().ends_with(".gguf") || base_name(f).to_ascii_lowercase().starts_with("mmproj") {
            continue;
        }
        match split_part(f) {
            Some((stem, _, _)) => match groups.iter_mut().find(|g| g.name == stem) {
                Some(g) => g.files.push(f.clone()),
                None => groups.push(GgufGroup { name: stem.to_owned(), files: vec![f.clone()] }),
            },
            None => groups.push(GgufGroup { name: f.clone(), files: vec![f.clone()] }),
        }
    }
    for g in &mut groups {
        g.files.sort();
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    groups
}

fn pick_gguf(repo: &str, listing: &[String], quant: Option<&str>) -> Result<Vec<String>, HubError> {
    let sel = |p: String| HubError::Selection { repo: repo.to_owned(), problem: p };
    let groups = gguf_groups(listing);
    let names = || groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ");
    if groups.is_empty() {
        return Err(sel("no .gguf files in the repo".to_owned()));
    }
    let check_parts = |g: &GgufGroup| -> Result<Vec<String>, HubError> {
        if let Some((_, _, of)) = split_part(&g.files[0]) {
            let parts: Vec<u32> = g.files.iter().filter_map(|f| split_part(f)).map(|p| p.1).collect();
            if parts != (1..=of).collect::<Vec<_>>() {
                return Err(sel(format!("split GGUF '{}' lists parts {parts:?} of {of}", g.name)));
            }
        }
        Ok(g.files.clone())
    };
    let matching = |q: &str| groups.iter().filter(|g| has_quant(&g.name, q)).collect::<Vec<_>>();
    if let Some(q) = quant {
        return match matching(q).as_slice() {
            [g] => check_parts(g),
            [] => Err(sel(format!("no .gguf file with quantization {q}; available: {}", names()))),
            many => Err(sel(format!(
                "quantization {q} matches several files ({}); name one with ':<file>.gguf'",
                many.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    if let [g] = groups.as_slice() {
        return check_parts(g);
    }
    for q in QUANT_PREFERENCE {
        match matching(q).as_slice() {
            [] => continue,
            [g] => return check_parts(g),
            many => {
                return Err(sel(format!(
                    "several .gguf files have quantization {q} ({}); name one with ':<file>.gguf'",
                    many.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
                )))
            }
        }
    }
    Err(sel(format!(
        "several .gguf files and none in a supported quantization ({}); name one with ':<file>.gguf'",
        names()
    )))
}

/// Chooses the files to download from a repo listing (paths relative to the repo root).
///
/// With `wanted_quant`, or when the repo has no top-level safetensors weights, picks one GGUF model (all parts
/// of a split one): the wanted quantization, else the only GGUF, else the first of [`QUANT_PREFERENCE`] present;
/// several files matching the chosen quantization is an error naming them. `mmproj*` files are never chosen.
///
/// Otherwise picks the safetensors checkpoint: `model.safetensors.index.json` plus the top-level `model*`
/// shards, or `model.safetensors`, or the only top-level `.safetensors` file; plus whichever of
/// [`METADATA_FILES`] exist. `config.json` is required.
pub fn select_files(listing: &[String], wanted_quant: Option<&str>) -> Result<Vec<String>, HubError> {
    select_files_for("repo", listing, wanted_quant)
}

fn select_files_for(repo: &str, listing: &[String], wanted_quant: Option<&str>) -> Result<Vec<String>, HubError> {
    let sel = |p: String| HubError::Selection { repo: repo.to_owned(), problem: p };
    let has = |f: &str| listing.iter().any(|x| x == f);
    let top_st: Vec<&String> = listing.iter().filter(|f| !f.contains('/') && f.ends_with(".safetensors")).collect();
    if wanted_quant.is_some() || top_st.is_empty() {
        if top_st.is_empty() && !listing.iter().any(|f| f.to_ascii_lowercase().ends_with(".gguf")) {
            return Err(sel(format!(
                "no weights found: no top-level .safetensors and no .gguf files among {} files",
                listing.len()
            )));
        }
        return pick_gguf(repo, listing, wanted_quant);
    }
    let mut weights: Vec<String> = if has(crate::safetensors::INDEX_FILE) {
        let mut shards: Vec<String> = top_st
            .iter()
            .filter(|f| f.starts_with("model") && f.as_str() != "model.safetensors")
            .map(|f| (*f).clone())
            .collect();
        if shards.is_empty() {
            return Err(sel(format!("{} present but no model*.safetensors shards", crate::safetensors::INDEX_FILE)));
        }
        shards.sort();
        shards.insert(0, crate::safetensors::INDEX_FILE.to_owned());
        shards
    } else if has(crate::safetensors::SINGLE_FILE) {
        vec![crate::safetensors::SINGLE_FILE.to_owned()]
    } else if let [one] = top_st.as_slice() {
        vec![(*one).clone()]
    } else {
        let names: Vec<&str> = top_st.iter().map(|s| s.as_str()).collect();
        return Err(sel(format!(
            "several .safetensors files ({}) and no {}",
            names.join(", "),
            crate::safetensors::INDEX_FILE
        )));
    };
    if !has("config.json") {
        return Err(sel("safetensors weights but no config.json".to_owned()));
    }
    let mut out: Vec<String> = METADATA_FILES.iter().filter(|f| has(f)).map(|f| (*f).to_owned()).collect();
    out.append(&mut weights);
    Ok(out)
}

/// Files in `dir`, recursively, as `/`-separated relative paths (symlinks listed whether or not they resolve).
fn list_files(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>, depth: u32) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir && depth < 8 {
                walk(base, &p, out, depth + 1);
            } else if !is_dir {
                if let Ok(rel) = p.strip_prefix(base) {
                    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into()).collect();
                    out.push(parts.join("/"));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out, 0);
    out.sort();
    out
}

fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Resolves `spec` in the local cache at `cache_dir` without the network.
///
/// The revision (default `main`) is looked up in `refs/`; a 40-hex commit hash with a snapshot is taken
/// directly. Returns the file for `:file` specs and for GGUF repos (the first part of a split GGUF), else the
/// snapshot directory after checking that every selected file (and every shard the index names) is present.
pub fn resolve_cached(spec: &RepoSpec, cache_dir: &Path) -> Result<PathBuf, HubError> {
    let not_cached = |p: String| HubError::NotCached {
        spec: spec.to_string(),
        problem: format!("{p}; run `tensorfold pull {spec}` to download it"),
    };
    let repo_dir = cache_dir.join(spec.folder_name());
    if !repo_dir.is_dir() {
        return Err(not_cached(format!("not in the Hugging Face cache ({} does not exist)", repo_dir.display())));
    }
    let rev = spec.revision();
    let ref_path = repo_dir.join("refs").join(rev);
    let commit = match std::fs::read_to_string(&ref_path) {
        Ok(c) => {
            let c = c.trim().to_owned();
            if !is_commit_hash(&c) {
                return Err(HubError::Io {
                    path: ref_path,
                    problem: format!(
                        "ref does not hold a commit hash (found {:?})",
                        c.chars().take(64).collect::<String>()
                    ),
                });
            }
            c
        }
        Err(_) if is_commit_hash(rev) && repo_dir.join("snapshots").join(rev).is_dir() => rev.to_owned(),
        Err(_) => {
            let mut refs = list_files(&repo_dir.join("refs"));
            refs.retain(|r| !r.is_empty());
            let have = if refs.is_empty() { "none".to_owned() } else { refs.join(", ") };
            return Err(not_cached(format!("revision '{rev}' is not cached (cached refs: {have})")));
        }
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.is_dir() {
        return Err(not_cached(format!("ref '{rev}' points to commit {commit}, whose snapshot is missing")));
    }
    let missing = |files: &[String]| -> Vec<String> {
        files
            .iter()
            .filter(|f| !snap.join(f).is_file())
            .map(|f| {
                let p = snap.join(f);
                if p.symlink_metadata().is_ok() {
                    format!("{f} (its blob is missing)")
                } else {
                    f.clone()
                }
            })
            .collect()
    };
    if let Some(file) = &spec.file {
        let m = missing(std::slice::from_ref(file));
        if !m.is_empty() {
            return Err(not_cached(format!("snapshot {commit} lacks {}", m.join(", "))));
        }
        return Ok(snap.join(file));
    }
    let listing = list_files(&snap);
    let chosen = select_files_for(&spec.to_string(), &listing, spec.quant.as_deref()).map_err(|e| match e {
        HubError::Selection { problem, .. } => not_cached(format!("cached snapshot {commit}: {problem}")),
        other => other,
    })?;
    let mut m = missing(&chosen);
    if chosen.iter().any(|f| f == crate::safetensors::INDEX_FILE) && m.is_empty() {
        m = missing(&index_shards(&snap.join(crate::safetensors::INDEX_FILE))?);
    }
    if !m.is_empty() {
        return Err(not_cached(format!("snapshot {commit} lacks {}", m.join(", "))));
    }
    if chosen[0].to_ascii_lowercase().ends_with(".gguf") {
        return Ok(snap.join(&chosen[0]));
    }
    Ok(snap)
}

/// The distinct shard files named by a safetensors index, sorted.
fn index_shards(index: &Path) -> Result<Vec<String>, HubError> {
    let io = |p: String| HubError::Io { path: index.to_path_buf(), problem: p };
    let text = std::fs::read(index).map_err(|e| io(format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| io(format!("invalid JSON: {e}")))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| io("no \"weight_map\" object".into()))?;
    let mut shards: Vec<String> = Vec::new();
    for s in map.values() {
        let s = s.as_str().filter(|s| is_plain_relative(s)).ok_or_else(|| io(format!("bad shard name {s}")))?;
        if !shards.iter().any(|x| x == s) {
            shards.push(s.to_owned());
        }
    }
    shards.sort();
    Ok(shards)
}

/// Options for [`pull`].
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Cache directory; `None` uses [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Access token; `None` uses `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, then the token file.
    pub token: Option<String>,
    /// Never touch the network (as does `HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Show download progress bars on stderr.
    pub progress: bool,
    /// Hub endpoint; `None` uses `HF_ENDPOINT`, else `https://huggingface.co`.
    pub endpoint: Option<String>,
}

/// Whether an environment value means "on" (`1`, `true`, `yes`, `on`).
fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// The access token: `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, the file at `HF_TOKEN_PATH`, else `token` next to
/// the hub cache (`$HF_HOME/token`).
fn env_token(cache_dir: &Path) -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")).or_else(|| {
        let path = match var("HF_TOKEN_PATH") {
            Some(p) => PathBuf::from(p),
            None => match var("HF_HOME") {
                Some(h) => PathBuf::from(h).join("token"),
                None => cache_dir.parent()?.join("token"),
            },
        };
        let t = std::fs::read_to_string(path).ok()?;
        Some(t.trim().to_owned()).filter(|t| !t.is_empty())
    })
}

/// Makes `spec` available locally and returns what [`resolve_cached`] would: downloads the selected files of
/// the revision's current commit into the HF cache through `hf-hub`, skipping files already present, and
/// points `refs/{revision}` at that commit.
///
/// With `options.offline` or `HF_HUB_OFFLINE=1` the network is not touched: this is [`resolve_cached`]. When
/// the hub cannot be reached but the cache holds a complete copy, that copy is returned (like
/// `huggingface_hub`); otherwise the error carries both the network error and what the cache lacks.
pub fn pull(spec: &RepoSpec, options: &PullOptions) -> Result<PathBuf, HubError> {
    let cache_dir = match options.cache_dir.clone().or_else(default_cache_dir) {
        Some(d) => d,
        None => {
            return Err(HubError::Io {
                path: PathBuf::new(),
                problem: "no Hugging Face cache directory: set HF_HUB_CACHE or HF_HOME".to_owned(),
            })
        }
    };
    if options.offline || truthy(std::env::var("HF_HUB_OFFLINE").ok()) {
        return resolve_cached(spec, &cache_dir);
    }
    match pull_online(spec, options, &cache_dir) {
        Ok(p) => Ok(p),
        Err(HubError::Network { spec: s, problem }) => match resolve_cached(spec, &cache_dir) {
            Ok(p) => Ok(p),
            Err(cached) => Err(HubError::Network {
                spec: s,
                problem: format!(
                    "{problem}. Check the network, set HF_TOKEN for gated repos, or use HF_HUB_OFFLINE=1 with a \
                     cached copy; the cache has no complete copy either ({cached})"
                ),
            }),
        },
        Err(e) => Err(e),
    }
}

fn pull_online(spec: &RepoSpec, options: &PullOptions, cache_dir: &Path) -> Result<PathBuf, HubError> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};

    let net = |what: &str, e: hf_hub::api::sync::ApiError| HubError::Network {
        spec: spec.to_string(),
        problem: format!("{what}: {e}"),
    };
    let io = |path: &Path, e: std::io::Error| HubError::Io { path: path.to_path_buf(), problem: e.to_string() };
    std::fs::create_dir_all(cache_dir).map_err(|e| io(cache_dir, e))?;
    let mut builder = ApiBuilder::from_cache(Cache::new(cache_dir.to_path_buf()))
        .with_progress(options.progress)
        .with_token(options.token.clone().or_else(|| env_token(cache_dir)))
        .with_retries(3);
    if let Some(ep) = options.endpoint.clone().or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty())) {
        builder = builder.with_endpoint(ep.trim_end_matches('/').to_owned());
    }
    let api = builder.build().map_err(|e| net("cannot set up the HTTP client", e))?;
    let rev = spec.revision().to_owned();
    let info = api
        .repo(Repo::with_revision(spec.repo.clone(), RepoType::Model, rev.clone()))
        .info()
        .map_err(|e| net(&format!("cannot list the repo at revision '{rev}'"), e))?;
    if !is_commit_hash(&info.sha) {
        return Err(HubError::Network {
            spec: spec.to_string(),
            problem: format!("the hub answered with a malformed commit hash {:?}", info.sha),
        });
    }
    let listing: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
    let mut files = match &spec.file {
        Some(f) if listing.contains(f) => vec![f.clone()],
        Some(f) => {
            return Err(HubError::Selection { repo: spec.to_string(), problem: format!("the repo has no file '{f}'") })
        }
        None => select_files_for(&spec.to_string(), &listing, spec.quant.as_deref())?,
    };
    // Pin every download to the listed commit so the files agree even if the branch moves meanwhile.
    let at_commit = api.repo(Repo::with_revision(spec.repo.clone(), RepoType::Model, info.sha.clone()));
    let snap = cache_dir.join(spec.folder_name()).join("snapshots").join(&info.sha);
    let mut i = 0;
    while i < files.len() {
        let f = files[i].clone();
        if !snap.join(&f).is_file() {
            at_commit.download(&f).map_err(|e| net(&format!("downloading {f}"), e))?;
        }
        if f == crate::safetensors::INDEX_FILE {
            // The index names the shards exactly; fetch any the listing heuristic missed.
            for s in index_shards(&snap.join(&f))? {
                if !files.contains(&s) {
                    files.push(s);
                }
            }
        }
        i += 1;
    }
    let refs = cache_dir.join(spec.folder_name()).join("refs");
    let cache = Cache::new(cache_dir.to_path_buf());
    cache
        .repo(Repo::with_revision(spec.repo.clone(), RepoType::Model, rev.clone()))
        .create_ref(&info.sha)
        .map_err(|e| io(&refs, e))?;
    if rev != info.sha {
        // hf-hub records the pinned commit as a ref named after itself; `huggingface_hub` keeps no such refs.
        let _ = std::fs::remove_file(refs.join(&info.sha));
    }
    resolve_cached(spec, cache_dir)
}
