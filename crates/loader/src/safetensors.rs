//! safetensors (in progress)
