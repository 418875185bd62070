//! Model families and the registry from architecture names to families.
//!
//! Each family is one file of calls to shared layers (`layers.rs`, DESIGN.md §5); variants are config flags.
//! This crate names no backend and no file format: weights arrive through `WeightSource`, configuration through
//! `ConfigView`, and every op goes through `&dyn Backend`.

mod model;
mod registry;

pub use model::{Batch, Model, ModelError};
pub use registry::{family_for_architecture, family_for_hf_architecture, Family, FAMILIES};
