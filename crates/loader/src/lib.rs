//! Checkpoint readers: mmap'd GGUF and safetensors files, Hugging Face `config.json` /
//! `generation_config.json`, and the local Hugging Face hub cache. Every reader validates offsets, sizes and
//! counts against the file before use and reports problems as [`tf_core::WeightsError`] naming the file, the
//! tensor and the problem.

pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod hub;
pub mod safetensors;
