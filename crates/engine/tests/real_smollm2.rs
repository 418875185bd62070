//! The generation loop on the real SmolLM2-135M (Q4_1 GGUF) on the CPU backend: greedy and seeded-sampled
//! replies of 32 tokens are identical for prefill chunks 1, 7, 64 and 512 and for 1 and 2 threads; a greedy
//! reply without logprobs (tokens from `Backend::argmax_rows`) equals the one drawn from downloaded logits.

use tf_backend_cpu::CpuBackend;
use tf_core::Precision;
use tf_engine::{FinishReason, Flow, GenRequest, Generator, SamplingParams};
use tf_loader::gguf::GgufFile;
use tf_models::load_model;

/// 70 prompt ids: real SmolLM2 tokenizations (fixtures/tokenizer/smollm2.json) of "The quick brown fox jumps
/// over the lazy dog.", "Once upon a time,\n\n\nthere were three newlines.", "class Foo: ..." (30 ids),
/// "def add(a, b):\n    return a + b\n" and "Hello, world!", concatenated.
const PROMPT: [u32; 70] = [
    504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, // the quick brown fox
    6403, 1980, 253, 655, 28, 1116, 198, 11527, 592, 1296, 725, 5110, 30, // once upon a time
    2064, 426, 568, 42, 472, 753, 2758, 2563, 3762, 771, 727, 448, 639, 30, 104, 446, 933, 89, 1903, 216, 34, 327,
    2056, 281, 1845, 24, 33, 32, 8307, 198, // class Foo
    1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198, // def add
    19556, 28, 905, 17, // Hello, world!
];

fn replies(threads: usize) -> Vec<(String, Vec<u32>)> {
    let be = CpuBackend::new(threads, Precision::Checkpoint);
    let file = GgufFile::open(tf_testkit::model_path("smollm2")).unwrap_or_else(|e| panic!("{e}"));
    let model = load_model(&be, &file, &file).unwrap_or_else(|e| panic!("{e}"));
    let mut g = Generator::new(&be, &*model, 8, 16).unwrap();
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.1,
        seed: Some(1234),
        ..SamplingParams::default()
    };
    let mut out = Vec::new();
    for (name, params) in [("greedy", SamplingParams::greedy()), ("sampled", sampled)] {
        for chunk in [1, 7, 64, 512] {
            let mut req = GenRequest::new(PROMPT.to_vec(), params.clone(), 32);
            req.prefill_chunk = chunk;
            let o = g.generate(&req, &mut |_| Flow::Continue).unwrap();
            assert_eq!((o.tokens.len(), o.finish_reason), (32, FinishReason::Length));
            assert!(o.tokens.iter().all(|&t| (t as usize) < model.vocab_size()));
            eprintln!("{threads} threads, {name}, chunk {chunk}: {} {:?}", o.token_sha, o.tokens);
            out.push((format!("{name}/{chunk}"), o.tokens));
        }
    }
    out
}

#[test]
fn replies_are_identical_across_prefill_chunks_and_threads() {
    let one = replies(1);
    for (name, tokens) in &one {
        let kind = name.split('/').next().unwrap();
        let first = &one.iter().find(|(n, _)| n.starts_with(kind)).unwrap().1;
        assert_eq!(tokens, first, "{name} differs from {kind}/1");
    }
    let greedy = &one[0].1;
    let sampled = &one[4].1;
    assert_ne!(greedy, sampled, "the sampled reply should not be the greedy one");
    let two = replies(2);
    assert_eq!(one, two, "1 thread vs 2 threads");
}

#[test]
fn greedy_replies_without_logprobs_take_the_backends_argmax_and_the_same_tokens() {
    let be = CpuBackend::new(2, Precision::Checkpoint);
    let file = GgufFile::open(tf_testkit::model_path("smollm2")).unwrap_or_else(|e| panic!("{e}"));
    let model = load_model(&be, &file, &file).unwrap_or_else(|e| panic!("{e}"));
    let mut g = Generator::new(&be, &*model, 8, 16).unwrap();
    let mut req = GenRequest::new(PROMPT.to_vec(), SamplingParams::greedy(), 32);
    req.prefill_chunk = 16;
    // Logprobs wanted: every row's logits are downloaded and drawn on the host.
    let host = g.generate(&req, &mut |_| Flow::Continue).unwrap();
    // No logprobs: the backend's argmax_rows, then the same request with that path turned off.
    req.logprobs = false;
    let argmax = g.generate(&req, &mut |_| Flow::Continue).unwrap();
    g.set_device_argmax(false);
    let off = g.generate(&req, &mut |_| Flow::Continue).unwrap();
    assert_eq!(argmax.tokens, host.tokens);
    assert_eq!(off.tokens, host.tokens);
    assert_eq!(host.tokens.len(), 32);
}
