//! A model loaded for generation: backend, model graph, tokenizer and chat template, from any MODEL argument.

use crate::model_ref::ModelRef;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tf_backend_cpu::{CpuBackend, KvType};
use tf_backend_cuda::{Arithmetic, CudaTuning};
use tf_core::DType;
use tf_core::{Backend, Precision};
use tf_loader::dummy::DummyWeights;
use tf_loader::gguf::GgufFile;
use tf_loader::hf_config::{GenerationConfig, HfConfig};
use tf_loader::safetensors::SafetensorsModel;
use tf_models::Model;
use tf_text::{ChatRenderOptions, ChatTemplate, Tokenizer};

/// The tokenizer of dummy models without a `tokenizer.json`: 256 byte tokens, no merges.
const BYTE_TOKENIZER: &[u8] = include_bytes!("../../../fixtures/tiny/byte-tokenizer.json");

/// Which backend runs the model (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// CUDA when this binary has it (feature `cuda`) and a device is found, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Option<BackendChoice> {
        match s {
            "auto" => Some(BackendChoice::Auto),
            "cpu" => Some(BackendChoice::Cpu),
            "cuda" => Some(BackendChoice::Cuda),
            _ => None,
        }
    }
}

/// The tuning [`build_backend`] gives the CUDA backend: the measured defaults unless `bench` took the
/// environment's ([`use_cuda_env_tuning`]).
static CUDA_TUNING: OnceLock<CudaTuning> = OnceLock::new();

/// For `serve` and `run`, which run the measured default CUDA tuning only: an error naming the first `TF_CUDA_*`
/// variable set in the environment, if any.
pub fn refuse_cuda_overrides(command: &str) -> Result<(), String> {
    match tf_backend_cuda::tuning::env_overrides().first() {
        Some(k) => Err(format!(
            "{k} is set: CUDA tuning overrides are for `tensorfold bench` only; `tensorfold {command}` runs the \
             measured defaults (unset {k})"
        )),
        None => Ok(()),
    }
}

/// For `bench`: every CUDA backend built later takes the environment's tuning (`TF_CUDA_*`,
/// `CudaTuning::from_env`); a bad value is an error naming its variable.
pub fn use_cuda_env_tuning() -> Result<(), String> {
    let t = CudaTuning::from_env()?;
    let _ = CUDA_TUNING.set(t);
    Ok(())
}

/// Builds the backend `choice` names: the CPU with `threads` threads and its KV cache stored as `kv_type`, or the
/// first CUDA device in `arithmetic` (the CPU has only the portable one; CUDA stores its KV cache in f32 only).
pub fn build_backend(
    choice: BackendChoice,
    threads: usize,
    precision: Precision,
    arithmetic: Arithmetic,
    kv_type: KvType,
) -> Result<Arc<dyn Backend>, String> {
    let cpu = || -> Result<Arc<dyn Backend>, String> {
        if arithmetic != Arithmetic::Portable {
            return Err(format!("--arithmetic {}: only the CUDA backend has it", arithmetic.name()));
        }
        Ok(Arc::new(CpuBackend::new(threads, precision).with_kv_type(kv_type)))
    };
    #[cfg(feature = "cuda")]
    let cuda = |precision, arithmetic| {
        if kv_type != KvType::F32 {
            return Err(format!(
                "--kv-type {}: the CUDA backend stores its KV cache in f32 only (use --backend cpu)",
                kv_type.name()
            ));
        }
        cuda(precision, arithmetic)
    };
    match choice {
        BackendChoice::Cpu => cpu(),
        #[cfg(feature = "cuda")]
        BackendChoice::Cuda => cuda(precision, arithmetic),
        #[cfg(feature = "cuda")]
        BackendChoice::Auto if tf_backend_cuda::available() => cuda(precision, arithmetic),
        #[cfg(not(feature = "cuda"))]
        BackendChoice::Cuda => {
            Err("--backend cuda: this tensorfold was built without CUDA (build tf-cli with --features cuda)".into())
        }
        BackendChoice::Auto => cpu(),
    }
}

