//! Codec benchmark (being written).
