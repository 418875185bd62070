//! The TensorFold engine (DESIGN.md §5): requests, the keyed sampler, the paged KV block pool with its prefix
//! cache, the scheduler, drafting, and the one engine loop every request goes through (`core.rs`: the
//! scheduler's plan, then one forward per round in `round.rs`, windows verified in `window.rs`, greedy steps
//! queued ahead in `ahead.rs`), behind [`EngineHandle`]. Synchronous; no async runtime.
//!
//! Depends on `tf-core` and `tf-models` only; it never names a backend or a model family.

mod ahead;
mod core;
pub mod draft;
pub mod draft_model;
mod failure;
pub mod generate;
pub mod handle;
pub mod kv_pool;
mod logits;
pub mod prefix_cache;
mod round;
pub mod sampler;
pub mod sched;
mod seq;
pub mod spec;
mod state;
mod window;

pub use draft::{default_proposer, ngram_proposer, DraftConfig, DraftCounts, DraftSetup, ProposerFactory, WindowCosts};
pub use draft_model::{model_proposer_factory, DraftModel, ModelProposer};
pub use generate::{
    default_state_registers, token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent,
    TokenLogprob,
};
pub use handle::{
    EngineConfig, EngineEvent, EngineHandle, EngineInfo, EngineStats, EventSink, Priority, SubmitError, Ticket,
    TTFT_BUCKETS,
};
pub use kv_pool::{BlockRef, BlockTable, KvPool, PoolError};
pub use logits::greedy_on_device;
pub use prefix_cache::PrefixCache;
pub use round::Grant;
pub use sampler::{log_softmax_at, penalized, sample, sample_token, top_logprobs, Draw, SamplingError, SamplingParams};
pub use seq::{OnToken, Sequence};
pub use spec::CostTable;
