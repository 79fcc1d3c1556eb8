//! Store behaviour: a model-based property test against a `BTreeMap`,
//! concurrency, corruption, next tiers, caps, limits, order and resizing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use ztier_codec::corpus::synth::{self, Kind};
use ztier_store::alloc::AllocatorKind;
use ztier_store::tier::{FileTier, MemoryTier, NextTier};
use ztier_store::{
    Key, Order, PageKind, PoolKind, PoolOptions, PutFlags, Refusal, Store, StoreConfig, StoreError,
};

const PAGE: usize = 4096;

fn page(kind: Kind, seed: u64) -> Vec<u8> {
    synth::page(kind, seed)
}

fn cfg(budget: usize, allocator: AllocatorKind, shards: usize) -> StoreConfig {
    StoreConfig { shards, allocator, ..StoreConfig::new(budget) }
}

#[derive(Debug, Clone)]
enum Op {
    Put { pool: usize, object: u64, index: u32, kind: usize, seed: u64, clean: bool, file: bool },
    Get { pool: usize, object: u64, index: u32, exclusive: bool },
    GetRun { pool: usize, object: u64, index: u32, n: usize, exclusive: bool },
    FlushPage { pool: usize, object: u64, index: u32 },
    FlushObject { pool: usize, object: u64 },
    Resize { budget_kb: usize },
    Compact,
    Destroy { pool: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let pool = 0..2usize;
    let object = 0..4u64;
    // Twelve indices either side of a multiple of 16: runs cross from one
    // group of the store's hash layout (and so one shard) to the next.
    let index = 8..20u32;
    prop_oneof![
        8 => (pool.clone(), object.clone(), index.clone(), 0..5usize, any::<u64>(), any::<bool>(), any::<bool>())
            .prop_map(|(pool, object, index, kind, seed, clean, file)| Op::Put { pool, object, index, kind, seed, clean, file }),
        6 => (pool.clone(), object.clone(), index.clone(), any::<bool>())
            .prop_map(|(pool, object, index, exclusive)| Op::Get { pool, object, index, exclusive }),
        3 => (pool.clone(), object.clone(), 6..20u32, 1..16usize, any::<bool>())
            .prop_map(|(pool, object, index, n, exclusive)| Op::GetRun { pool, object, index, n, exclusive }),
        1 => (pool.clone(), object.clone(), index).prop_map(|(pool, object, index)| Op::FlushPage { pool, object, index }),
        1 => (pool.clone(), object).prop_map(|(pool, object)| Op::FlushObject { pool, object }),
        1 => (16..160usize).prop_map(|budget_kb| Op::Resize { budget_kb }),
        1 => Just(Op::Compact),
        1 => pool.prop_map(|pool| Op::Destroy { pool }),
    ]
}

fn allocator() -> impl Strategy<Value = AllocatorKind> {
    prop_oneof![
        Just(AllocatorKind::Cells(1)),
        Just(AllocatorKind::Cells(2)),
        Just(AllocatorKind::Cells(4)),
        Just(AllocatorKind::Chunks),
        Just(AllocatorKind::Classes),
    ]
}

fn run_model(ops: Vec<Op>, alloc: AllocatorKind, budget_kb: usize, shards: usize, lru: bool, tier: u8) {
    // Budgets are per shard: a shard has a fixed cost (allocator tables).
    let mut c = cfg(budget_kb * 1024 * shards, alloc, shards);
    c.order = if lru { Order::Lru } else { Order::Fifo };
    let big_tier = tier == 1;
    let tier: Option<Box<dyn NextTier>> = match tier {
        0 => None,
        1 => Some(Box::new(MemoryTier::new(1 << 30))),
        _ => Some(Box::new(MemoryTier::new(20_000))),
    };
    let store = Store::with_tier(c, tier);
    let opts = [
        PoolOptions::new(PoolKind::Ephemeral),
        PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) },
    ];
    let mut ids: Vec<u32> = opts.iter().map(|o| store.create_pool(*o).unwrap()).collect();
    let mut model: BTreeMap<(usize, u64, u32), Vec<u8>> = BTreeMap::new();
    let mut out = vec![0u8; PAGE];
    let mut over_allowed = false;
    for op in ops {
        match op {
            Op::Put { pool, object, index, kind, seed, clean, file } => {
                let data = page(synth::KINDS[kind], seed);
                let flags =
                    PutFlags { dirty: !clean, kind: if file { PageKind::File } else { PageKind::Anon } };
                let key = Key { pool: ids[pool], object, index };
                match store.put(key, &data, flags) {
                    Ok(()) => {
                        model.insert((pool, object, index), data);
                    }
                    Err(StoreError::Refused(r)) => {
                        if pool == 1 {
                            assert_ne!(r, Refusal::PoorCompression, "persistent pool stores raw");
                        }
                        model.remove(&(pool, object, index));
                    }
                    Err(e) => panic!("put: {e}"),
                }
            }
            Op::Get { pool, object, index, exclusive } => {
                let key = Key { pool: ids[pool], object, index };
                let hit = store.get(key, &mut out, exclusive).expect("get");
                let want = model.get(&(pool, object, index));
                match (hit, want) {
                    (true, Some(w)) => assert!(out == *w, "wrong data for {key:?}"),
                    (true, None) => panic!("hit for {key:?}, which holds nothing"),
                    (false, Some(_)) => {
                        assert_eq!(pool, 0, "persistent page {key:?} lost");
                    }
                    (false, None) => {}
                }
                if exclusive || !hit {
                    model.remove(&(pool, object, index));
                }
            }
            Op::GetRun { pool, object, index, n, exclusive } => {
                // As n gets, up to the first miss.
                let mut run = vec![0u8; n * PAGE];
                let first = Key { pool: ids[pool], object, index };
                let found = store.get_run(first, n, &mut run, exclusive).expect("get_run");
                assert!(found <= n);
                for k in 0..found {
                    let at = (pool, object, index + k as u32);
                    let want =
                        model.get(&at).unwrap_or_else(|| panic!("hit for {at:?}, which holds nothing"));
                    assert!(run[k * PAGE..(k + 1) * PAGE] == **want, "wrong data for {at:?} in a run");
                    if exclusive {
                        model.remove(&at);
                    }
                }
                if found < n {
                    let at = (pool, object, index + found as u32);
                    if model.remove(&at).is_some() {
                        assert_eq!(pool, 0, "persistent page {at:?} lost");
                    }
                }
            }
            Op::FlushPage { pool, object, index } => {
                let key = Key { pool: ids[pool], object, index };
                let found = store.flush_page(key).unwrap();
                let had = model.remove(&(pool, object, index)).is_some();
                if pool == 1 {
                    assert_eq!(found, had);
                } else {
                    assert!(!found || had);
                }
            }
            Op::FlushObject { pool, object } => {
                let n = store.flush_object(ids[pool], object).unwrap();
                let before = model.len();
                model.retain(|k, _| !(k.0 == pool && k.1 == object));
                let had = before - model.len();
                if pool == 1 {
                    assert_eq!(n, had);
                } else {
                    assert!(n <= had);
                }
            }
            Op::Resize { budget_kb } => {
                let ok = store.set_budget(budget_kb * 1024 * store.shards());
                // Only pinned persistent pages (no next tier) can keep the
                // store above a smaller budget.
                assert!(ok || !big_tier, "shrink failed with a roomy next tier");
                over_allowed = !ok;
            }
            Op::Compact => {
                store.compact();
            }
            Op::Destroy { pool } => {
                store.destroy_pool(ids[pool]).unwrap();
                assert!(matches!(
                    store.get(Key { pool: ids[pool], object: 0, index: 0 }, &mut out, false),
                    Err(StoreError::NoSuchPool(_))
                ));
                model.retain(|k, _| k.0 != pool);
                ids[pool] = store.create_pool(opts[pool]).unwrap();
            }
        }
        // Each shard within its share (so the whole within the budget),
        // except while pinned pages hold a shard above a shrunk share.
        let shards = store.shard_memory();
        let within = shards.iter().all(|(used, share)| used <= share);
        if within {
            over_allowed = false;
        }
        assert!(over_allowed || within, "over budget: {shards:?}");
        assert!(over_allowed || store.memory_used() <= store.budget());
    }
    // Every persistent page of the model is still there, exactly.
    for ((pool, object, index), data) in &model {
        let key = Key { pool: ids[*pool], object: *object, index: *index };
        let hit = store.get(key, &mut out, false).unwrap();
        if *pool == 1 {
            assert!(hit, "persistent page {key:?} lost");
        }
        if hit {
            assert!(out == *data);
        }
    }
    let s = store.stats();
    assert_eq!(s.orig_bytes, s.pages * PAGE as u64);
    assert!(s.memory_used >= s.compressed_bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(
        ops in prop::collection::vec(op(), 1..300),
        alloc in allocator(),
        budget_kb in 24..120usize,
        shards in prop_oneof![Just(1usize), Just(4)],
        lru in any::<bool>(),
        tier in 0..3u8,
    ) {
        run_model(ops, alloc, budget_kb, shards, lru, tier);
    }
}

