//! The engine on the tiny mixture-of-experts checkpoints (fixtures/tiny/qwen3moe, fixtures/tiny/mixtral,
//! fixtures/tiny/gpt_oss; random
//! weights, so context-copy drafts are mostly rejected, at every position): eight replies — greedy and seeded
//! sampled, repetitive prompts whose copies accept and random ones — each equal, by token ids, to its serial solo
//! run, whether drafted alone or drafted in shared rounds with the other seven (each round mixes rows that choose
//! different experts).

mod tiny;

use tf_backend_cpu::CpuBackend;
use tf_core::Precision;
use tf_engine::{CostTable, DraftConfig, Flow, GenOutput, GenRequest, Generator, OnToken};
use tiny::{load, requests};

fn run(g: &mut Generator<'_>, reqs: &[GenRequest]) -> Vec<GenOutput> {
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    g.generate_many(items, 64).into_iter().map(|o| o.unwrap()).collect()
}

fn check(family: &str) {
    let be = CpuBackend::new(2, Precision::Checkpoint);
    let model = load(&be, family);
    let reqs = requests(model.vocab_size() as u32);
    let mut g = Generator::new(&be, model.as_ref(), 256, 16).unwrap();
    let serial: Vec<GenOutput> = reqs.iter().map(|r| g.generate(r, &mut |_| Flow::Continue).unwrap()).collect();
    g.set_drafting(Some(DraftConfig::new(5, CostTable::from_widths(&[1e-3; 5]))));
    let mut drafted_rows = 0;
    for (r, want) in reqs.iter().zip(&serial) {
        let got = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.tokens, want.tokens, "{family}: drafted solo != serial for prompt {:?}", r.prompt);
        drafted_rows += got.counts.drafted;
    }
    assert!(drafted_rows > 0, "{family}: nothing was drafted");
    let shared = run(&mut g, &reqs);
    for ((r, want), got) in reqs.iter().zip(&serial).zip(&shared) {
        assert_eq!(got.tokens, want.tokens, "{family}: drafted in shared rounds != serial for {:?}", r.prompt);
    }
}

#[test]
fn qwen3moe_drafted_and_shared_replies_equal_serial_solo_ones() {
    check("qwen3moe");
}

#[test]
fn mixtral_drafted_and_shared_replies_equal_serial_solo_ones() {
    check("mixtral");
}

/// gpt-oss also puts sinks into every attention softmax and slides a window of 4 over half its layers, so tree
/// windows and shared rounds cross the window edge.
#[test]
fn gpt_oss_drafted_and_shared_replies_equal_serial_solo_ones() {
    check("gpt_oss");
}
