//! Loader
