//! Integration tests of the model families, in one test binary:
//! - `bytes`: the weight bytes a decode step reads, against a count from the checkpoint;
//! - `config`: `ModelConfig` from both formats, family dispatch, load errors;
//! - `gguf_convert`: the tiny checkpoints converted to GGUF as llama.cpp does, against the same goldens;
//! - `gguf_reference`: the real GGUF models against transformers (fp32, same weights) and llama.cpp;
//! - `goldens`: tiny random HF checkpoints against transformers' fp32 logits;
//! - `hybrid`: the recurrent-state family (Nemotron-H) against transformers, chunked, shared and windowed;
//! - `moe`: mixture-of-experts routing is row-exact (alone == among 1-63 rows choosing any experts);
//! - `exact`: chunked == whole == decoded == shared == tree window, bitwise, on the real models;
//! - `sanity`: greedy continuations of a plain prompt;
//! - `trace` (feature `trace`): the intermediate hook.
//!
//! `naive` is a textbook backend used as a second opinion on the model code (not on kernels).

mod bytes;
mod common;
mod config;
mod exact;
mod gguf_convert;
mod gguf_reference;
mod goldens;
mod hybrid;
mod moe;
mod naive;
mod sanity;
#[cfg(feature = "trace")]
mod trace;