/// Every allocator, as the share tests run them.
const ALLOCATORS: [AllocatorKind; 5] = [
    AllocatorKind::Cells(1),
    AllocatorKind::Cells(2),
    AllocatorKind::Cells(4),
    AllocatorKind::Chunks,
    AllocatorKind::Classes,
];

/// One shard near its share, two pools (ephemeral, and persistent with no
/// next tier: pinned), 24 keys: every operation must end with the shard
/// within its share, unless a shrink was refused. (With the chunks
/// allocator, freeing and undone puts once grew the metadata: a shard
/// with only pinned entries left ended 16 to 272 bytes over.)
fn within_share(ops: &[(u8, usize, u32, usize, u64)], alloc: AllocatorKind, budget_kb: usize) {
    let store = Store::new(cfg(budget_kb << 10, alloc, 1));
    let pools = [
        store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap(),
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap(),
    ];
    let mut over_allowed = false;
    for (i, &(op, pool, index, kind, seed)) in ops.iter().enumerate() {
        let key = Key { pool: pools[pool], object: 0, index };
        match op {
            0 => match store.put(key, &page(synth::KINDS[kind], seed), PutFlags::default()) {
                Ok(()) | Err(StoreError::Refused(_)) => {}
                Err(e) => panic!("put: {e}"),
            },
            1 => {
                store.flush_page(key).unwrap();
            }
            _ => over_allowed = !store.set_budget(index as usize * 1024),
        }
        let shards = store.shard_memory();
        let within = shards.iter().all(|(used, share)| used <= share);
        over_allowed &= !within;
        assert!(over_allowed || within, "{alloc:?}: over its share after op {i} {:?}: {shards:?}", ops[i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    #[test]
    fn one_shard_stays_within_its_share(
        ops in prop::collection::vec(
            prop_oneof![
                8 => (Just(0u8), 0..2usize, 0..24u32, 0..5usize, 0..1000u64),
                2 => (Just(1u8), 0..2usize, 0..24u32, Just(0usize), Just(0u64)),
                1 => (Just(2u8), Just(0usize), 16..40u32, Just(0usize), Just(0u64)),
            ],
            1..80,
        ),
        budget_kb in 20..40usize,
    ) {
        for alloc in ALLOCATORS {
            within_share(&ops, alloc, budget_kb);
        }
    }
}

/// The shortest cases the property test above has found, on every
/// allocator.
#[test]
fn shortest_cases_found_end_within_the_share() {
    type Ops = &'static [(u8, usize, u32, usize, u64)];
    let cases: [(Ops, usize); 2] = [
        // Before the chunks allocator's metadata was counted from what it
        // stores: the last put evicted the other ephemeral page and
        // itself, and freeing grew the metadata, with only pinned pages
        // left (chunks: 18448 of 18432 bytes).
        (
            &[
                (0, 0, 0, 0, 0),
                (0, 1, 0, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 1, 1, 4, 0),
                (2, 0, 18, 0, 0),
                (0, 1, 11, 3, 0),
                (0, 1, 12, 1, 0),
                (0, 0, 1, 1, 0),
                (0, 1, 2, 4, 0),
                (0, 1, 3, 4, 0),
                (0, 0, 2, 1, 83),
            ],
            20,
        ),
        // Found in CI, before cells and classes charged their lists of
        // released slots at a fixed bound: after a shrink, a put over a
        // pinned page released a slab, and the list of released slabs
        // doubled (classes: 21514 of 21504 bytes).
        (
            &[
                (0, 0, 2, 2, 819),
                (0, 0, 3, 4, 626),
                (0, 1, 0, 2, 134),
                (0, 1, 21, 2, 608),
                (0, 1, 1, 4, 114),
                (0, 1, 2, 4, 36),
                (0, 0, 0, 0, 0),
                (2, 0, 21, 0, 0),
                (0, 1, 21, 0, 0),
            ],
            26,
        ),
    ];
    for (ops, budget_kb) in cases {
        for alloc in ALLOCATORS {
            within_share(ops, alloc, budget_kb);
        }
    }
}

#[test]
fn corrupt_byte_is_a_checksum_error_and_loses_nothing() {
    for alloc in [AllocatorKind::Cells(2), AllocatorKind::Chunks, AllocatorKind::Classes] {
        let store = Store::new(cfg(1 << 20, alloc, 2));
        let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
        let key = Key { pool, object: 1, index: 2 };
        let data = page(Kind::Text, 9);
        store.put(key, &data, PutFlags::default()).unwrap();
        assert!(store.corrupt(key, 17));
        let mut out = vec![0u8; PAGE];
        for exclusive in [false, true] {
            match store.get(key, &mut out, exclusive) {
                Err(StoreError::Checksum { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{alloc:?}: expected a checksum error, got {other:?}"),
            }
        }
        assert!(store.contains(key), "a failed exclusive get must keep the entry");
        assert_eq!(store.stats().checksum_errors, 2);
        // Flipping the same byte back restores it.
        assert!(store.corrupt(key, 17));
        assert!(store.get(key, &mut out, true).unwrap());
        assert_eq!(out, data);
    }
}

fn spill_all_and_read_back(tier: Box<dyn NextTier>) {
    let store = Store::with_tier(cfg(256 << 10, AllocatorKind::Classes, 2), Some(tier));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let n = 200u32;
    let data = |i: u32| page(synth::KINDS[i as usize % 5], i as u64);
    for i in 0..n {
        if let Err(e) = store.put(Key { pool, object: 0, index: i }, &data(i), PutFlags::default()) {
            panic!("put {i}: {e}: {:#?}", store.stats());
        }
        assert!(store.memory_used() <= store.budget());
    }
    let s = store.stats();
    assert!(s.evicted_to_tier > 0, "{s:?}");
    assert_eq!(s.evicted_dropped, 0);
    assert_eq!(s.pages + s.tier_entries, n as u64);
    let mut out = vec![0u8; PAGE];
    let in_tier: Vec<u32> = (0..n).filter(|&i| !store.contains(Key { pool, object: 0, index: i })).collect();
    assert_eq!(in_tier.len() as u64, s.tier_entries);
    for i in 0..n {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, false).unwrap(), "page {i}");
        assert_eq!(out, data(i), "page {i}");
        // A get that keeps the copy leaves it where it was: in RAM, or in
        // the tier, where only `holds` sees it.
        let key = Key { pool, object: 0, index: i };
        assert_eq!(store.contains(key), !in_tier.contains(&i), "page {i}");
        assert!(store.holds(key), "page {i}");
    }
    assert!(store.stats().tier_hits > 0);
    // Exclusive gets empty both levels.
    for i in 0..n {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, true).unwrap());
        assert!(!store.holds(Key { pool, object: 0, index: i }), "page {i}");
    }
    let s = store.stats();
    assert_eq!((s.pages, s.tier_entries, s.tier_bytes), (0, 0, 0));
}

#[test]
fn persistent_pages_spill_to_memory_tier_compressed() {
    spill_all_and_read_back(Box::new(MemoryTier::new(1 << 30)));
}

#[test]
fn persistent_pages_spill_to_file_tier_compressed() {
    let dir = std::env::temp_dir().join(format!("ztier-store-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    spill_all_and_read_back(Box::new(FileTier::create(&dir.join("spill"), 1 << 30).unwrap()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Puts 100 text pages into `pool`: the indices stored, and how many
/// were refused for want of room.
fn put_text_pages(store: &Store, pool: u32) -> (Vec<u32>, u64) {
    let mut ok = Vec::new();
    let mut refused = 0;
    for i in 0..100u32 {
        let key = Key { pool, object: 0, index: i };
        match store.put(key, &page(Kind::Text, i as u64), PutFlags::default()) {
            Ok(()) => ok.push(i),
            Err(StoreError::Refused(Refusal::Budget)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    (ok, refused)
}

#[test]
fn persistent_pool_without_tier_refuses_instead_of_losing() {
    let store = Store::new(cfg(48 << 10, AllocatorKind::Chunks, 1));
    let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    let (ok, refused) = put_text_pages(&store, pool);
    assert!(refused > 0 && !ok.is_empty());
    assert_eq!(store.stats().rejects.budget, refused);
    let mut out = vec![0u8; PAGE];
    for i in ok {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, false).unwrap());
        assert_eq!(out, page(Kind::Text, i as u64));
    }
}

/// A spill device that is full (`/dev/full`: every write fails with
/// `ENOSPC`): persistent pages the store cannot spill stay where they
/// are, the put that needs room is refused, nothing is lost, and the
/// store says why.
#[test]
fn a_full_spill_device_refuses_puts_and_loses_nothing() {
    let tier = FileTier::create(Path::new("/dev/full"), 1 << 30).unwrap();
    let store = Store::with_tier(cfg(48 << 10, AllocatorKind::Chunks, 1), Some(Box::new(tier)));
    assert_eq!(store.tier_error(), None);
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let (ok, refused) = put_text_pages(&store, pool);
    assert!(refused > 0 && !ok.is_empty(), "{refused} refused, {} stored", ok.len());
    let s = store.stats();
    assert!(s.tier_errors > 0 && s.tier_entries == 0 && s.evicted_dropped == 0, "{s:?}");
    let why = store.tier_error().expect("the failure is kept");
    assert!(why.contains("No space left on device"), "{why}");
    let mut out = vec![0u8; PAGE];
    for i in ok {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, true).unwrap(), "page {i}");
        assert_eq!(out, page(Kind::Text, i as u64), "page {i}");
    }
}

/// A store with a next tier whose share was set below what its tables
/// take (as `ztier run`'s bound on the stores under `--budget-covers all`
/// can, when the pages held leave them no room) refuses no page for its
/// budget: with nothing older left to push out, the page goes to the
/// tier itself, and reads back. (It refused every put instead, and the
/// program's pages stayed resident past its budget.)
#[test]
fn a_store_with_a_tier_puts_to_it_when_its_share_is_below_its_tables() {
    for alloc in ALLOCATORS {
        for share in [0, 1 << 10, 4 << 10] {
            let store = Store::with_tier(cfg(1 << 20, alloc, 1), Some(Box::new(MemoryTier::new(1 << 30))));
            let pool = store
                .create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) })
                .unwrap();
            let kinds = [Kind::SmallInts, Kind::Pointers, Kind::Text, Kind::Random];
            let put = |i: u32| {
                let key = Key { pool, object: 0, index: i };
                store.put(key, &page(kinds[i as usize % 4], i as u64), PutFlags::default())
            };
            for i in 0..200 {
                put(i).unwrap();
            }
            store.set_budget(share);
            for i in 200..300 {
                put(i).unwrap_or_else(|e| panic!("{alloc:?}, share {share}: page {i}: {e}"));
            }
            let s = store.stats();
            assert_eq!(s.rejects.budget, 0, "{alloc:?}, share {share}: {s:?}");
            assert!(s.put_to_tier > 0, "{alloc:?}, share {share}: {s:?}");
            let mut out = vec![0u8; PAGE];
            for i in 0..300u32 {
                let key = Key { pool, object: 0, index: i };
                assert!(store.get(key, &mut out, true).unwrap(), "{alloc:?}, share {share}: page {i} lost");
                assert!(out == page(kinds[i as usize % 4], i as u64), "{alloc:?}, share {share}: page {i}");
            }
        }
    }
}

