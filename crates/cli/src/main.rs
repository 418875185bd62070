//! `tensorfold`: the command-line front end.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tf_cli::facts::ModelFacts;
use tf_cli::model_ref::{self, ModelRef};
use tf_loader::gguf::GgufFile;

#[derive(Parser)]
#[command(
    name = "tensorfold",
    version,
    about = "A local LLM inference engine whose drafted decoding writes the same bytes as serial decoding"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what a model is: family, format, quant types, shape, context, vocab, memory needed.
    Info {
        /// A .gguf file, a Hugging Face-style directory, or a hub id (org/name[@rev][:file]) in the local HF cache.
        model: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also list every metadata key (GGUF) or config field.
        #[arg(long)]
        metadata: bool,
        /// Size the KV cache in "memory needed" as `serve --kv-type` stores it: `f32`, `f16` or `q8_0`.
        #[arg(long, default_value = "f32", value_parser = tf_cli::run::parse_kv_type)]
        kv_type: tf_backend_cpu::KvType,
    },
    /// Serve a model behind the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses, ...).
    Serve(tf_cli::serve::ServeArgs),
    /// The exactness receipt: run a built-in suite of 36 prompts (30 in five kinds, 6 under a JSON schema) with
    /// drafts and serially, compare token ids, print acceptance and speedup per prompt kind; exit non-zero on any
    /// difference. Every drafted round here
    /// verifies at least one draft (--min-drafts is raised to 1) so that every token passes through a window;
    /// its speedups are therefore a lower bound of what `serve` and `run` (--min-drafts 0) get.
    Check(tf_cli::check::CheckArgs),
    /// Generate from a prompt: text streams to stdout, the receipt (token_sha, tok/s) goes to stderr.
    Run(tf_cli::run::RunArgs),
    /// Perplexity of a text file (teacher-forced), optionally dumping the argmax at every position.
    Perplexity(tf_cli::score::PerplexityArgs),
    /// Prefill and serial decode speed, in-process: one warm-up run, then medians of several runs.
    Bench(tf_cli::score::BenchArgs),
    /// Print the token ids of TEXT as JSON.
    Tokenize {
        /// A .gguf file, a Hugging Face-style directory, or a hub id in the local HF cache.
        model: String,
        /// The text to tokenize.
        text: String,
        /// Do not add the model's BOS/EOS tokens (added by default when the model asks for them).
        #[arg(long)]
        no_special: bool,
        /// Treat special-token text such as "<|im_start|>" as plain text instead of as the special token.
        #[arg(long)]
        no_parse_special: bool,
        /// Print [id, "piece"] pairs instead of bare ids.
        #[arg(long)]
        pieces: bool,
    },
    /// List the model families TensorFold recognizes.
    Models,
    /// Download a Hugging Face repo (config, tokenizer and weights, or one GGUF file) into the HF cache.
    Pull {
        /// org/name[@revision][:file.gguf | :QUANT], e.g. Qwen/Qwen2.5-0.5B-Instruct or
        /// bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M
        repo: String,
        /// Cache directory (default: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
        #[arg(long)]
        cache_dir: Option<std::path::PathBuf>,
        /// Never touch the network; only report what the cache holds (also HF_HUB_OFFLINE=1).
        #[arg(long)]
        offline: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { model, json, metadata, kv_type } => info(&model, json, metadata, kv_type),
        Command::Serve(args) => tf_cli::serve::serve(&args),
        Command::Run(args) => tf_cli::run::run(&args),
        Command::Check(args) => tf_cli::check::check(&args),
        Command::Perplexity(args) => tf_cli::score::perplexity(&args),
        Command::Bench(args) => tf_cli::score::bench(&args),
        Command::Tokenize { model, text, no_special, no_parse_special, pieces } => {
            tokenize(&model, &text, !no_special, !no_parse_special, pieces)
        }
        Command::Models => {
            models();
            Ok(())
        }
        Command::Pull { repo, cache_dir, offline } => pull(&repo, cache_dir, offline),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn info(spec: &str, json: bool, metadata: bool, kv_type: tf_backend_cpu::KvType) -> Result<(), String> {
    let model = model_ref::resolve(spec)?;
    let (facts, meta_lines) = match &model {
        ModelRef::Gguf(path) => {
            let g = GgufFile::open(path).map_err(|e| e.to_string())?;
            let lines: Vec<String> = if metadata {
                g.metadata().iter().map(|(k, v)| format!("{k} = {}", v.summary())).collect()
            } else {
                Vec::new()
            };
            (ModelFacts::from_gguf(&g), lines)
        }
        ModelRef::HfDir(dir) => {
            let lines = if metadata {
                let cfg = std::fs::read_to_string(dir.join("config.json")).map_err(|e| e.to_string())?;
                cfg.lines().map(str::to_owned).collect()
            } else {
                Vec::new()
            };
            (ModelFacts::from_hf_dir(dir)?, lines)
        }
    };
    let facts = facts.with_kv_type(kv_type);
    if json {
        println!("{}", serde_json::to_string_pretty(&facts).expect("facts serialize"));
    } else {
        print!("{}", facts.render());
        if metadata {
            println!("\nmetadata:");
            for l in meta_lines {
                println!("  {l}");
            }
        }
    }
    Ok(())
}

fn models() {
    println!("{:<8}  {:<40}  notes", "family", "models");
    for f in tf_models::FAMILIES {
        println!("{:<8}  {:<40}  {}", f.name, f.examples, f.notes);
    }
}

fn pull(spec: &str, cache_dir: Option<std::path::PathBuf>, offline: bool) -> Result<(), String> {
    use std::io::IsTerminal;
    let repo = tf_loader::hub::parse_repo_spec(spec).map_err(|e| e.to_string())?;
    let options = tf_loader::hub::PullOptions {
        cache_dir,
        offline,
        progress: std::io::stderr().is_terminal(),
        ..Default::default()
    };
    let path = tf_loader::hub::pull(&repo, &options).map_err(|e| e.to_string())?;
    println!("{}", path.display());
    Ok(())
}

fn tokenize(spec: &str, text: &str, add_special: bool, parse_special: bool, pieces: bool) -> Result<(), String> {
    let model = model_ref::resolve(spec)?;
    let tok = tf_cli::load_tokenizer(&model)?;
    let ids = tok.encode(text, add_special, parse_special).map_err(|e| e.to_string())?;
    let out = if pieces {
        let pairs: Vec<serde_json::Value> =
            ids.iter().map(|&id| serde_json::json!([id, String::from_utf8_lossy(tok.token_to_piece(id))])).collect();
        serde_json::to_string(&pairs)
    } else {
        serde_json::to_string(&ids)
    };
    println!("{}", out.expect("ids serialize"));
    Ok(())
}
