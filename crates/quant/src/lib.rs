//! Quant blocks: filled in by the quant work.