#[test]
fn refusal_reasons_poor_compression_and_pool_limit() {
    let store = Store::new(cfg(1 << 20, AllocatorKind::Classes, 2));
    let eph = store
        .create_pool(PoolOptions { max_pages: Some(3), ..PoolOptions::new(PoolKind::Ephemeral) })
        .unwrap();
    let raw =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let random = page(Kind::Random, 1);
    let k = |pool, index| Key { pool, object: 0, index };
    assert!(matches!(
        store.put(k(eph, 0), &random, PutFlags::default()),
        Err(StoreError::Refused(Refusal::PoorCompression))
    ));
    store.put(k(raw, 0), &random, PutFlags::default()).unwrap();
    for i in 0..3 {
        store.put(k(eph, i), &page(Kind::Pointers, i as u64), PutFlags::default()).unwrap();
    }
    assert!(matches!(
        store.put(k(eph, 3), &page(Kind::Pointers, 3), PutFlags::default()),
        Err(StoreError::Refused(Refusal::PoolLimit))
    ));
    // Replacing a page of a full pool is allowed.
    store.put(k(eph, 2), &page(Kind::SmallInts, 5), PutFlags::default()).unwrap();
    store.put(k(eph, 5), &vec![0u8; PAGE], PutFlags::default()).unwrap_err();
    let s = store.stats();
    assert_eq!(s.rejects.poor_compression, 1);
    assert_eq!(s.rejects.pool_limit, 2);
    assert_eq!(s.raw_pages, 1);
    assert_eq!(s.pools.iter().find(|p| p.id == eph).unwrap().pages, 3);
    let mut out = vec![0u8; PAGE];
    assert!(store.get(k(raw, 0), &mut out, false).unwrap());
    assert_eq!(out, random);
    assert!(matches!(store.put(k(99, 0), &random, PutFlags::default()), Err(StoreError::NoSuchPool(99))));
    assert!(matches!(
        store.put(k(eph, 0), &random[..100], PutFlags::default()),
        Err(StoreError::PageSize(100))
    ));
}

