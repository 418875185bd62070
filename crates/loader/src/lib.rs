//! Checkpoint readers: mmap'd GGUF and safetensors files, Hugging Face `config.json` /
//! `generation_config.json`, the local Hugging Face hub cache; and random weights with a config's shapes
//! (`dummy`, for benchmarks). Every reader validates offsets, sizes and counts against the file before use and
//! reports problems as [`tf_core::WeightsError`] naming the file, the tensor and the problem.

pub mod config_view;
pub mod dummy;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod hub;
pub mod safetensors;

use tf_core::{WeightSource, WeightsError};

/// Tensor `name` of `src` converted to f32 (dequantized for quant types), in row-major order.
pub fn tensor_f32(src: &dyn WeightSource, file: &str, name: &str) -> Result<Vec<f32>, WeightsError> {
    let info = src.info(name).ok_or_else(|| WeightsError::new(file, Some(name), "no such tensor"))?;
    let bytes = src.bytes(name)?;
    tf_quant::dequantize_to_vec(info.dtype, bytes, info.numel() as usize)
        .map_err(|e| WeightsError::new(file, Some(name), e.to_string()))
}
