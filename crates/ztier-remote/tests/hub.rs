//! Tiers sharing one flusher ([`ztier_remote::Hub`]) against real
//! `redis-server` processes on loopback ports: each tier's pages come
//! back (its own names, its own MAC key), on the hub's few connections; with a
//! replica, every page is acknowledged by WAIT, and once the replica is
//! gone no page counts as written remotely: each tier's go to its own
//! fallback, none lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_remote::testbed::{Options, Testbed};
use ztier_remote::{Durability, Hub, RemoteConfig, RemoteTier};
use ztier_store::tier::{FileTier, NextTier, SpillMeta};
use ztier_store::Key;

const TIERS: u32 = 8;
// More tiers than the hub's connections: a connection per tier fails.
const _: () = assert!(ztier_remote::hub::LINKS < TIERS as usize);
const PAGES: u32 = 200;

fn config(bed: &Testbed, durability: Durability) -> RemoteConfig {
    let mut c = RemoteConfig::parse(&bed.url()).unwrap();
    c.durability = durability;
    c.batch_pages = 16;
    c.batches_per_round = 2;
    c
}

fn meta() -> SpillMeta {
    SpillMeta { tag: 1, flags: 0, len: 1000, crc: 9, pattern: 0 }
}

/// Tier `t`'s page `i`: the same keys in every tier, different bytes.
fn data(t: u32, i: u32) -> Vec<u8> {
    (0..1000u32).map(|j| (t * 31 + i * 7 + j) as u8).collect()
}

fn key(i: u32) -> Key {
    Key { pool: 1, object: 0, index: i }
}

