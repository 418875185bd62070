//! The CI form of the fuzz targets (stable Rust, no libFuzzer): each target's seed corpus under `fuzz/seeds/`,
//! then a fixed number of random mutations of it, through the same bodies the cargo-fuzz targets run (550,000
//! mutations in all: about 30 s of CPU in a debug build on a 2-core AMD EPYC, 45 s of wall time on its two busy
//! cores). The mutation seed is fixed per target; `TF_FUZZ_SEED=<n>|fresh` explores others, `TF_FUZZ_ITERS`
//! changes the number of mutations per target.

#[global_allocator]
static A: tf_testkit::alloc::Counting = tf_testkit::alloc::Counting;

fn replay(name: &str, iters: usize) {
    let r = tf_fuzz::replay::replay(tf_fuzz::target(name), iters);
    assert!(r.seeds > 0);
}

#[test]
fn gguf() {
    replay("gguf", 100000);
}

#[test]
fn safetensors() {
    replay("safetensors", 100000);
}

#[test]
fn tokenizer() {
    replay("tokenizer", 30000);
}

#[test]
fn chat_template() {
    replay("chat_template", 40000);
}

#[test]
fn chat() {
    replay("chat", 40000);
}

#[test]
fn completions() {
    replay("completions", 40000);
}

#[test]
fn responses() {
    replay("responses", 40000);
}

#[test]
fn messages() {
    replay("messages", 40000);
}

#[test]
fn count_tokens() {
    replay("count_tokens", 40000);
}

#[test]
fn tokenize() {
    replay("tokenize", 40000);
}

#[test]
fn detokenize() {
    replay("detokenize", 40000);
}

#[test]
fn every_target_has_a_test_here() {
    let src = include_str!("replay.rs");
    for t in tf_fuzz::TARGETS {
        assert!(src.contains(&format!("fn {}()", t.name)), "no test replays `{}`", t.name);
    }
}

/// The seeds start past validation: every reader seed opens, every request seed is accepted (crash
/// reproductions, `crash-*`, aside).
#[test]
fn seeds_are_accepted_inputs() {
    let seeds = |t: &tf_fuzz::Target| {
        let all = tf_fuzz::replay::seeds(t);
        all.into_iter()
            .filter(|(p, _)| !p.file_name().unwrap().to_string_lossy().starts_with("crash-"))
            .collect::<Vec<_>>()
    };
    for (path, b) in seeds(tf_fuzz::target("gguf")) {
        let h = tf_loader::gguf::parse_header(&b, "seed").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if h.metadata.get("tokenizer.ggml.model").is_some() {
            tf_cli::gguf_text::tokenizer_from_gguf(&h.metadata).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let family = tf_models::family_for_config(&h.metadata).unwrap();
            tf_models::ModelConfig::from_view(&h.metadata, family)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    for (path, b) in seeds(tf_fuzz::target("safetensors")) {
        let p = std::path::Path::new("seed");
        tf_loader::safetensors::parse_header(p, &b).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let st = tf_fuzz::server::state();
    let ok = |path: &std::path::Path, r: Result<(), tf_server::error::ApiError>| {
        r.unwrap_or_else(|e| panic!("{}: {}", path.display(), e.message));
    };
    for (p, b) in seeds(tf_fuzz::target("chat")) {
        ok(&p, tf_server::chat::parse(st, &b).map(drop));
    }
    for (p, b) in seeds(tf_fuzz::target("completions")) {
        ok(&p, tf_server::completions::parse(st, &b).map(drop));
    }
    for (p, b) in seeds(tf_fuzz::target("responses")) {
        ok(&p, tf_server::responses::parse(st, &b).map(drop));
    }
    for (p, b) in seeds(tf_fuzz::target("messages")) {
        ok(&p, tf_server::messages::parse(st, &b).map(drop));
    }
    for (p, b) in seeds(tf_fuzz::target("count_tokens")) {
        ok(&p, tf_server::messages::parse_count_tokens(st, &b).map(drop));
    }
}