#[test]
fn zero_and_same_filled_pages_cost_metadata_only() {
    let store = Store::new(cfg(1 << 20, AllocatorKind::Classes, 1));
    let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    let empty = store.memory_used();
    let same: Vec<u8> = std::iter::repeat_n(0xdead_beef_0102_0304u64.to_le_bytes(), 512).flatten().collect();
    for i in 0..100 {
        let p = if i % 2 == 0 { vec![0u8; PAGE] } else { same.clone() };
        store.put(Key { pool, object: 0, index: i }, &p, PutFlags::default()).unwrap();
    }
    let s = store.stats();
    assert_eq!((s.zero_pages, s.same_pages, s.compressed_bytes), (50, 50, 0));
    assert!(s.memory_used as usize - empty < 100 * 80, "metadata only: {} (empty {empty})", s.memory_used);
    let mut out = vec![1u8; PAGE];
    assert!(store.get(Key { pool, object: 0, index: 3 }, &mut out, false).unwrap());
    assert_eq!(out, same);
    assert!(store.get(Key { pool, object: 0, index: 4 }, &mut out, false).unwrap());
    assert_eq!(out, vec![0u8; PAGE]);
}

#[test]
fn kind_caps_are_separate() {
    let mut c = cfg(4 << 20, AllocatorKind::Classes, 1);
    c.anon_cap = Some(20_000);
    let store = Store::new(c);
    let pool = store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap();
    let file = PutFlags { dirty: false, kind: PageKind::File };
    for i in 0..200u32 {
        store
            .put(Key { pool, object: 1, index: i }, &page(Kind::Text, i as u64), PutFlags::default())
            .unwrap();
        store.put(Key { pool, object: 2, index: i }, &page(Kind::Text, i as u64), file).unwrap();
    }
    let s = store.stats();
    assert_eq!(s.file_pages, 200, "file pages are not limited by the anon cap");
    assert!(s.anon_pages < 200 && s.anon_pages > 0, "{s:?}");
    assert!(s.evicted_dropped >= 200 - s.anon_pages);
    // The newest anon pages are the ones kept (FIFO).
    let mut out = vec![0u8; PAGE];
    assert!(store.get(Key { pool, object: 1, index: 199 }, &mut out, false).unwrap());
    assert!(!store.get(Key { pool, object: 1, index: 0 }, &mut out, false).unwrap());
}