#[cfg(feature = "cuda")]
fn cuda(precision: Precision, arithmetic: Arithmetic) -> Result<Arc<dyn Backend>, String> {
    if !tf_backend_cuda::available() {
        return Err("--backend cuda: no CUDA device found (or the CUDA driver could not be loaded)".into());
    }
    // The first start on a machine compiles the kernels (NVRTC, then the driver's JIT): up to a minute of silence
    // otherwise. Both compiles are cached (src/kernel_cache.rs, the driver's cache), so later starts take seconds.
    eprintln!("tensorfold: loading the CUDA kernels (the first start on a machine compiles them, up to a minute)");
    let t = std::time::Instant::now();
    let tuning = CUDA_TUNING.get().cloned().unwrap_or_default();
    let be = tf_backend_cuda::CudaBackend::with_tuning(0, precision, arithmetic, tuning)
        .map_err(|e| format!("--backend cuda: {e}"))?;
    let s = t.elapsed().as_secs_f64();
    if s > 5.0 {
        eprintln!("tensorfold: CUDA kernels ready in {s:.0} s (cached for the next start)");
    }
    Ok(Arc::new(be))
}

/// Sampling defaults a checkpoint asks for (`generation_config.json`), where it says.
#[derive(Clone, Debug, Default)]
pub struct ModelDefaults {
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

/// Everything needed to generate with one model.
pub struct Session {
    pub backend: Arc<dyn Backend>,
    pub model: Box<dyn Model>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub defaults: ModelDefaults,
    /// Where the model came from, for messages.
    pub path: String,
}

impl Session {
    /// The tokenizer's vocabulary size when the model's head is wider (padding rows, as HF checkpoints of Qwen
    /// have): the engine never draws those ids. `None` when every head row is a token.
    pub fn token_limit(&self) -> Option<usize> {
        let n = self.tokenizer.vocab_size();
        (n < self.model.vocab_size()).then_some(n)
    }

    /// Loads `model` onto the backend `--backend auto` picks ([`BackendChoice::Auto`]), `threads` CPU threads, in
    /// `precision` mode and the portable arithmetic.
    pub fn load(model: &ModelRef, threads: usize, precision: Precision) -> Result<Session, String> {
        Session::load_on(model, BackendChoice::Auto, threads, precision, Arithmetic::Portable)
    }

    /// Loads `model` onto the backend `choice` names, its KV cache in f32.
    pub fn load_on(
        model: &ModelRef,
        choice: BackendChoice,
        threads: usize,
        precision: Precision,
        arithmetic: Arithmetic,
    ) -> Result<Session, String> {
        Session::load_on_kv(model, choice, threads, precision, arithmetic, KvType::F32)
    }

    /// Loads `model` onto the backend `choice` names, its KV cache stored as `kv_type`.
    pub fn load_on_kv(
        model: &ModelRef,
        choice: BackendChoice,
        threads: usize,
        precision: Precision,
        arithmetic: Arithmetic,
        kv_type: KvType,
    ) -> Result<Session, String> {
        let backend = build_backend(choice, threads, precision, arithmetic, kv_type)?;
        let tokenizer = crate::load_tokenizer(model)?;
        let path = model.path().display().to_string();
        let (model, defaults) = match model {
            ModelRef::Gguf(p) => {
                let g = GgufFile::open(p).map_err(|e| e.to_string())?;
                let m = tf_models::load_model(backend.as_ref(), &g, &g).map_err(|e| format!("{path}: {e}"))?;
                (m, ModelDefaults::default())
            }
            ModelRef::HfDir(dir) => {
                let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
                let st = SafetensorsModel::open_dir(dir).map_err(|e| e.to_string())?;
                let m = tf_models::load_model(backend.as_ref(), &st, &cfg).map_err(|e| format!("{path}: {e}"))?;
                (m, hf_defaults(dir)?)
            }
        };
        let template = match tokenizer.chat_template() {
            Some(src) => Some(ChatTemplate::new(src).map_err(|e| format!("{path}: {e}"))?),
            None => None,
        };
        Ok(Session { backend, model, tokenizer, template, defaults, path })
    }

