//! The RAM cache (cleancache, Magenheimer 2012): clean blocks of the
//! backing — read from it, or read from the SSD cache, or just written
//! through to it — kept compressed in an *ephemeral* pool of the page
//! store. Nothing is ever only here: every block in it is also on the
//! backing, so the store may drop any of it at any time (its budget
//! shrinks when the machine needs memory: the pressure watch in `pressure.rs` sets it).

use std::sync::atomic::{AtomicU64, Ordering};

use ztier_codec::CodecId;
use ztier_store::{
    Key, Order, PageKind, PoolId, PoolKind, PoolOptions, PutFlags, Store, StoreConfig, StoreError,
};

/// The RAM cache.
pub struct RamCache {
    store: Store,
    pool: PoolId,
    configured: u64,
    errors: AtomicU64,
}

/// RAM cache statistics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RamStats {
    /// Size asked for (`--ram-cache`).
    pub configured_bytes: u64,
    /// Budget now (smaller while the machine needs memory).
    pub budget_bytes: u64,
    /// Memory the store uses (data, metadata, fragmentation).
    pub memory_used: u64,
    /// Blocks held.
    pub blocks: u64,
    /// Their uncompressed bytes / the memory they take.
    pub effective_ratio: f64,
    /// Of `memory_used`, metadata.
    pub metadata_bytes: u64,
    /// Blocks dropped to stay within the budget.
    pub evicted: u64,
    /// Gets that failed their checksum (dropped, read elsewhere).
    pub errors: u64,
}

impl RamCache {
    /// A RAM cache of `bytes` (everything counted) compressing with `codec`.
    pub fn new(bytes: u64, codec: CodecId) -> Result<RamCache, StoreError> {
        let mut cfg = StoreConfig::new(bytes as usize);
        cfg.codec = codec;
        cfg.order = Order::Lru;
        let store = Store::new(cfg);
        let pool =
            store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Ephemeral) })?;
        Ok(RamCache { store, pool, configured: bytes, errors: AtomicU64::new(0) })
    }

    fn key(&self, lba: u64) -> Key {
        Key { pool: self.pool, object: lba >> 16, index: (lba & 0xffff) as u32 }
    }

    /// Copies block `lba` into `out` if held.
    pub fn get(&self, lba: u64, out: &mut [u8]) -> bool {
        match self.store.get(self.key(lba), out, false) {
            Ok(hit) => hit,
            Err(_) => {
                // Damaged: drop it; the block is read from elsewhere.
                self.errors.fetch_add(1, Ordering::Relaxed);
                let _ = self.store.flush_page(self.key(lba));
                false
            }
        }
    }

    /// Keeps block `lba` (clean). Refusals (budget, pool) just leave it out.
    pub fn put(&self, lba: u64, data: &[u8]) -> bool {
        self.store.put(self.key(lba), data, PutFlags { dirty: false, kind: PageKind::File }).is_ok()
    }

    /// Forgets block `lba`.
    pub fn remove(&self, lba: u64) {
        let _ = self.store.flush_page(self.key(lba));
    }

    /// Size asked for.
    pub fn configured(&self) -> u64 {
        self.configured
    }

    /// Current budget.
    pub fn budget(&self) -> u64 {
        self.store.budget() as u64
    }

    /// Changes the budget (shrinking drops the oldest blocks at once).
    pub fn set_budget(&self, bytes: u64) {
        self.store.set_budget(bytes as usize);
    }

    /// Statistics.
    pub fn stats(&self) -> RamStats {
        let s = self.store.stats();
        RamStats {
            configured_bytes: self.configured,
            budget_bytes: s.budget,
            memory_used: s.memory_used,
            blocks: s.pages,
            effective_ratio: s.effective_ratio(),
            metadata_bytes: s.metadata_bytes,
            evicted: s.evicted_dropped,
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}
