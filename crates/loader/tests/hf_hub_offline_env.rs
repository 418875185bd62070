//! `HF_HUB_OFFLINE=1` keeps `pull` off the network. Alone in its test binary because it sets the variable.

use tf_loader::hub::{parse_repo_spec, pull, HubError, PullOptions};

#[test]
fn hf_hub_offline_env_means_cache_only() {
    let cache = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.path().join("models--Org--Model-GGUF");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("m-Q4_0.gguf"), b"GGUF").unwrap();

    std::env::set_var("HF_HUB_OFFLINE", "1");
    // An endpoint that would fail if it were contacted: offline, the answer comes from the cache alone.
    let opts = PullOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        endpoint: Some("http://127.0.0.1:1".into()),
        ..Default::default()
    };
    let got = pull(&parse_repo_spec("Org/Model-GGUF").unwrap(), &opts).unwrap();
    assert_eq!(got, snap.join("m-Q4_0.gguf"));
    match pull(&parse_repo_spec("Org/Absent").unwrap(), &opts) {
        Err(HubError::NotCached { .. }) => {}
        other => panic!("offline pull of an uncached repo must be NotCached, got {other:?}"),
    }
}
