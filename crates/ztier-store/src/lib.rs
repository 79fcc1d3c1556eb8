//! # ztier-store — the compressed page store
//!
//! Where compressed pages live:
//!
//! * [`store::Store`] — pages compressed by a `ztier-codec` codec, held
//!   under a byte budget that counts everything (data, metadata,
//!   fragmentation), in FIFO or LRU order, each with a crc32c checked on
//!   every get, clean/dirty and anonymous/file kinds with separate caps,
//!   sharded so that threads rarely meet on a lock. Its interface is the
//!   tmem API of zcache/RAMster: ephemeral and persistent pools, handles of
//!   pool + object + page index, `put`, `get` (optionally exclusive),
//!   `flush_page`, `flush_object`, `destroy_pool`, refusals with reasons.
//! * [`alloc`] — the three allocators the seeds argued about, behind one
//!   [`alloc::Allocator`] trait so they can be compared on the same pages:
//!   de Castro's cells, CCache's chunks and zsmalloc-style size classes,
//!   each with compaction that reports every move to its caller, and
//!   honest memory accounting (backing pages plus metadata).
//! * [`tier`] — where the oldest entries go when the store is full, still
//!   compressed: a spill file, memory, or (later) a remote tier.
//!
//! ```
//! use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig};
//!
//! let store = Store::new(StoreConfig::new(1 << 20));
//! let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
//! let key = Key { pool, object: 7, index: 0 };
//! let page: Vec<u8> = (0..4096u32).map(|i| (i / 64) as u8).collect();
//! store.put(key, &page, PutFlags::default()).unwrap();
//! let mut out = vec![0u8; 4096];
//! assert!(store.get(key, &mut out, true).unwrap()); // exclusive: removed
//! assert_eq!(out, page);
//! assert!(!store.get(key, &mut out, false).unwrap());
//! ```

pub mod alloc;
pub mod bench;
pub mod lock;
pub mod store;
mod sys;
pub mod tier;

pub use store::{
    Order, PageKind, PoolId, PoolKind, PoolOptions, PutFlags, Refusal, Stats, Store, StoreConfig, StoreError,
};

/// The tmem handle of a page: pool, object (e.g. an inode or a swap
/// type/region) and page index within the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Key {
    /// Pool id from [`Store::create_pool`].
    pub pool: u32,
    /// Object id within the pool.
    pub object: u64,
    /// Page index within the object.
    pub index: u32,
}
