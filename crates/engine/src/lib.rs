//! The TensorFold engine (DESIGN.md §5), first cut: the keyed sampler, the paged KV block pool and a
//! single-stream generation loop (chunked prefill, one-token decode steps). Synchronous; no async runtime.
//!
//! Depends on `tf-core` and `tf-models` only; it never names a backend or a model family.

pub mod generate;
pub mod kv_pool;
pub mod sampler;

pub use generate::{token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent};
pub use kv_pool::{BlockRef, BlockTable, KvPool, PoolError};
pub use sampler::{penalized, sample, Draw, SamplingError, SamplingParams};
