//! hub (in progress)
