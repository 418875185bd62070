//! `ConfigView`: a format-neutral read-only view of a checkpoint's configuration, so model families can read
//! GGUF metadata (`llama.block_count`) or Hugging Face `config.json` fields (`num_hidden_layers`) without
//! depending on a file reader.

/// Where the keys come from: family code picks key names by format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// GGUF metadata keys (`general.architecture`, `{arch}.block_count`, ...).
    Gguf,
    /// Hugging Face `config.json` keys (with a multimodal `text_config` already flattened into the top level).
    HfConfig,
}

pub trait ConfigView: Send + Sync {
    fn format(&self) -> ConfigFormat;
    /// The architecture name: GGUF `general.architecture`, or the HF `model_type`.
    fn architecture(&self) -> Option<String>;
    /// A non-negative integer.
    fn get_u64(&self, key: &str) -> Option<u64>;
    /// A number (float or integer).
    fn get_f64(&self, key: &str) -> Option<f64>;
    fn get_str(&self, key: &str) -> Option<String>;
    fn get_bool(&self, key: &str) -> Option<bool>;
    /// An array of numbers.
    fn get_f64_array(&self, key: &str) -> Option<Vec<f64>>;
    /// An array of strings.
    fn get_str_array(&self, key: &str) -> Option<Vec<String>>;
}