fn survivors(order: Order) -> (bool, bool) {
    let mut c = cfg(96 << 10, AllocatorKind::Classes, 1);
    c.order = order;
    let store = Store::new(c);
    let pool = store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap();
    let k = |i| Key { pool, object: 0, index: i };
    let mut out = vec![0u8; PAGE];
    let mut i = 0;
    store.put(k(0), &page(Kind::Pointers, 0), PutFlags::default()).unwrap();
    store.put(k(1), &page(Kind::Pointers, 1), PutFlags::default()).unwrap();
    // Keep touching page 0 while filling past the budget until page 1 goes.
    while store.contains(k(1)) {
        i += 1;
        assert!(store.get(k(0), &mut out, false).unwrap() || order == Order::Fifo);
        store.put(k(1 + i), &page(Kind::Pointers, 1 + i as u64), PutFlags::default()).unwrap();
        assert!(i < 1000);
    }
    (store.contains(k(0)), store.stats().evicted_dropped > 0)
}

#[test]
fn fifo_evicts_in_put_order_lru_keeps_touched_pages() {
    assert_eq!(survivors(Order::Fifo), (false, true));
    assert_eq!(survivors(Order::Lru), (true, true));
}

#[test]
fn clean_ephemeral_pages_are_dropped_dirty_ones_spilled() {
    let store =
        Store::with_tier(cfg(64 << 10, AllocatorKind::Classes, 1), Some(Box::new(MemoryTier::new(1 << 30))));
    let pool = store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap();
    for i in 0..100u32 {
        let flags = PutFlags { dirty: i % 2 == 0, kind: PageKind::File };
        store.put(Key { pool, object: 0, index: i }, &page(Kind::Text, i as u64), flags).unwrap();
    }
    let s = store.stats();
    assert!(s.evicted_to_tier > 0 && s.evicted_dropped > 0, "{s:?}");
    let mut out = vec![0u8; PAGE];
    for i in (0..100u32).step_by(2) {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, false).unwrap(), "dirty page {i}");
        assert_eq!(out, page(Kind::Text, i as u64));
    }
}