    /// A model of random weights with the shapes of `config` (a `config.json`, or a directory holding one; no
    /// weight files are read), matrices of type `dtype` (default: the config's `torch_dtype`), generated from
    /// `seed`. The tokenizer is the directory's `tokenizer.json` when there is one, else a 256-token byte-level
    /// one. For timing real shapes only: the text is noise.
    #[allow(clippy::too_many_arguments)]
    pub fn load_dummy(
        config: &Path,
        dtype: Option<DType>,
        seed: u64,
        choice: BackendChoice,
        threads: usize,
        precision: Precision,
        arithmetic: Arithmetic,
        kv_type: KvType,
    ) -> Result<Session, String> {
        let (dir, file, cfg, dtype) = dummy_config(config, dtype)?;
        let tokenizer = if dir.join("tokenizer.json").is_file() {
            Tokenizer::from_hf_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?
        } else {
            Tokenizer::from_hf_json(BYTE_TOKENIZER, None, &[]).map_err(|e| format!("byte-level tokenizer: {e}"))?
        };
        if tokenizer.vocab_size() > cfg.vocab_size as usize {
            return Err(format!(
                "{}: vocab_size {} is smaller than the tokenizer's {} tokens",
                file.display(),
                cfg.vocab_size,
                tokenizer.vocab_size()
            ));
        }
        let backend = build_backend(choice, threads, precision, arithmetic, kv_type)?;
        let src = DummyWeights::new(&cfg, dtype, seed).map_err(|e| e.to_string())?;
        let path = format!(
            "{} (dummy weights: random {dtype}, seed {seed}, {:.2} GB)",
            file.display(),
            src.total_bytes() as f64 / 1e9
        );
        let model = tf_models::load_model(backend.as_ref(), &src, &cfg).map_err(|e| format!("{path}: {e}"))?;
        drop(src);
        let template = match tokenizer.chat_template() {
            Some(src) => Some(ChatTemplate::new(src).map_err(|e| format!("{path}: {e}"))?),
            None => None,
        };
        Ok(Session { backend, model, tokenizer, template, defaults: ModelDefaults::default(), path })
    }

    /// Renders a chat (`messages` as OpenAI-style JSON) with the generation prompt, and tokenizes it the way
    /// `transformers` does (the template writes any BOS itself).
    pub fn chat_prompt(&self, messages: &serde_json::Value) -> Result<Vec<u32>, String> {
        let template = self.template.as_ref().ok_or_else(|| {
            format!("{}: the model has no chat template; give a plain prompt without --chat", self.path)
        })?;
        let opts = ChatRenderOptions {
            add_generation_prompt: true,
            bos_token: self.tokenizer.bos_token().map(str::to_owned),
            eos_token: self.tokenizer.eos_token().map(str::to_owned),
            ..Default::default()
        };
        let text = template.render(messages, &opts).map_err(|e| e.to_string())?;
        self.tokenizer.encode(&text, false, true).map_err(|e| e.to_string())
    }

    /// Tokenizes a plain prompt with the model's BOS/EOS rules.
    pub fn plain_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer.encode(text, true, true).map_err(|e| e.to_string())
    }
}

/// What `--load-format dummy` reads of `config` (a `config.json`, or a directory holding one): the directory, the
/// file, the config, and the matrix type (`dtype`, else the config's `torch_dtype`).
pub(crate) fn dummy_config(config: &Path, dtype: Option<DType>) -> Result<(&Path, PathBuf, HfConfig, DType), String> {
    let (dir, file) = if config.is_dir() {
        (config, config.join("config.json"))
    } else {
        (config.parent().unwrap_or(Path::new(".")), config.to_owned())
    };
    let cfg = HfConfig::from_file(&file).map_err(|e| e.to_string())?;
    let dtype = match dtype {
        Some(d) => d,
        None => tf_loader::dummy::config_dtype(&cfg).map_err(|e| e.to_string())?,
    };
    Ok((dir, file, cfg, dtype))
}

fn hf_defaults(dir: &Path) -> Result<ModelDefaults, String> {
    let Some(g) = GenerationConfig::from_dir(dir).map_err(|e| e.to_string())? else {
        return Ok(ModelDefaults::default());
    };
    let sampled = g.do_sample.unwrap_or(true);
    Ok(ModelDefaults {
        temperature: if sampled { g.temperature } else { Some(0.0) },
        top_k: g.top_k.map(|k| k as usize),
        top_p: g.top_p,
        min_p: g.min_p,
        repetition_penalty: g.repetition_penalty,
    })
}
