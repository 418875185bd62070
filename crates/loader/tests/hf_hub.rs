//! Hub specs, file selection on realistic repo listings, and offline resolution in a fake HF cache
//! (`refs/`, `snapshots/` with symlinks into `blobs/`). The network paths are not reachable here; `pull` is
//! exercised offline and against a closed local port.

use std::path::{Path, PathBuf};
use tf_loader::hub::{
    cache_dir_from, parse_repo_spec, pull, resolve_cached, select_files, HubError, PullOptions, RepoSpec,
};

const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const V1: &str = "89abcdef0123456789abcdef0123456789abcdef";
const GGUF: &str = "fedcba9876543210fedcba9876543210fedcba98";

fn spec(s: &str) -> RepoSpec {
    parse_repo_spec(s).unwrap_or_else(|e| panic!("{e}"))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn repo_specs() {
    let s = spec("Qwen/Qwen2.5-0.5B-Instruct");
    assert_eq!(
        (s.repo.as_str(), s.revision(), &s.file, &s.quant),
        ("Qwen/Qwen2.5-0.5B-Instruct", "main", &None, &None)
    );
    let s = spec("bartowski/Llama-3.2-1B-Instruct-GGUF@v1.0:Llama-3.2-1B-Instruct-Q4_K_M.gguf");
    assert_eq!(s.revision.as_deref(), Some("v1.0"));
    assert_eq!(s.file.as_deref(), Some("Llama-3.2-1B-Instruct-Q4_K_M.gguf"));
    assert_eq!(s.to_string(), "bartowski/Llama-3.2-1B-Instruct-GGUF@v1.0:Llama-3.2-1B-Instruct-Q4_K_M.gguf");
    let s = spec("unsloth/gemma-3-270m-it-GGUF:q4_k_m");
    assert_eq!((s.quant.as_deref(), s.file.as_deref()), (Some("Q4_K_M"), None));
    let s = spec(&format!("org/name@{MAIN}:sub/dir/model.gguf"));
    assert_eq!((s.revision(), s.file.as_deref()), (MAIN, Some("sub/dir/model.gguf")));
    assert_eq!(spec("gpt2").folder_name(), "models--gpt2");
    assert_eq!(spec("org/na.me").folder_name(), "models--org--na.me");
    assert_eq!(spec("org/name@refs/pr/1").revision(), "refs/pr/1");
    for bad in [
        "",
        "/",
        "org/",
        "/name",
        "a/b/c",
        "org/na me",
        "org/..",
        "org/name@",
        "org/name@../x",
        "org/name:",
        "org/name:../x.gguf",
        "org/name:/abs.gguf",
        "org/name:Q4 K",
        "org/name@/abs",
    ] {
        assert!(matches!(parse_repo_spec(bad), Err(HubError::BadSpec { .. })), "{bad:?} accepted");
    }
}

#[test]
fn cache_dir_precedence() {
    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }
    let all = [("HF_HUB_CACHE", "/a"), ("HF_HOME", "/h"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/home/u")];
    assert_eq!(cache_dir_from(env(&all)), Some(PathBuf::from("/a")));
    assert_eq!(cache_dir_from(env(&all[1..])), Some(PathBuf::from("/h/hub")));
    assert_eq!(cache_dir_from(env(&all[2..])), Some(PathBuf::from("/x/huggingface/hub")));
    assert_eq!(cache_dir_from(env(&all[3..])), Some(PathBuf::from("/home/u/.cache/huggingface/hub")));
    assert_eq!(
        cache_dir_from(env(&[("HF_HUB_CACHE", ""), ("HOME", "/r")])),
        Some(PathBuf::from("/r/.cache/huggingface/hub"))
    );
    assert_eq!(cache_dir_from(env(&[])), None);
}

#[test]
fn select_single_file_safetensors_repo() {
    // meta-llama/Llama-3.2-1B-Instruct
    let listing = strings(&[
        ".gitattributes",
        "LICENSE.txt",
        "README.md",
        "USE_POLICY.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "original/consolidated.00.pth",
        "original/params.json",
        "original/tokenizer.model",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]);
    assert_eq!(
        select_files(&listing, None).unwrap(),
        strings(&[
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "model.safetensors",
        ])
    );
    // A quantization request on a repo without GGUF files is an error, not a silent safetensors pick.
    let e = select_files(&listing, Some("Q4_K_M")).unwrap_err();
    assert!(e.to_string().contains("no .gguf files"), "{e}");
}

#[test]
fn select_sharded_safetensors_repo() {
    // mistralai/Mistral-7B-Instruct-v0.3: consolidated weights next to the HF shards.
    let listing = strings(&[
        ".gitattributes",
        "README.md",
        "config.json",
        "consolidated.safetensors",
        "generation_config.json",
        "model-00001-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model.safetensors.index.json",
        "params.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer.model.v3",
        "tokenizer_config.json",
        "chat_template.jinja",
    ]);
    let got = select_files(&listing, None).unwrap();
    assert_eq!(
        got,
        strings(&[
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
            "model.safetensors.index.json",
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
        ])
    );
    let no_config: Vec<String> = listing.iter().filter(|f| *f != "config.json").cloned().collect();
    assert!(select_files(&no_config, None).unwrap_err().to_string().contains("no config.json"));
    let two = strings(&["config.json", "a.safetensors", "b.safetensors"]);
    assert!(select_files(&two, None).unwrap_err().to_string().contains("several .safetensors"));
    assert_eq!(
        select_files(&strings(&["config.json", "w.safetensors"]), None).unwrap(),
        strings(&["config.json", "w.safetensors"])
    );
    assert!(select_files(&strings(&["README.md"]), None).unwrap_err().to_string().contains("no weights"));
}

/// bartowski/Llama-3.2-1B-Instruct-GGUF
fn bartowski() -> Vec<String> {
    let mut l = strings(&[".gitattributes", "README.md", "Llama-3.2-1B-Instruct.imatrix"]);
    for q in [
        "f16", "IQ3_M", "IQ4_XS", "Q3_K_L", "Q3_K_XL", "Q4_0", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "Q4_K_L", "Q4_K_M",
        "Q4_K_S", "Q5_K_L", "Q5_K_M", "Q5_K_S", "Q6_K", "Q6_K_L", "Q8_0",
    ] {
        l.push(format!("Llama-3.2-1B-Instruct-{q}.gguf"));
    }
    l
}

#[test]
fn select_gguf_by_quant() {
    let l = bartowski();
    assert_eq!(select_files(&l, None).unwrap(), strings(&["Llama-3.2-1B-Instruct-Q4_K_M.gguf"]));
    assert_eq!(select_files(&l, Some("q8_0")).unwrap(), strings(&["Llama-3.2-1B-Instruct-Q8_0.gguf"]));
    assert_eq!(select_files(&l, Some("Q4_0")).unwrap(), strings(&["Llama-3.2-1B-Instruct-Q4_0.gguf"]));
    assert_eq!(select_files(&l, Some("F16")).unwrap(), strings(&["Llama-3.2-1B-Instruct-f16.gguf"]));
    assert_eq!(select_files(&l, Some("IQ4_XS")).unwrap(), strings(&["Llama-3.2-1B-Instruct-IQ4_XS.gguf"]));
    let e = select_files(&l, Some("Q4_K")).unwrap_err().to_string();
    assert!(e.contains("no .gguf file with quantization Q4_K") && e.contains("Q4_K_M"), "{e}");
    // Without Q4_K_M the next preference is taken.
    let l2: Vec<String> = l.iter().filter(|f| !f.contains("Q4_K_M")).cloned().collect();
    assert_eq!(select_files(&l2, None).unwrap(), strings(&["Llama-3.2-1B-Instruct-Q4_K_S.gguf"]));
    // IQ4_XS before Q4_0 once the K-quants and Q8_0 are gone; IQ3_M is never picked by preference.
    let l3: Vec<String> =
        l.iter().filter(|f| !f.contains("_K") && !f.contains("Q8_0") && !f.contains("f16")).cloned().collect();
    assert_eq!(select_files(&l3, None).unwrap(), strings(&["Llama-3.2-1B-Instruct-IQ4_XS.gguf"]));
}

#[test]
fn select_split_gguf_and_subdirs() {
    // Qwen/Qwen2.5-7B-Instruct-GGUF: split files, lower-case names.
    let mut l = strings(&["LICENSE", "README.md"]);
    for (q, n) in [("fp16", 4), ("q4_k_m", 2), ("q8_0", 3), ("q2_k", 1)] {
        if n == 1 {
            l.push(format!("qwen2.5-7b-instruct-{q}.gguf"));
        }
        for i in (1..=n).rev().filter(|_| n > 1) {
            l.push(format!("qwen2.5-7b-instruct-{q}-{i:05}-of-{n:05}.gguf"));
        }
    }
    assert_eq!(
        select_files(&l, None).unwrap(),
        strings(&["qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"])
    );
    assert_eq!(select_files(&l, Some("Q8_0")).unwrap().len(), 3);
    let missing_part: Vec<String> = l.iter().filter(|f| !f.contains("q8_0-00002")).cloned().collect();
    assert!(select_files(&missing_part, Some("Q8_0")).unwrap_err().to_string().contains("parts"));
    // unsloth-style: quant subfolders, UD- variants, a vision projector.
    let l = strings(&[
        "gemma-3-4b-it-Q4_K_M.gguf",
        "gemma-3-4b-it-UD-Q4_K_XL.gguf",
        "mmproj-F16.gguf",
        "mmproj-BF16.gguf",
        "BF16/gemma-3-4b-it-BF16-00001-of-00002.gguf",
        "BF16/gemma-3-4b-it-BF16-00002-of-00002.gguf",
    ]);
    assert_eq!(select_files(&l, None).unwrap(), strings(&["gemma-3-4b-it-Q4_K_M.gguf"]));
    assert_eq!(select_files(&l, Some("BF16")).unwrap().len(), 2, "mmproj-BF16 is never chosen");
    assert_eq!(select_files(&l, Some("UD-Q4_K_XL")).unwrap(), strings(&["gemma-3-4b-it-UD-Q4_K_XL.gguf"]));
}

#[test]
fn select_gguf_ambiguity_is_an_error() {
    let l = strings(&["a-Q4_K_M.gguf", "b-Q4_K_M.gguf", "a-Q8_0.gguf"]);
    let e = select_files(&l, None).unwrap_err().to_string();
    assert!(e.contains("a-Q4_K_M.gguf") && e.contains("b-Q4_K_M.gguf") && e.contains(":<file>.gguf"), "{e}");
    assert_eq!(select_files(&l, Some("Q8_0")).unwrap(), strings(&["a-Q8_0.gguf"]));
    let l = strings(&["m-IQ2_XS.gguf", "m-IQ3_M.gguf"]);
    let e = select_files(&l, None).unwrap_err().to_string();
    assert!(e.contains("none in a supported quantization"), "{e}");
    // A single GGUF is taken whatever its type; safetensors win over GGUF unless a quant is asked for.
    assert_eq!(select_files(&strings(&["m-IQ2_XS.gguf"]), None).unwrap(), strings(&["m-IQ2_XS.gguf"]));
    let mixed = strings(&["config.json", "model.safetensors", "model-Q8_0.gguf"]);
    assert_eq!(select_files(&mixed, None).unwrap(), strings(&["config.json", "model.safetensors"]));
    assert_eq!(select_files(&mixed, Some("Q8_0")).unwrap(), strings(&["model-Q8_0.gguf"]));
}

/// Writes `content` as a blob and links `snapshots/<commit>/<name>` to it, as `huggingface_hub` does.
fn add_file(repo: &Path, commit: &str, name: &str, content: &[u8]) {
    // Blobs are named by content hash in a real cache; FNV-1a of commit and name keeps them distinct here.
    let hash = format!("{commit}/{name}")
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let blob_name = format!("{hash:016x}");
    let blob = repo.join("blobs").join(&blob_name);
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, content).unwrap();
    let link = repo.join("snapshots").join(commit).join(name);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    let depth = name.matches('/').count() + 2;
    let target = format!("{}blobs/{blob_name}", "../".repeat(depth));
    std::os::unix::fs::symlink(target, &link).unwrap();
    assert_eq!(std::fs::read(&link).unwrap(), content, "symlink {name}");
}

fn set_ref(repo: &Path, name: &str, commit: &str) {
    let p = repo.join("refs").join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, format!("{commit}\n")).unwrap();
}

