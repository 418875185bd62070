//! Model families and the registry from architecture names to families.
//!
//! Each family will be one file of calls to shared layers (DESIGN.md §5); variants are config flags. This crate
//! names no backend and no file format: configs reach it as plain values.

mod registry;

pub use registry::{family_for_architecture, family_for_hf_architecture, Family, FAMILIES};
