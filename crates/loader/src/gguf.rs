//! gguf (in progress)
