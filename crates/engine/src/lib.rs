//! The TensorFold engine (DESIGN.md §5), first cut: the keyed sampler, the paged KV block pool and a
//! single-stream generation loop (chunked prefill, one-token decode steps). Synchronous; no async runtime.
//!
//! Depends on `tf-core` and `tf-models` only; it never names a backend or a model family.

mod ahead;
pub mod draft;
pub mod draft_model;
mod failure;
pub mod generate;
pub mod handle;
mod handle_shared;
pub mod kv_pool;
mod logits;
pub mod prefix_cache;
pub mod rounds;
pub mod sampler;
pub mod sched;
pub mod spec;

pub use draft::{default_proposer, ngram_proposer, DraftConfig, DraftCounts, DraftSetup, ProposerFactory, WindowCosts};
pub use draft_model::{model_proposer_factory, DraftModel, ModelProposer};
pub use generate::{
    token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent, TokenLogprob,
};
pub use handle::{
    EngineConfig, EngineEvent, EngineHandle, EngineInfo, EngineStats, EventSink, Priority, SubmitError, Ticket,
    TTFT_BUCKETS,
};
pub use kv_pool::{BlockRef, BlockTable, KvPool, PoolError};
pub use logits::greedy_on_device;
pub use prefix_cache::PrefixCache;
pub use rounds::{Grant, OnToken, Stream};
pub use sampler::{log_softmax_at, penalized, sample, sample_token, top_logprobs, Draw, SamplingError, SamplingParams};
pub use spec::CostTable;