/// Each tier puts its pages from a thread of its own, then flushes.
fn put_from_threads(tiers: &[Arc<RemoteTier>]) {
    let hs: Vec<_> = tiers
        .iter()
        .enumerate()
        .map(|(t, tier)| {
            let tier = tier.clone();
            std::thread::spawn(move || {
                for i in 0..PAGES {
                    tier.put(key(i), meta(), &data(t as u32, i)).unwrap();
                }
                tier.flush();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn connected_clients(bed: &Testbed, port: u16) -> u64 {
    let info = bed.cli(port, &["INFO", "clients"]).unwrap();
    info.lines().find_map(|l| l.trim().strip_prefix("connected_clients:")).unwrap().parse().unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Eight tiers on one hub: every page written and read back right from
/// its own tier; the hub's few connections write for all (the server
/// sees them and the redis-cli asking, no flusher per tier); each tier's names carry
/// its own writer; a tier's value under another tier's name is refused
/// (MAC); dropped tiers leave the hub.
#[test]
fn tiers_on_one_hub_keep_their_own_pages_and_keys() {
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let hub = Hub::new().unwrap();
    let tiers: Vec<Arc<RemoteTier>> = (0..TIERS)
        .map(|_| Arc::new(RemoteTier::connect_shared(config(&bed, Durability::None), None, &hub).unwrap()))
        .collect();
    assert!(tiers.iter().all(|t| t.shares_flusher()));
    assert_eq!(hub.tiers(), TIERS as usize);
    put_from_threads(&tiers);
    for t in &tiers {
        let s = t.stats();
        assert_eq!((s.remote_puts, s.fallback_puts, s.errors), (PAGES as u64, 0, 0), "{s:?}");
        assert_eq!(t.pending(), (0, 0));
    }
    // No gets yet: the hub's connections (at most LINKS) and
    // redis-cli's own.
    let clients = connected_clients(&bed, port);
    assert!((2..=1 + ztier_remote::hub::LINKS as u64).contains(&clients), "{clients} connections");
    assert_eq!(bed.dbsize(port).unwrap(), (TIERS * PAGES) as u64);
    let mut out = Vec::new();
    for (t, tier) in tiers.iter().enumerate() {
        for i in 0..PAGES {
            assert_eq!(tier.get(key(i), &mut out, false).unwrap(), Some(meta()));
            assert!(out == data(t as u32, i), "tier {t} page {i}");
        }
    }
    // zt:RUN:WRITER:{TAG}:ID, a writer of its own per tier.
    let writer = |t: &RemoteTier| {
        let n = String::from_utf8(t.value_name(key(0)).unwrap()).unwrap();
        n.split(':').nth(2).unwrap().to_string()
    };
    let mut writers: Vec<String> = tiers.iter().map(|t| writer(t)).collect();
    writers.sort();
    writers.dedup();
    assert_eq!(writers.len(), TIERS as usize);
    let name = |t: &RemoteTier| String::from_utf8(t.value_name(key(5)).unwrap()).unwrap();
    bed.cli(port, &["COPY", &name(&tiers[1]), &name(&tiers[0]), "REPLACE"]).unwrap();
    let e = tiers[0].get(key(5), &mut out, false).unwrap_err().to_string();
    assert!(e.contains("MAC mismatch"), "{e}");
    // Removes go through the hub too.
    for t in &tiers[1..] {
        for i in 0..PAGES {
            assert!(t.remove(key(i)));
        }
        t.flush();
    }
    wait_until("the deletes reach the server", || bed.dbsize(port).unwrap() == PAGES as u64);
    drop(tiers);
    wait_until("dropped tiers leave the hub", || hub.tiers() == 0);
}

/// Durability `replica+local` on one hub: pages count as written only
/// once WAIT says a replica has them. With the replica killed, WAIT
/// times out: each tier's pages land in its own fallback, every page
/// comes back right.
#[test]
fn a_hub_waits_for_the_replica_and_falls_back_without_it() {
    let master = Testbed::single(&Options::default()).unwrap();
    let mut replica = Testbed::single(&Options::default()).unwrap();
    let mport = master.servers[0].port;
    let rport = replica.servers[0].port;
    // Without the default 5 s wait for more replicas before a sync.
    master.cli(mport, &["CONFIG", "SET", "repl-diskless-sync-delay", "0"]).unwrap();
    replica.cli(rport, &["REPLICAOF", "127.0.0.1", &mport.to_string()]).unwrap();
    wait_until("the replica is in sync", || {
        let info = master.cli(mport, &["INFO", "replication"]).unwrap();
        info.contains("connected_slaves:1") && info.contains("state=online")
    });
    // "online" is the master's word; after a diskless sync the master
    // starts the replica's command stream only on its first ACK (up to a
    // second later; until then a WAIT times out: seen for ~0.9 s in one
    // run in three). A write, then its acknowledgement, shows it started.
    master.cli(mport, &["SET", "zt:sync", "1"]).unwrap();
    master.cli(mport, &["DEL", "zt:sync"]).unwrap();
    wait_until("the replica acknowledges the master's offset", || {
        let info = master.cli(mport, &["INFO", "replication"]).unwrap();
        let master_at =
            info.lines().find_map(|l| l.trim().strip_prefix("master_repl_offset:")?.parse::<u64>().ok());
        let acked = info
            .lines()
            .find(|l| l.starts_with("slave0:"))
            .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")?.parse::<u64>().ok()));
        matches!((master_at, acked), (Some(m), Some(a)) if a >= m)
    });
    let dir = std::env::temp_dir().join(format!("ztier-remote-hub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hub = Hub::new().unwrap();
    let tiers: Vec<Arc<RemoteTier>> = (0..TIERS)
        .map(|t| {
            let mut c = config(&master, Durability::Replica);
            // Room for a loaded machine; a dead replica costs a few of them.
            c.wait_timeout = Duration::from_millis(500);
            c.retry_after = Duration::from_millis(50);
            let f = FileTier::create(&dir.join(format!("spill{t}")), 64 << 20).unwrap();
            let tier = RemoteTier::connect_shared(c, Some(Box::new(f)), &hub).unwrap();
            assert_eq!(tier.durability(), Durability::Replica);
            Arc::new(tier)
        })
        .collect();
    put_from_threads(&tiers);
    for t in &tiers {
        let s = t.stats();
        assert_eq!((s.remote_puts, s.fallback_puts, s.wait_timeouts), (PAGES as u64, 0, 0), "{s:?}");
    }
    wait_until("the replica has every page", || replica.dbsize(rport).unwrap() == (TIERS * PAGES) as u64);
    replica.server(rport).unwrap().kill();
    for t in &tiers {
        for i in 0..PAGES {
            t.put(key(i), meta(), &data(9, i)).unwrap();
        }
    }
    for t in &tiers {
        t.flush();
        let s = t.stats();
        // Nothing more counted as remote: no replica said it had it.
        assert_eq!(s.remote_puts, PAGES as u64, "{s:?}");
        assert_eq!(s.fallback_puts, PAGES as u64, "{s:?}");
        assert!(s.wait_timeouts + s.errors > 0, "{s:?}");
    }
    let mut out = Vec::new();
    for t in &tiers {
        for i in 0..PAGES {
            assert_eq!(t.get(key(i), &mut out, false).unwrap(), Some(meta()));
            assert!(out == data(9, i), "page {i}");
        }
    }
    drop(tiers);
    std::fs::remove_dir_all(&dir).unwrap();
}
