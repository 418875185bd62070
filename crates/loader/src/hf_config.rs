//! hf_config (in progress)