/// A cache with a sharded safetensors repo (main and v1.0) and a GGUF repo.
fn fake_cache() -> tempfile::TempDir {
    let cache = tempfile::tempdir().unwrap();
    let st = cache.path().join("models--Org--Model");
    let index = r#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    for f in ["config.json", "tokenizer.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        add_file(&st, MAIN, f, f.as_bytes());
    }
    add_file(&st, MAIN, "model.safetensors.index.json", index.as_bytes());
    set_ref(&st, "main", MAIN);
    for f in ["config.json", "model.safetensors"] {
        add_file(&st, V1, f, format!("v1 {f}").as_bytes());
    }
    set_ref(&st, "v1.0", V1);
    let gg = cache.path().join("models--Org--Model-GGUF");
    for f in ["model-Q4_K_M.gguf", "model-Q8_0.gguf", "README.md"] {
        add_file(&gg, GGUF, f, f.as_bytes());
    }
    set_ref(&gg, "main", GGUF);
    cache
}

fn not_cached(r: Result<PathBuf, HubError>) -> String {
    match r {
        Err(e @ HubError::NotCached { .. }) => {
            let s = e.to_string();
            assert!(s.contains("tensorfold pull"), "{s}");
            s
        }
        other => panic!("expected NotCached, got {other:?}"),
    }
}

