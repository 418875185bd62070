//! Recurrent state (DESIGN.md §5, hybrid families): the per-sequence state of recurrent layers (a Mamba-2 mixer's
//! convolution window and SSM state), held in numbered *registers* of a backend-owned store next to the KV cache.
//!
//! A register holds the state of every recurrent layer after some position of some sequence. Reading a register
//! never changes it: every row that advances a state writes the result to a register of its own (or keeps it only
//! for later rows of the same call), so a verify window keeps one state per row along its path, the engine commits
//! the register of the last accepted row, and a rejected row's register is simply released. Registers at block
//! boundaries can outlive their sequence in the prefix cache.

use crate::backend::Storage;

/// The shape of one register: every recurrent layer's convolution window and SSM state (f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSpec {
    /// Recurrent layers (numbered `0..layers` in the order the model calls them).
    pub layers: usize,
    /// Channels of the depthwise causal convolution (`x`, `B` and `C` of a Mamba-2 mixer).
    pub conv_dim: usize,
    /// Convolution kernel width; the window holds the last `conv_kernel - 1` inputs.
    pub conv_kernel: usize,
    /// SSM heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// SSM state size per channel (`N`).
    pub d_state: usize,
    /// B/C groups (heads `h` use group `h / (heads / groups)`).
    pub groups: usize,
    /// Registers in the store.
    pub registers: usize,
}

impl StateSpec {
    /// Floats of one layer's convolution window: `[conv_kernel - 1, conv_dim]`, oldest input first.
    pub fn conv_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim
    }

    /// Floats of one layer's SSM state: `[heads, head_dim, d_state]`.
    pub fn ssm_len(&self) -> usize {
        self.heads * self.head_dim * self.d_state
    }

    /// Bytes of one register over all layers.
    pub fn bytes_per_register(&self) -> usize {
        self.layers * (self.conv_len() + self.ssm_len()) * 4
    }

    /// The same shape with `registers` registers.
    pub fn with_registers(self, registers: usize) -> StateSpec {
        StateSpec { registers, ..self }
    }
}

/// A register store allocated by a backend ([`crate::Backend::alloc_states`]).
pub struct StateCache {
    pub spec: StateSpec,
    pub storage: Storage,
}

/// Where a row's incoming state comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSrc {
    /// The zero state: the row is position 0 of its sequence.
    Zero,
    /// A register.
    Reg(u32),
    /// The state an earlier row of the same call left (its index in the call; a chain's previous row, a tree
    /// row's parent).
    Row(usize),
}

/// One row's state input and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateIo {
    pub src: StateSrc,
    /// The register the row's outgoing state is written to, if it is kept beyond the call.
    pub dst: Option<u32>,
}

impl StateIo {
    /// Checks one call's rows: a `Row` source names an earlier row, registers are inside the store, and no
    /// register is written twice or both read and written in the call. Panics with the row on a violation.
    pub fn check(io: &[StateIo], registers: usize) {
        let mut written = std::collections::HashSet::new();
        for (r, x) in io.iter().enumerate() {
            match x.src {
                StateSrc::Row(j) => assert!(j < r, "state: row {r} reads row {j}, not an earlier row"),
                StateSrc::Reg(g) => assert!((g as usize) < registers, "state: row {r} reads register {g}"),
                StateSrc::Zero => {}
            }
            if let Some(g) = x.dst {
                assert!((g as usize) < registers, "state: row {r} writes register {g} of {registers}");
                assert!(written.insert(g), "state: register {g} written twice in one call");
            }
        }
        for (r, x) in io.iter().enumerate() {
            if let StateSrc::Reg(g) = x.src {
                assert!(!written.contains(&g), "state: row {r} reads register {g}, which the call overwrites");
            }
        }
    }

    /// For each row, whether a later row of the call reads its state.
    pub fn read_later(io: &[StateIo]) -> Vec<bool> {
        let mut later = vec![false; io.len()];
        for x in io {
            if let StateSrc::Row(j) = x.src {
                later[j] = true;
            }
        }
        later
    }
}

/// The parameters of a Mamba-2 selective scan ([`crate::Backend::ssm_scan`]); per-head vectors are host f32.
#[derive(Clone, Copy, Debug)]
pub struct SsmParams<'a> {
    /// `A_log [heads]`: the decay is `A = -exp(A_log)`.
    pub a_log: &'a [f32],
    /// `D [heads]`: the skip connection.
    pub d: &'a [f32],
    /// `dt_bias [heads]`, added before the softplus.
    pub dt_bias: &'a [f32],
    /// Lower clamp of the step after the softplus.
    pub dt_min: f32,
    /// Epsilon of the gated group RMSNorm.
    pub eps: f32,
    /// Channels per normalization group (`heads · head_dim / groups`).
    pub norm_group: usize,
}
