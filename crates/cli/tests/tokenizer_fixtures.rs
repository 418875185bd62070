//! The GGUF tokenizers against llama.cpp (fixtures/tokenizer/<model>.json, made by llama-cpp-python):
//! ids with and without BOS/EOS, detokenization, special ids and end-of-generation ids, for every
//! fixture string of every model; plus round trips and streaming detokenization on the same strings.
//! A missing model file fails the test (run `scripts/fetch-models.sh all`).

use serde_json::Value;
use tf_cli::gguf_text::tokenizer_from_gguf;
use tf_loader::gguf::GgufFile;
use tf_testkit::{fixture, model_path, MODELS};
use tf_text::{IncrementalDetokenizer, Tokenizer};

fn load(short: &str) -> Tokenizer {
    let path = model_path(short);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tokenizer_from_gguf(file.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn opt_id(v: &Value) -> Option<u32> {
    v.as_i64().filter(|&i| i >= 0).map(|i| i as u32)
}

fn show(s: &str) -> String {
    let mut t: String = s.chars().take(60).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    format!("{t:?}")
}

fn check_model(short: &str) {
    let tok = load(short);
    let fx = fixture(&format!("tokenizer/{short}.json"));
    let vocab = &fx["llama_cpp_vocab"];
    let sp = &vocab["special_ids"];
    let mut errors = Vec::new();

    assert_eq!(tok.vocab_size() as u64, vocab["n_tokens"].as_u64().unwrap(), "{short}: vocabulary size");
    assert_eq!(tok.bos_id(), opt_id(&sp["bos"]), "{short}: BOS id");
    assert_eq!(tok.eos_id(), opt_id(&sp["eos"]), "{short}: EOS id");
    // llama.cpp takes the first end-of-turn-looking token in hash-map order when the file names none
    // (smollm2: `<|endoftext|>`; qwen: `<|im_end|>`); we take `<|im_end|>`-style ones first. Both are
    // end-of-generation ids, which is what decides stopping.
    let eot = tok.eot_id();
    assert!(eot.is_some() == opt_id(&sp["eot"]).is_some(), "{short}: EOT present");
    assert!(eot.iter().all(|&e| tok.is_stop(e)), "{short}: EOT is a stop id");
    assert_eq!(tok.add_bos(), vocab["add_bos"].as_bool().unwrap(), "{short}: add_bos");
    assert_eq!(tok.add_eos(), vocab["add_eos"].as_bool().unwrap(), "{short}: add_eos");
    assert_eq!(tok.stop_ids(), &ids(&vocab["eog_ids"])[..], "{short}: end-of-generation ids");

    let roundtrip_failures: Vec<&str> =
        fx["detok_roundtrip_failures"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    let cases = fx["cases"].as_array().unwrap();
    let mut matched = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["llama_cpp"]);
        let got = tok.encode(text, false, true).unwrap();
        let mut ok = true;
        if got != want {
            errors.push(format!("{short} {}: ids\n  llama.cpp {want:?}\n  ours      {got:?}", show(text)));
            ok = false;
        }
        let want_add = ids(&case["llama_cpp_add_special"]);
        let got_add = tok.encode(text, true, true).unwrap();
        if got_add != want_add {
            errors.push(format!(
                "{short} {}: ids with BOS/EOS\n  llama.cpp {want_add:?}\n  ours      {got_add:?}",
                show(text)
            ));
            ok = false;
        }
        let want_detok = case["llama_cpp_detok"].as_str().unwrap();
        let detok = tok.decode(&want, false).unwrap();
        if detok != want_detok {
            errors.push(format!("{short} {}: detokenized {} want {}", show(text), show(&detok), show(want_detok)));
            ok = false;
        }
        if !roundtrip_failures.contains(&text) && detok != text {
            errors.push(format!("{short} {}: round trip gives {}", show(text), show(&detok)));
            ok = false;
        }
        for skip in [false, true] {
            let mut stream = IncrementalDetokenizer::new(skip);
            let mut streamed = String::new();
            for &id in &got {
                let piece = stream.push(&tok, id).unwrap();
                if piece.contains('\u{FFFD}') && !tok.decode(&got, skip).unwrap().contains('\u{FFFD}') {
                    errors.push(format!("{short} {}: streamed a broken piece {piece:?}", show(text)));
                    ok = false;
                }
                streamed.push_str(&piece);
            }
            streamed.push_str(&stream.finish(&tok).unwrap());
            let full = tok.decode(&got, skip).unwrap();
            if streamed != full {
                errors.push(format!(
                    "{short} {} skip={skip}: streamed {} != decoded {}",
                    show(text),
                    show(&streamed),
                    show(&full)
                ));
                ok = false;
            }
        }
        matched += usize::from(ok);
    }
    eprintln!("{short}: {matched}/{} fixture strings match llama.cpp in every check", cases.len());
    assert!(errors.is_empty(), "{short}: {} problems:\n{}", errors.len(), errors.join("\n"));
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2");
}

#[test]
fn qwen05_matches_llama_cpp() {
    check_model("qwen05");
}

#[test]
fn qwen15_matches_llama_cpp() {
    check_model("qwen15");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model("gemma3");
}

#[test]
fn every_model_has_a_fixture_test() {
    let tested = ["smollm2", "qwen05", "qwen15", "gemma3"];
    for (short, _) in MODELS {
        assert!(tested.contains(&short), "model {short} has no tokenizer fixture test");
    }
}

/// Without `parse_special`, control-token text stays text; the ids differ from the parsed ones and
/// decode back to the same string.
#[test]
fn control_text_without_parse_special() {
    for (short, text) in
        [("qwen05", "<|im_start|>user\nhi<|im_end|>"), ("gemma3", "<start_of_turn>user\nhi<end_of_turn>")]
    {
        let tok = load(short);
        let parsed = tok.encode(text, false, true).unwrap();
        let plain = tok.encode(text, false, false).unwrap();
        assert_ne!(parsed, plain, "{short}");
        assert!(parsed.iter().any(|&i| tok.is_stop(i)), "{short}: end-of-turn token parsed");
        assert!(!plain.iter().any(|&i| tok.is_stop(i)), "{short}: no special ids from plain text");
        assert_eq!(tok.decode(&plain, true).unwrap(), text, "{short}");
        assert_eq!(tok.decode(&parsed, true).unwrap(), "user\nhi", "{short}: skip_special hides control tokens");
    }
}
