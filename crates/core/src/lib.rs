//! TensorFold core types shared by every crate: element types (including GGUF quant tags), the `WeightSource`
//! and `ConfigView` views of a checkpoint, and `Backend`, the one op interface models call.
//!
//! Depends on nothing internal (DESIGN.md §5).

mod backend;
mod config;
mod constraint;
mod dtype;
mod rng;
mod state;
mod weights;

pub use backend::{
    argmax_row, argmax_rows_of, norm_qkv_then_rope_kv_write, AttnMeta, AttnParams, Backend, BackendError, GluAct,
    KvCache, KvSpec, Precision, QueuedIds, Rope, RopeKv, RopeScaling, RopeStyle, RowAttn, Storage, Tensor, Weight,
};
pub use config::{ConfigFormat, ConfigView};
pub use constraint::{mask_allows, ConstraintError, ConstraintSpec, TokenConstraint};
pub use dtype::DType;
pub use rng::{derive_seed, mix, uniform, DEFAULT_SEED_SALT};
pub use state::{SsmParams, StateCache, StateIo, StateSpec, StateSrc};
pub use weights::{escape_controls, Release, SharedBytes, TensorInfo, WeightSource, WeightsError};