#[test]
fn shrinking_compacts_then_evicts_and_growing_takes_more() {
    for alloc in [AllocatorKind::Cells(2), AllocatorKind::Chunks, AllocatorKind::Classes] {
        let store = Store::new(cfg(2 << 20, alloc, 2));
        let pool = store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap();
        for i in 0..800u32 {
            store
                .put(
                    Key { pool, object: 0, index: i },
                    &page(
                        [Kind::SmallInts, Kind::Pointers, Kind::Text, Kind::Sparse][i as usize % 4],
                        i as u64,
                    ),
                    PutFlags::default(),
                )
                .unwrap();
        }
        // Punch holes so that compaction has work.
        for i in (0..800u32).step_by(3) {
            store.flush_page(Key { pool, object: 0, index: i }).unwrap();
        }
        let before = store.stats();
        assert!(store.set_budget(before.memory_used as usize / 2));
        let after = store.stats();
        assert!(after.memory_used <= before.memory_used / 2, "{alloc:?}");
        assert!(after.compactions > before.compactions, "{alloc:?}: shrinking compacts first");
        assert!(after.evicted_dropped > 0);
        assert!(store.set_budget(8 << 20));
        let pages = after.pages;
        for i in 800..1600u32 {
            store
                .put(Key { pool, object: 0, index: i }, &page(Kind::Pointers, i as u64), PutFlags::default())
                .unwrap();
        }
        assert!(store.stats().pages > pages + 700, "{alloc:?}: grown budget used");
    }
}

#[test]
fn destroy_pool_removes_everything_and_ids_are_reused_safely() {
    let store =
        Store::with_tier(cfg(40 << 10, AllocatorKind::Chunks, 2), Some(Box::new(MemoryTier::new(1 << 30))));
    let a = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    for i in 0..60u32 {
        store
            .put(
                Key { pool: a, object: i as u64 % 3, index: i },
                &page(Kind::Text, i as u64),
                PutFlags::default(),
            )
            .unwrap();
    }
    assert_eq!(store.flush_object(a, 1).unwrap(), 20);
    assert_eq!(store.destroy_pool(a).unwrap(), 40);
    let s = store.stats();
    assert_eq!((s.pages, s.tier_entries), (0, 0));
    let b = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    assert_eq!(a, b, "ids are reused");
    let mut out = vec![0u8; PAGE];
    assert!(!store.get(Key { pool: b, object: 0, index: 0 }, &mut out, false).unwrap());
    assert!(matches!(store.destroy_pool(77), Err(StoreError::NoSuchPool(77))));
}

