//! The `tensorfold` command's library side: resolving a MODEL argument to files, the facts `info` prints, and
//! the tokenizer of a model.

pub mod bench_streams;
pub mod check;
pub mod check_suite;
pub mod drafting;
pub mod facts;
pub mod gguf_text;
pub mod model_ref;
pub mod run;
pub mod score;
pub mod serve;
pub mod session;

use model_ref::ModelRef;
use tf_loader::gguf::GgufFile;
use tf_text::Tokenizer;

/// The tokenizer of a model: from GGUF metadata, or from a directory's `tokenizer.json`.
pub fn load_tokenizer(model: &ModelRef) -> Result<Tokenizer, String> {
    match model {
        ModelRef::Gguf(path) => {
            let g = GgufFile::open(path).map_err(|e| e.to_string())?;
            gguf_text::tokenizer_from_gguf(g.metadata()).map_err(|e| format!("{}: {e}", path.display()))
        }
        ModelRef::HfDir(dir) => Tokenizer::from_hf_dir(dir).map_err(|e| format!("{}: {e}", dir.display())),
    }
}
