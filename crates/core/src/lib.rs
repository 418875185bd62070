//! TensorFold core types shared by every crate: element types (including GGUF quant tags), shapes, and the
//! `WeightSource` view that models read weights through, whatever file format they came from.
//!
//! Depends on nothing internal (DESIGN.md §5).

mod dtype;
mod weights;

pub use dtype::DType;
pub use weights::{TensorInfo, WeightSource, WeightsError};
