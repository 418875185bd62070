//! The `tensorfold` command's library side: resolving a MODEL argument to files, and the facts `info` prints.

pub mod facts;
pub mod model_ref;
