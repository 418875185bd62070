//! Text: filled in by the text work.
