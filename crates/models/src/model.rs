//! The `Model` trait the engine drives, and the flat batch it is fed.

use tf_core::{AttnMeta, Backend, KvCache, KvSpec, QueuedIds, StateIo, StateSpec, Tensor};

/// One forward call's inputs, flattened over every row of every stream in the round (DESIGN.md §5).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Token id of each row.
    pub tokens: Vec<u32>,
    /// Absolute position of each row.
    pub positions: Vec<u32>,
    /// KV slot each row's K/V is written to.
    pub slots: Vec<u32>,
    /// What each row attends to.
    pub attn: AttnMeta,
    /// Rows whose logits are wanted, in output order.
    pub logit_rows: Vec<usize>,
    /// When set, row r's token is the queued id r of an earlier forward's argmax (its rows one for one), not
    /// `tokens[r]` (then a placeholder): the engine queues a forward before the host has its input
    /// ([`tf_core::Backend::embed_queued`]).
    pub fed: Option<QueuedIds>,
    /// For a model with recurrent state ([`Model::state_spec`]): each row's state source and destination, one per
    /// row; empty otherwise.
    pub states: Vec<StateIo>,
}

/// An error building a model: unsupported architecture, missing or mis-shaped tensor, bad config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelError(pub String);

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelError {}

/// A loaded model: weights on a backend and the graph that uses them. Row-exact because every op it calls is.
pub trait Model: Send + Sync {
    /// The family name (`llama`, `qwen2`, `qwen3`, `gemma3`).
    fn family(&self) -> &'static str;
    fn vocab_size(&self) -> usize;
    /// The context length the checkpoint was trained for.
    fn context_length(&self) -> usize;
    /// The KV cache shape for a pool of `blocks` blocks of `block_size` slots.
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec;
    /// Bytes of weights one decode step reads (a row through every layer and the output head): every weight as
    /// uploaded, except that the embedding table counts one row unless it is also the output head. With the copy
    /// bandwidth of a device, the memory-bandwidth floor of serial decode (`tensorfold bench` reports it).
    fn weight_bytes_per_token(&self) -> u64;
    /// The recurrent state of one register (a hybrid model's recurrent layers), without the register count;
    /// `None` for attention-only models. With it, every forward needs [`Batch::states`].
    fn state_spec(&self) -> Option<StateSpec> {
        None
    }
    /// Runs every row of `batch` (writing their K/V into `kv`) and returns logits `[logit_rows.len(), vocab]`.
    fn forward(&self, be: &dyn Backend, batch: &Batch, kv: &mut KvCache) -> Tensor;
}