#[test]
fn resolve_revisions_and_hashes() {
    let cache = fake_cache();
    let c = cache.path();
    let snap = |repo: &str, commit: &str| c.join(repo).join("snapshots").join(commit);
    assert_eq!(resolve_cached(&spec("Org/Model"), c).unwrap(), snap("models--Org--Model", MAIN));
    assert_eq!(resolve_cached(&spec("Org/Model@main"), c).unwrap(), snap("models--Org--Model", MAIN));
    assert_eq!(resolve_cached(&spec("Org/Model@v1.0"), c).unwrap(), snap("models--Org--Model", V1));
    // A commit hash without a ref file names the snapshot directly.
    assert_eq!(resolve_cached(&spec(&format!("Org/Model@{V1}")), c).unwrap(), snap("models--Org--Model", V1));
    let f = resolve_cached(&spec("Org/Model:tokenizer.json"), c).unwrap();
    assert_eq!(std::fs::read(f).unwrap(), b"tokenizer.json");
    // GGUF repos resolve to the chosen file.
    let g = resolve_cached(&spec("Org/Model-GGUF"), c).unwrap();
    assert_eq!(g, snap("models--Org--Model-GGUF", GGUF).join("model-Q4_K_M.gguf"));
    let g = resolve_cached(&spec("Org/Model-GGUF:Q8_0"), c).unwrap();
    assert!(g.ends_with("model-Q8_0.gguf"));
    let g = resolve_cached(&spec("Org/Model-GGUF:model-Q8_0.gguf"), c).unwrap();
    assert_eq!(std::fs::read(g).unwrap(), b"model-Q8_0.gguf");
}

