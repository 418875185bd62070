//! Model families and the registry from architecture names to families.
//!
//! Each family is one file of calls to shared layers (`layers.rs`, DESIGN.md §5); variants are config flags.
//! This crate names no backend and no file format: weights arrive through `WeightSource`, configuration through
//! `ConfigView`, and every op goes through `&dyn Backend`.
//!
//! Families: `llama.rs` (llama, qwen2, qwen3, qwen3moe: one decoder with flags; sparse layers from `moe.rs`),
//! `gemma3.rs`, `gptoss.rs` and `nemotron_h.rs` (a hybrid with recurrent Mamba-2 layers). `config.rs` reads
//! [`ModelConfig`] from either format, `load.rs` maps tensor names and checks shapes.

mod config;
mod gemma3;
mod gptoss;
pub mod layers;
mod llama;
mod load;
mod model;
pub mod moe;
mod nemotron_h;
mod registry;

pub use config::{ModelConfig, MoeConfig};
pub use model::{Batch, Model, ModelError};
pub use registry::{
    family_for_architecture, family_for_config, family_for_hf_architecture, load_model, Family, FAMILIES,
};
