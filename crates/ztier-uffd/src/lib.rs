//! # ztier-uffd — userfaultfd, the mechanism under `ztier run`
//!
//! The foundation of the issue "`ztier run`: transparent compressed memory
//! for unmodified programs": a safe wrapper of the userfaultfd API
//! ([`uffd`]) and a managed anonymous region ([`region`]) whose pages can
//! be evicted into the compressed page store and come back, on the first
//! touch, through a fault handler thread that decompresses them and
//! installs them with `UFFDIO_COPY` (`UFFDIO_ZEROPAGE` for pages that were
//! never stored). The LD_PRELOAD interposer, cold-page detection and the
//! `ztier run` command build on these; they are not written yet.

pub mod region;
pub mod uffd;
