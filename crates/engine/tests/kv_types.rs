//! The engine with the CPU backend's KV storage types f16 and q8_0 (docs/arithmetic.md "KV storage types"): each is
//! its own arithmetic, and the equalities of docs/design.md §2 hold within it.
//! - the tiny Gemma 3 checkpoint (fixtures/tiny/gemma3: head dim 32, sliding windows, random weights): eight
//!   replies, greedy and seeded sampled, each equal by token ids to its serial solo run when drafted alone and when
//!   drafted in shared rounds with the other seven;
//! - the real SmolLM2-135M (Q4_1 GGUF): greedy and sampled replies are identical for prefill chunks 1, 7 and 64
//!   (chunked == whole) and drafted == serial.

mod tiny;

use tf_backend_cpu::{CpuBackend, KvType};
use tf_core::Precision;
use tf_engine::{CostTable, DraftConfig, Flow, GenOutput, GenRequest, Generator, OnToken, SamplingParams};
use tf_loader::gguf::GgufFile;
use tf_models::load_model;

fn drafting() -> Option<DraftConfig> {
    Some(DraftConfig::new(5, CostTable::from_widths(&[1e-3; 5])))
}

fn run_shared(g: &mut Generator<'_>, reqs: &[GenRequest]) -> Vec<GenOutput> {
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    g.generate_many(items, 64).into_iter().map(|o| o.unwrap()).collect()
}

fn tiny_gemma3(ty: KvType) {
    let be = CpuBackend::new(2, Precision::Checkpoint).with_kv_type(ty);
    let model = tiny::load(&be, "gemma3");
    let reqs = tiny::requests(model.vocab_size() as u32);
    let mut g = Generator::new(&be, model.as_ref(), 256, 16).unwrap();
    let serial: Vec<GenOutput> = reqs.iter().map(|r| g.generate(r, &mut |_| Flow::Continue).unwrap()).collect();
    g.set_drafting(drafting());
    let mut drafted_rows = 0;
    for (r, want) in reqs.iter().zip(&serial) {
        let got = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.tokens, want.tokens, "{ty:?}: drafted solo != serial for prompt {:?}", r.prompt);
        drafted_rows += got.counts.drafted;
    }
    assert!(drafted_rows > 0, "{ty:?}: nothing was drafted");
    let shared = run_shared(&mut g, &reqs);
    for ((r, want), got) in reqs.iter().zip(&serial).zip(&shared) {
        assert_eq!(got.tokens, want.tokens, "{ty:?}: drafted in shared rounds != serial for {:?}", r.prompt);
    }
}

#[test]
fn q8_0_kv_drafted_and_shared_replies_equal_serial_solo_ones() {
    tiny_gemma3(KvType::Q8_0);
}

#[test]
fn f16_kv_drafted_and_shared_replies_equal_serial_solo_ones() {
    tiny_gemma3(KvType::F16);
}

/// 40 prompt ids: a real SmolLM2 tokenization of "The quick brown fox jumps over the lazy dog." twice, then
/// "def add(a, b):\n    return a + b\n" (repetition, so context-copy drafts accept).
const PROMPT: [u32; 40] = [
    504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30,
    1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198, 1604, 803, 24, 81, 28, 278, 727,
];

#[test]
fn smollm2_with_q8_0_kv_is_chunk_exact_and_drafted_equals_serial() {
    let be = CpuBackend::new(2, Precision::Checkpoint).with_kv_type(KvType::Q8_0);
    let file = GgufFile::open(tf_testkit::model_path("smollm2")).unwrap_or_else(|e| panic!("{e}"));
    let model = load_model(&be, &file, &file).unwrap_or_else(|e| panic!("{e}"));
    let mut g = Generator::new(&be, &*model, 8, 16).unwrap();
    let sampled = SamplingParams { temperature: 0.8, top_k: 40, seed: Some(77), ..SamplingParams::default() };
    for (name, params) in [("greedy", SamplingParams::greedy()), ("sampled", sampled)] {
        let reply = |g: &mut Generator<'_>, chunk: usize| {
            let mut req = GenRequest::new(PROMPT.to_vec(), params.clone(), 24);
            req.prefill_chunk = chunk;
            g.generate(&req, &mut |_| Flow::Continue).unwrap()
        };
        g.set_drafting(None);
        let whole = reply(&mut g, 64);
        assert_eq!(whole.tokens.len(), 24, "{name}");
        for chunk in [1, 7] {
            assert_eq!(reply(&mut g, chunk).tokens, whole.tokens, "{name}: chunk {chunk} vs 64");
        }
        g.set_drafting(drafting());
        let drafted = reply(&mut g, 64);
        assert_eq!(drafted.tokens, whole.tokens, "{name}: drafted vs serial");
        if name == "greedy" {
            assert!(drafted.counts.drafted > 0, "nothing was drafted");
        }
    }
}