#[test]
fn resolve_reports_what_is_missing() {
    let cache = fake_cache();
    let c = cache.path();
    let e = not_cached(resolve_cached(&spec("Org/Other"), c));
    assert!(e.contains("models--Org--Other"), "{e}");
    let e = not_cached(resolve_cached(&spec("Org/Model@v2"), c));
    assert!(e.contains("'v2'") && e.contains("main") && e.contains("v1.0"), "{e}");
    let e = not_cached(resolve_cached(&spec(&format!("Org/Model@{GGUF}")), c));
    assert!(e.contains("not cached"), "{e}");
    let e = not_cached(resolve_cached(&spec("Org/Model:nope.gguf"), c));
    assert!(e.contains("lacks nope.gguf"), "{e}");
    let e = not_cached(resolve_cached(&spec("Org/Model-GGUF:Q6_K"), c));
    assert!(e.contains("Q6_K") && e.contains("model-Q8_0.gguf"), "{e}");

    // A snapshot link whose blob was deleted.
    let repo = c.join("models--Org--Model");
    let shard2 = repo.join("snapshots").join(MAIN).join("model-00002-of-00002.safetensors");
    let blob = std::fs::read_link(&shard2).unwrap();
    std::fs::remove_file(shard2.parent().unwrap().join(&blob)).unwrap();
    let e = not_cached(resolve_cached(&spec("Org/Model"), c));
    assert!(e.contains("model-00002-of-00002.safetensors (its blob is missing)"), "{e}");
    // A shard the index names but the snapshot lacks entirely.
    std::fs::remove_file(&shard2).unwrap();
    let e = not_cached(resolve_cached(&spec("Org/Model"), c));
    assert!(e.contains("lacks model-00002-of-00002.safetensors"), "{e}");
    // A ref pointing to a snapshot that is gone.
    set_ref(&repo, "main", GGUF);
    let e = not_cached(resolve_cached(&spec("Org/Model"), c));
    assert!(e.contains("snapshot is missing"), "{e}");
    // A ref that is not a commit hash.
    set_ref(&repo, "main", "garbage");
    assert!(matches!(resolve_cached(&spec("Org/Model"), c), Err(HubError::Io { .. })));
}

#[test]
fn pull_offline_uses_the_cache() {
    let cache = fake_cache();
    let opts = PullOptions { cache_dir: Some(cache.path().to_path_buf()), offline: true, ..Default::default() };
    assert_eq!(
        pull(&spec("Org/Model@v1.0"), &opts).unwrap(),
        cache.path().join("models--Org--Model/snapshots").join(V1)
    );
    not_cached(pull(&spec("Org/Absent"), &opts));
}

#[test]
fn pull_with_unreachable_hub_falls_back_or_explains() {
    if std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1") {
        println!("HF_HUB_OFFLINE=1 in the environment: skipping the network-path test");
        return;
    }
    let cache = fake_cache();
    // Port 1 on localhost: connection refused at once, through hf-hub's real HTTP path.
    let opts = PullOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        endpoint: Some("http://127.0.0.1:1".into()),
        token: Some("hf_test".into()),
        ..Default::default()
    };
    // A complete cached copy is returned when the hub cannot be reached.
    assert_eq!(pull(&spec("Org/Model"), &opts).unwrap(), cache.path().join("models--Org--Model/snapshots").join(MAIN));
    match pull(&spec("Org/Absent"), &opts) {
        Err(e @ HubError::Network { .. }) => {
            let s = e.to_string();
            assert!(
                s.contains("cannot list the repo") && s.contains("HF_HUB_OFFLINE") && s.contains("tensorfold pull"),
                "{s}"
            );
        }
        other => panic!("expected a network error, got {other:?}"),
    }
}
