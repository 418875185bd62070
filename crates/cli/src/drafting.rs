//! The drafting options of `run`, `serve` and `check`.

use crate::model_ref::{self, ModelRef};
use crate::session::Session;
use clap::Args;
use std::sync::{Arc, Mutex};
use tf_engine::{model_proposer_factory, ngram_proposer, DraftModel, ProposerFactory};
use tf_loader::gguf::GgufFile;
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;

#[derive(Args, Debug, Clone)]
pub struct DraftArgs {
    /// How to draft: `auto` or `ngram` (context copies), `none` (serial), or a draft MODEL sharing the target's
    /// vocabulary (a .gguf file or HF directory; context copies are tried first each round). Replies are the
    /// same bytes either way; drafting only changes speed.
    #[arg(long, default_value = "auto")]
    pub drafter: String,
    /// Decode serially (the same as --drafter none).
    #[arg(long)]
    pub no_drafts: bool,
    /// Most rows per verify window (the pending token plus drafts); each round's width is chosen from measured
    /// acceptance and measured cost up to this.
    #[arg(long, default_value_t = 8)]
    pub max_window: usize,
    /// Drafts each round verifies at least (0: a round may be a plain one-row step when drafting does not pay;
    /// 1: every round is a real window, with a one-token guess when the proposer has none).
    #[arg(long, default_value_t = 0)]
    pub min_drafts: usize,
    /// Candidate continuations context copies may offer at once, verified as one tree window (1: chains).
    #[arg(long, default_value_t = 1)]
    pub draft_branches: usize,
}

/// What the engine gets: the window bound (below 2 = serial) and the proposer, and a line describing it.
pub struct Drafting {
    pub max_window: usize,
    pub proposer: Option<ProposerFactory>,
    pub describe: String,
}

impl Drafting {
    /// No drafting: every request decodes one row per round.
    pub fn serial() -> Drafting {
        Drafting { max_window: 1, proposer: None, describe: "off (serial)".into() }
    }
}

impl DraftArgs {
    /// Resolves the options against the loaded target (a draft model is loaded onto the same backend).
    pub fn resolve(&self, target: &Session, context: usize, block_size: usize) -> Result<Drafting, String> {
        if self.no_drafts || self.drafter == "none" || self.max_window < 2 {
            return Ok(Drafting::serial());
        }
        if self.max_window > 64 {
            return Err(format!("--max-window {}: at most 64 rows", self.max_window));
        }
        if self.drafter == "auto" || self.drafter == "ngram" {
            let branches = self.draft_branches.clamp(1, 8);
            let proposer: Option<ProposerFactory> = (branches > 1)
                .then(|| Arc::new(move |_: &tf_engine::GenRequest| ngram_proposer(branches)) as ProposerFactory);
            return Ok(Drafting {
                max_window: self.max_window,
                proposer,
                describe: format!(
                    "context copies{}, windows up to {} rows",
                    if branches > 1 { format!(" (trees of up to {branches} branches)") } else { String::new() },
                    self.max_window
                ),
            });
        }
        let m = model_ref::resolve(&self.drafter).map_err(|e| format!("--drafter: {e}"))?;
        let be = target.backend.clone();
        let draft = match &m {
            ModelRef::Gguf(p) => {
                let g = GgufFile::open(p).map_err(|e| e.to_string())?;
                tf_models::load_model(be.as_ref(), &g, &g)
            }
            ModelRef::HfDir(d) => {
                let cfg = HfConfig::from_dir(d).map_err(|e| e.to_string())?;
                let st = SafetensorsModel::open_dir(d).map_err(|e| e.to_string())?;
                tf_models::load_model(be.as_ref(), &st, &cfg)
            }
        }
        .map_err(|e| format!("--drafter {}: {e}", self.drafter))?;
        if draft.vocab_size() != target.model.vocab_size() {
            return Err(format!(
                "--drafter {}: its vocabulary ({} tokens) differs from the target's ({}); a draft model must share \
                 the target's tokenizer",
                self.drafter,
                draft.vocab_size(),
                target.model.vocab_size()
            ));
        }
        let dm = DraftModel::new(be, draft, context, block_size).map_err(|e| format!("--drafter: {e}"))?;
        Ok(Drafting {
            max_window: self.max_window,
            proposer: Some(model_proposer_factory(Arc::new(Mutex::new(dm)), true)),
            describe: format!(
                "draft model {} + context copies, windows up to {} rows",
                m.path().display(),
                self.max_window
            ),
        })
    }
}