#[test]
fn concurrent_threads_never_see_wrong_or_torn_pages() {
    let store = Arc::new(Store::with_tier(
        cfg(512 << 10, AllocatorKind::Classes, 8),
        Some(Box::new(MemoryTier::new(1 << 30))),
    ));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let shared = store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap();
    // Page content names its key and version, so a get can check it.
    fn content(obj: u64, idx: u32, ver: u64) -> Vec<u8> {
        let mut p = synth::page(synth::KINDS[(ver % 4) as usize], obj * 1000 + idx as u64 + ver);
        p[..8].copy_from_slice(&obj.to_le_bytes());
        p[8..12].copy_from_slice(&idx.to_le_bytes());
        p[16..24].copy_from_slice(&ver.to_le_bytes());
        p
    }
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut versions = vec![0u64; 64];
                let mut out = vec![0u8; PAGE];
                let mut x = t + 1;
                for step in 0..6000u64 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let idx = (x >> 33) as u32 % 64;
                    let own = Key { pool, object: t, index: idx };
                    match (x >> 20) % 4 {
                        0 | 1 => {
                            versions[idx as usize] += 1;
                            store
                                .put(own, &content(t, idx, versions[idx as usize]), PutFlags::default())
                                .unwrap();
                        }
                        2 => {
                            let hit = store.get(own, &mut out, false).unwrap();
                            assert_eq!(hit, versions[idx as usize] > 0);
                            if hit {
                                assert_eq!(out, content(t, idx, versions[idx as usize]));
                            }
                        }
                        _ => {
                            // Everyone writes and reads the same shared keys.
                            let key = Key { pool: shared, object: 99, index: idx % 8 };
                            if step % 2 == 0 {
                                let _ = store.put(key, &content(99, idx % 8, step), PutFlags::default());
                            } else if store.get(key, &mut out, false).unwrap() {
                                let ver = u64::from_le_bytes(out[16..24].try_into().unwrap());
                                assert_eq!(out, content(99, idx % 8, ver), "torn page");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(store.memory_used() <= store.budget());
    let s = store.stats();
    assert!(s.evicted_to_tier > 0, "the test must exercise eviction: {s:?}");
}

#[test]
fn destroying_pools_while_threads_put_leaves_nothing_behind() {
    let store = Arc::new(Store::new(cfg(4 << 20, AllocatorKind::Chunks, 4)));
    let keep = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Pool ids 1..4 come and go; puts to a dead pool fail cleanly.
                    let pool = 1 + (i % 3);
                    match store.put(
                        Key { pool, object: t, index: i % 64 },
                        &page(Kind::Pointers, i as u64),
                        PutFlags::default(),
                    ) {
                        Ok(()) | Err(StoreError::NoSuchPool(_)) | Err(StoreError::Refused(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                    store
                        .put(
                            Key { pool: keep, object: t, index: i % 16 },
                            &page(Kind::Text, i as u64),
                            PutFlags::default(),
                        )
                        .unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    for round in 0..600 {
        let mut made = Vec::new();
        for _ in 0..3 {
            made.push(store.create_pool(PoolOptions::new(PoolKind::Ephemeral)).unwrap());
        }
        std::thread::yield_now();
        for p in made {
            store.destroy_pool(p).unwrap();
        }
        if round % 50 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    // Only the kept pool holds pages, and the counts agree.
    let s = store.stats();
    assert_eq!(s.pools.len(), 1);
    assert_eq!(s.pools[0].pages, s.pages, "{s:?}");
    assert_eq!(
        store.flush_object(keep, 0).unwrap()
            + store.flush_object(keep, 1).unwrap()
            + store.flush_object(keep, 2).unwrap(),
        s.pages as usize
    );
    assert_eq!(store.stats().pages, 0);
}

/// A store across `fork`: [`Store::lock_for_fork`] holds every shard
/// (a get on another thread waits for [`Store::unlock_after_fork`]), and,
/// with no thread waiting,
/// a forked child reads its copy of every page, spilled ones from a tier
/// made its own, while the parent changes and removes its pages.
#[test]
fn a_forked_child_reads_its_copy_of_the_store() {
    let store = Arc::new(Store::with_tier(
        cfg(256 << 10, AllocatorKind::Classes, 2),
        Some(Box::new(MemoryTier::new(1 << 30))),
    ));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let n = 200u32;
    let key = move |i| Key { pool, object: 0, index: i };
    let data = |i: u32| page(synth::KINDS[i as usize % 5], i as u64);
    for i in 0..n {
        store.put(key(i), &data(i), PutFlags::default()).unwrap();
    }
    assert!(store.tier_entries() > 0);
    store.lock_for_fork();
    let got = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, got) = (store.clone(), got.clone());
        std::thread::spawn(move || {
            let mut out = vec![0u8; PAGE];
            assert!(store.get(key(0), &mut out, false).unwrap());
            got.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!got.load(std::sync::atomic::Ordering::Acquire), "a get went through a held lock");
    // SAFETY: this thread took the locks.
    unsafe { store.unlock_after_fork() };
    reader.join().unwrap();
    assert!(got.load(std::sync::atomic::Ordering::Acquire));
    // No thread waits for the store now, as `lock_for_fork` requires.
    store.lock_for_fork();
    // SAFETY: fork; the child only reads the store and leaves by _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: this thread took the locks before the fork.
        unsafe { store.unlock_after_fork() };
        let mut out = vec![0u8; PAGE];
        let ok = store.after_fork().is_ok()
            && (0..n).all(|i| store.get(key(i), &mut out, true).unwrap_or(false) && out == data(i));
        // SAFETY: leaving the child without running the parent's exit.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0);
    // SAFETY: this thread took the locks.
    unsafe { store.unlock_after_fork() };
    // The parent's changes are its own.
    for i in 0..n / 2 {
        store.flush_page(key(i)).unwrap();
        store.put(key(i), &page(Kind::Text, 1000 + i as u64), PutFlags::default()).unwrap();
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    let mut out = vec![0u8; PAGE];
    for i in 0..n {
        assert!(store.get(key(i), &mut out, false).unwrap());
        assert_eq!(out, if i < n / 2 { page(Kind::Text, 1000 + i as u64) } else { data(i) }, "page {i}");
    }
}

/// A memory tier the test can look into while the store uses it.
struct Shared(Arc<MemoryTier>);

impl NextTier for Shared {
    fn name(&self) -> String {
        self.0.name()
    }
    fn put(
        &self,
        key: Key,
        meta: ztier_store::tier::SpillMeta,
        data: &[u8],
    ) -> Result<(), ztier_store::tier::TierError> {
        self.0.put(key, meta, data)
    }
    fn get(
        &self,
        key: Key,
        out: &mut Vec<u8>,
        remove: bool,
    ) -> Result<Option<ztier_store::tier::SpillMeta>, ztier_store::tier::TierError> {
        self.0.get(key, out, remove)
    }
    fn remove(&self, key: Key) -> bool {
        self.0.remove(key)
    }
    fn remove_object(&self, pool: u32, object: u64) -> usize {
        self.0.remove_object(pool, object)
    }
    fn remove_pool(&self, pool: u32) -> usize {
        self.0.remove_pool(pool)
    }
    fn entries(&self) -> usize {
        self.0.entries()
    }
    fn bytes_used(&self) -> u64 {
        self.0.bytes_used()
    }
}

#[test]
fn hybrid_pages_are_tagged_with_their_inner_codec_and_trailer_pages_still_read() {
    use ztier_codec::{new_codec, CodecId};
    let tier = Arc::new(MemoryTier::new(1 << 30));
    let store = Store::with_tier(
        StoreConfig { codec: CodecId::Hybrid, ..cfg(64 << 10, AllocatorKind::Classes, 1) },
        Some(Box::new(Shared(tier.clone()))),
    );
    let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    let n = 120u32;
    // Text goes to LZ4, small integers to WKdm.
    let data = |i: u32| page(if i % 2 == 0 { Kind::Text } else { Kind::SmallInts }, i as u64);
    for i in 0..n {
        store.put(Key { pool, object: 0, index: i }, &data(i), PutFlags::default()).unwrap();
    }
    // What the store spilled is exactly as it held it: look at the tags.
    let (mut lz4, mut wkdm) = (0, 0);
    let mut buf = Vec::new();
    let mut lz = new_codec(CodecId::Lz4);
    let mut alone = vec![0u8; 8192];
    for i in 0..n {
        let key = Key { pool, object: 0, index: i };
        let Some(meta) = tier.get(key, &mut buf, false).unwrap() else { continue };
        assert_ne!(meta.tag, CodecId::Hybrid as u8, "page {i}: stored with a trailer");
        if meta.tag == CodecId::Lz4 as u8 {
            lz4 += 1;
            // The bare LZ4 payload: the size LZ4 alone gives, not one byte more.
            let m = lz.compress(&data(i), &mut alone).unwrap();
            assert_eq!(buf.len(), m, "page {i}");
        } else if meta.tag == CodecId::Wkdm as u8 {
            wkdm += 1;
        }
    }
    assert!(lz4 > 0 && wkdm > 0, "spilled lz4 {lz4}, wkdm {wkdm}");
    let mut out = vec![0u8; PAGE];
    for i in 0..n {
        assert!(store.get(Key { pool, object: 0, index: i }, &mut out, false).unwrap(), "page {i}");
        assert_eq!(out, data(i), "page {i}");
    }
    // An entry in the older form (tag hybrid, a trailer naming the inner
    // codec) still reads; a tag no codec has is a decode error.
    let mut h = new_codec(CodecId::Hybrid);
    let mut old = vec![0u8; h.max_compressed_len(PAGE)];
    for (index, kind) in [(1000, Kind::Text), (1001, Kind::SmallInts)] {
        let p = page(kind, 7);
        let len = h.compress(&p, &mut old).unwrap();
        let meta = ztier_store::tier::SpillMeta {
            tag: CodecId::Hybrid as u8,
            flags: 0,
            len: len as u16,
            crc: crc32c::crc32c(&old[..len]),
            pattern: 0,
        };
        let key = Key { pool, object: 0, index };
        tier.put(key, meta, &old[..len]).unwrap();
        assert!(store.get(key, &mut out, false).unwrap());
        assert_eq!(out, p);
        let bad = ztier_store::tier::SpillMeta { tag: 200, ..meta };
        tier.put(key, bad, &old[..len]).unwrap();
        match store.get(key, &mut out, false) {
            Err(StoreError::Decode { key: k, .. }) => assert_eq!(k, key),
            other => panic!("expected a decode error, got {other:?}"),
        }
    }
}
