//! Chat templates from the GGUF files rendered against `transformers.apply_chat_template(...,
//! tokenize=False)` (fixtures/chat/<model>.json): byte-for-byte equal output for every conversation,
//! or an error where the reference raised. A missing model file fails the test (run
//! `scripts/fetch-models.sh all`).

use serde_json::Value;
use tf_cli::gguf_text::tokenizer_from_gguf;
use tf_loader::gguf::GgufFile;
use tf_testkit::{fixture, model_path, repo_root};
use tf_text::{ChatRenderOptions, ChatTemplate, TextError, Tokenizer};

fn load(short: &str) -> Tokenizer {
    let path = model_path(short);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tokenizer_from_gguf(file.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn options(conv: &Value, tok: &Tokenizer) -> ChatRenderOptions {
    ChatRenderOptions {
        add_generation_prompt: conv["add_generation_prompt"].as_bool().unwrap_or(false),
        tools: conv.get("tools").filter(|t| !t.is_null()).cloned(),
        bos_token: tok.bos_token().map(str::to_owned),
        eos_token: tok.eos_token().map(str::to_owned),
        enable_thinking: conv.get("enable_thinking").and_then(|v| v.as_bool()),
        ..Default::default()
    }
}

fn check_model(short: &str) {
    let tok = load(short);
    let fx = fixture(&format!("chat/{short}.json"));
    let convs = fixture("chat/conversations.json");
    let convs = convs.as_array().unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(cases.len(), convs.len(), "{short}: one case per conversation");
    assert_eq!(tok.bos_token(), fx["bos_token"].as_str(), "{short}: bos_token");
    assert_eq!(tok.eos_token(), fx["eos_token"].as_str(), "{short}: eos_token");

    let Some(source) = tok.chat_template() else {
        // The reference has no template either: every case is an error.
        assert!(fx["template_file"].is_null(), "{short}: the fixture has a template but the GGUF has none");
        for case in cases {
            assert!(case["rendered"].is_null() && case["error"].is_string(), "{short}: {}", case["name"]);
        }
        eprintln!("{short}: no chat template (as the reference): {} cases raise", cases.len());
        return;
    };
    let file = repo_root().join("fixtures/chat").join(fx["template_file"].as_str().expect("template_file"));
    let reference_source = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(source, reference_source, "{short}: the GGUF's template differs from the reference's");
    let tmpl = ChatTemplate::new(source).unwrap_or_else(|e| panic!("{short}: {e}"));

    let mut errors = Vec::new();
    let mut matched = 0;
    for (conv, case) in convs.iter().zip(cases) {
        let name = case["name"].as_str().unwrap();
        assert_eq!(conv["name"].as_str(), Some(name), "{short}: case order");
        let got = tmpl.render(&conv["messages"], &options(conv, &tok));
        match (got, case["rendered"].as_str(), case["error"].as_str()) {
            (Ok(g), Some(want), _) if g == want => matched += 1,
            (Ok(g), Some(want), _) => errors.push(format!("{name}: rendered\n{g:?}\nwant\n{want:?}")),
            (Ok(g), None, err) => errors.push(format!("{name}: rendered {g:?} but the reference raised {err:?}")),
            (Err(e @ (TextError::Template(_) | TextError::TemplateRaised(_))), None, Some(err)) => {
                eprintln!("{short} {name}: raises as the reference ({err}): ours: {e}");
                matched += 1;
            }
            (Err(e), _, err) => errors.push(format!("{name}: error {e} (reference error: {err:?})")),
        }
    }
    eprintln!("{short}: {matched}/{} conversations match transformers", cases.len());
    assert!(errors.is_empty(), "{short}: {} mismatches:\n{}", errors.len(), errors.join("\n\n"));
}

#[test]
fn smollm2_chat_template_matches_transformers() {
    check_model("smollm2");
}

#[test]
fn qwen05_chat_template_matches_transformers() {
    check_model("qwen05");
}

#[test]
fn qwen15_chat_template_matches_transformers() {
    check_model("qwen15");
}

#[test]
fn gemma3_has_no_chat_template() {
    check_model("gemma3");
}

/// The rendered prompt tokenizes with its control tokens parsed (how the server feeds it to the model).
#[test]
fn rendered_prompt_tokenizes_with_control_tokens() {
    let tok = load("qwen05");
    let tmpl = ChatTemplate::new(tok.chat_template().unwrap()).unwrap();
    let messages = serde_json::json!([{"role": "user", "content": "Hi"}]);
    let opts = ChatRenderOptions { add_generation_prompt: true, ..Default::default() };
    let prompt = tmpl.render(&messages, &opts).unwrap();
    let ids = tok.encode(&prompt, tok.add_bos(), true).unwrap();
    let im_start = tok.id_of("<|im_start|>").unwrap();
    let im_end = tok.id_of("<|im_end|>").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == im_start).count(), 3, "system, user, assistant headers");
    assert_eq!(ids.iter().filter(|&&i| i == im_end).count(), 2);
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
}
