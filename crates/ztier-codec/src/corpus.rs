//! Corpus loading (being written).
