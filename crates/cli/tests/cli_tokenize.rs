//! `tensorfold tokenize` as a user runs it: ids equal llama.cpp's on the same GGUF (fixtures/tokenizer), with
//! the model's BOS/EOS by default and without them under `--no-special`.

use std::process::Command;

fn tokenize(args: &[&str]) -> Vec<u64> {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold")).arg("tokenize").args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON list of ids")
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn tokenize_matches_llama_cpp_on_every_model() {
    for (short, _) in tf_testkit::MODELS {
        let path = tf_testkit::model_path(short);
        let path = path.to_str().unwrap();
        let fx = tf_testkit::fixture(&format!("tokenizer/{short}.json"));
        // A handful of cases through the CLI (the library test covers all of them).
        for case in
            fx["cases"].as_array().unwrap().iter().filter(|c| !c["text"].as_str().unwrap().is_empty()).step_by(20)
        {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tokenize(&[path, text]), ids(&case["llama_cpp_add_special"]), "{short}: {text:?}");
            assert_eq!(tokenize(&["--no-special", path, text]), ids(&case["llama_cpp"]), "{short}: {text:?}");
        }
    }
}

#[test]
fn tokenize_on_a_corrupt_file_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.gguf");
    std::fs::write(&p, b"GGUF\x03\0\0\0garbage").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_tensorfold")).args(["tokenize", p.to_str().unwrap(), "hi"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad.gguf"), "{err}");
}
