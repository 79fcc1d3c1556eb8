//! The proxy `ztier run` keeps the remote tier in, and the client its
//! processes reach it with, against a real `redis-server` on loopback:
//! pages through a store over the client, statistics, pages taken back
//! before a fork, a wrong token, values deleted when a process's
//! connection ends, and the run recorded as alive, then ended.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use ztier_remote::client::{Opener, ProxyTier};
use ztier_remote::testbed::{Options, Testbed};
use ztier_remote::{Proxy, RemoteConfig, Spill};
use ztier_run_core::names::env::{REMOTE_SOCKET as ENV_SOCKET, REMOTE_TOKEN as ENV_TOKEN};
use ztier_store::alloc::AllocatorKind;
use ztier_store::tier::NextTier;
use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig};

fn page(i: u32) -> Vec<u8> {
    (0..4096u32).map(|j| ((i.wrapping_mul(2654435761) ^ j.wrapping_mul(40503)) >> (j % 7)) as u8).collect()
}

fn opener(name: String) -> Opener {
    Box::new(move || {
        use std::os::linux::net::SocketAddrExt;
        UnixStream::connect_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?)
    })
}

fn env(p: &Proxy, k: &str) -> String {
    p.env().into_iter().find(|(n, _)| *n == k).expect("set").1
}

fn key(pool: u32, i: u32) -> Key {
    Key { pool, object: 0, index: i }
}

#[test]
fn pages_through_the_proxy_and_back_before_a_fork() {
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let dir = std::env::temp_dir().join(format!("ztier-proxy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = RemoteConfig::parse(&bed.url()).unwrap();
    let proxy = Proxy::start(cfg, Some(Spill { dir: dir.clone(), max_bytes: 64 << 20 })).unwrap();
    // One server, no replica, a spill file: local copies.
    assert_eq!(proxy.durability().name(), "local");
    let run = proxy.run_id().to_string();
    assert_eq!(bed.cli(port, &["SISMEMBER", "zt:runs", &run]).unwrap().trim(), "1");
    assert_eq!(bed.cli(port, &["EXISTS", &format!("zt:{run}:alive")]).unwrap().trim(), "1");

    let (name, token) = (env(&proxy, ENV_SOCKET), env(&proxy, ENV_TOKEN));
    let e = ProxyTier::connect(opener(name.clone()), &[b'0'; 32]).err().expect("refused").to_string();
    assert!(e.contains("wrong token"), "{e}");

    let tier = ProxyTier::connect(opener(name.clone()), token.as_bytes()).unwrap();
    assert_eq!(tier.run_id(), run);
    let sc = StoreConfig { shards: 2, allocator: AllocatorKind::Classes, ..StoreConfig::new(64 << 10) };
    let store = Store::with_tier(sc, Some(Box::new(tier.clone())));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    for i in 0..800 {
        store.put(key(pool, i), &page(i), PutFlags::default()).unwrap();
    }
    assert!(store.tier_entries() > 600, "{}", store.tier_entries());
    let mut out = vec![0u8; 4096];
    for i in (0..800).rev() {
        assert!(store.get(key(pool, i), &mut out, false).unwrap(), "page {i}");
        assert!(out == page(i), "page {i}");
    }
    let stats: serde_json::Value = serde_json::from_str(&tier.stats_json().unwrap()).unwrap();
    assert!(
        stats["remote_puts"].as_u64().unwrap() > 0 && stats["remote_gets"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert!(stats["proxied_gets"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["durability"], "local");
    assert!(bed.dbsize(port).unwrap() > 100);

    // Before a fork every entry comes back into the process, and the
    // proxy lets go of them (their values deleted).
    let held = tier.entries();
    assert!(!tier.prepare_fork().unwrap());
    assert_eq!(tier.entries(), held);
    for i in 0..800 {
        assert!(store.get(key(pool, i), &mut out, true).unwrap(), "page {i}");
        assert!(out == page(i), "page {i}");
    }
    assert_eq!(tier.entries(), 0);
    let t = Instant::now();
    // The run's two records stay.
    while bed.dbsize(port).unwrap() > 2 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(bed.dbsize(port).unwrap(), 2);

    // A second process, gone without a word: its values go with it.
    let other = ProxyTier::connect(opener(name), token.as_bytes()).unwrap();
    for i in 0..50 {
        other
            .put(
                key(9, i),
                ztier_store::tier::SpillMeta { tag: 0, flags: 0, len: 10, crc: 0, pattern: 0 },
                b"0123456789",
            )
            .unwrap();
    }
    drop(other);
    drop(store);
    drop(tier);
    let end = proxy.finish(|_| {});
    // The stranger with the wrong token is the one problem said.
    assert!(end.problems.len() == 1 && end.problems[0].contains("refused"), "{:?}", end.problems);
    assert_eq!(end.processes, 2);
    assert!(end.stats.remote_puts > 600, "{:?}", end.stats);
    assert_eq!(end.stats.mac_errors + end.stats.lost, 0);
    assert_eq!(bed.dbsize(port).unwrap(), 0, "the run's values and records are gone");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run whose `ztier run` died (its record never renewed, never
/// ended) is found and removed by `remove_dead_runs`; a live one is not.
#[test]
fn dead_runs_are_removed() {
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let cfg = RemoteConfig::parse(&bed.url()).unwrap();
    let live = Proxy::start(cfg.clone(), None).unwrap();
    let dead = "0123456789ab";
    bed.cli(port, &["SADD", "zt:runs", dead]).unwrap();
    for i in 0..30 {
        bed.cli(port, &["SET", &format!("zt:{dead}:0000:{{1}}:{i}"), "x"]).unwrap();
    }
    let removed = ztier_remote::remove_dead_runs(&cfg).unwrap();
    assert_eq!(removed, vec![(dead.to_string(), 30)]);
    assert_eq!(bed.cli(port, &["SMEMBERS", "zt:runs"]).unwrap().trim(), live.run_id());
    drop(live);
}
