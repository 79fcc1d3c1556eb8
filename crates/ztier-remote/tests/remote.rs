//! The remote tier against real `redis-server` processes on loopback
//! ports (a single server, a 3-master 3-replica cluster), under a page
//! store: round trips, a master killed mid-run, every server down,
//! resharding while pages come and go, a wrong password, values changed
//! behind the tier's back, and a fake server's malformed replies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_codec::corpus::synth::{self, Kind};
use ztier_remote::testbed::{FakeServer, Options, Testbed};
use ztier_remote::{Durability, RemoteConfig, RemoteError, RemoteTier};
use ztier_store::alloc::AllocatorKind;
use ztier_store::tier::{FileTier, NextTier, SpillMeta};
use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig, StoreError};

const PAGE: usize = 4096;

fn page(i: u32) -> Vec<u8> {
    let kinds: [Kind; 5] = synth::KINDS;
    synth::page(kinds[i as usize % 5], i as u64 * 7919)
}

fn temp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ztier-remote-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(bed: &Testbed, durability: Durability) -> RemoteConfig {
    let mut c = RemoteConfig::parse(&bed.url()).unwrap();
    if let Some((u, p)) = &bed.opts.auth {
        c.credentials.user = Some(u.clone());
        c.credentials.password = Some(p.clone());
    }
    c.durability = durability;
    c.batch_pages = 16;
    c
}

/// A store of `budget` bytes over `tier`, and its persistent pool.
fn store_over(tier: RemoteTier, budget: usize) -> (Store, u32) {
    let sc = StoreConfig { shards: 2, allocator: AllocatorKind::Classes, ..StoreConfig::new(budget) };
    let store = Store::with_tier(sc, Some(Box::new(tier)));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    (store, pool)
}

fn key(pool: u32, i: u32) -> Key {
    Key { pool, object: (i / 1000) as u64, index: i % 1000 }
}

fn put_all(store: &Store, pool: u32, range: std::ops::Range<u32>) {
    for i in range {
        store.put(key(pool, i), &page(i), PutFlags::default()).unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
}

fn check_all(store: &Store, pool: u32, range: std::ops::Range<u32>, exclusive: bool) {
    let mut out = vec![0u8; PAGE];
    for i in range {
        match store.get(key(pool, i), &mut out, exclusive) {
            Ok(true) => assert!(out == page(i), "page {i} differs"),
            r => panic!("page {i}: {r:?} ({:?})", store.tier_error()),
        }
    }
}

/// Pages through a store 64 KiB big into a single server with an ACL
/// user: every page comes back; the names on the server say nothing of
/// the pages; deletes reach the server.
#[test]
fn single_server_round_trip_and_names() {
    let opts = Options { auth: Some(("ztier".into(), "pw-single".into())), ..Options::default() };
    let bed = Testbed::single(&opts).unwrap();
    let port = bed.servers[0].port;
    let tier = RemoteTier::connect(config(&bed, Durability::Auto), None).unwrap();
    // A single server without replicas and no fallback: nothing to wait for.
    assert_eq!(tier.durability(), Durability::None);
    let run = tier.run_id().to_string();
    let (store, pool) = store_over(tier, 64 << 10);
    put_all(&store, pool, 0..600);
    let s = store.stats();
    assert!(s.tier_entries > 400, "{s:?}");
    check_all(&store, pool, 0..600, false);
    let names = bed.cli(port, &["--scan", "--pattern", "*"]).unwrap();
    let names: Vec<&str> = names.lines().collect();
    assert!(names.len() > 300, "{}", names.len());
    for n in &names {
        // zt:RUN:PROC:{TAG}:ID
        let f: Vec<&str> = n.split(':').collect();
        assert_eq!(f.len(), 5, "{n}");
        assert_eq!((f[0], f[1]), ("zt", run.as_str()));
        assert_eq!(f[2].len(), 8);
        assert!(f[3].starts_with('{') && f[3].ends_with('}'), "{n}");
        assert_eq!(f[4].len(), 24);
        assert!(f[4].bytes().all(|b| b.is_ascii_hexdigit()));
    }
    // Exclusive gets: the values are deleted on the server too.
    check_all(&store, pool, 0..600, true);
    let t = Instant::now();
    while bed.dbsize(port).unwrap() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(bed.dbsize(port).unwrap(), 0);
}

/// A wrong password is refused when the tier is made, with a message
/// that says so and does not repeat the password.
#[test]
fn a_wrong_password_is_a_clear_error() {
    let opts = Options { auth: Some(("ztier".into(), "right-one".into())), ..Options::default() };
    let bed = Testbed::single(&opts).unwrap();
    let mut c = config(&bed, Durability::Auto);
    c.credentials.password = Some("wrong-one".into());
    let e = RemoteTier::connect(c.clone(), None).err().expect("refused");
    assert!(matches!(e, RemoteError::Auth(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("authentication failed") && !msg.contains("wrong-one"), "{msg}");
    c.credentials.password = None;
    let e = RemoteTier::connect(c, None).err().expect("refused");
    assert!(matches!(e, RemoteError::Auth(_)), "{e:?}");
}

fn meta(len: usize) -> SpillMeta {
    SpillMeta { tag: 3, flags: 0, len: len as u16, crc: 7, pattern: 0 }
}

/// A value changed on the server, or another page's value (or an older
/// version of the same page) put in its place: a MAC error, never data;
/// with encryption, the server never holds the page in clear.
#[test]
fn values_changed_behind_the_tiers_back_are_refused() {
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    for encrypt in [false, true] {
        let mut c = config(&bed, Durability::None);
        c.encrypt = encrypt;
        let tier = RemoteTier::connect(c, None).unwrap();
        let k = |i| Key { pool: 1, object: 2, index: i };
        let data = |i: u32| vec![b'a' + i as u8; 1000];
        for i in 0..3 {
            tier.put(k(i), meta(1000), &data(i)).unwrap();
        }
        tier.flush();
        let name = |i| String::from_utf8(tier.value_name(k(i)).expect("remote")).unwrap();
        let mut out = Vec::new();
        assert_eq!(tier.get(k(0), &mut out, false).unwrap(), Some(meta(1000)));
        assert_eq!(out, data(0));
        let raw = bed.cli(port, &["GET", &name(0)]).unwrap();
        assert_eq!(raw.contains("aaaaaaaaaa"), !encrypt);
        // One byte changed.
        assert_eq!(bed.cli(port, &["SETRANGE", &name(0), "500", "X"]).unwrap().trim(), "1028");
        let e = tier.get(k(0), &mut out, true).unwrap_err().to_string();
        assert!(e.contains("MAC mismatch"), "{e}");
        // Failed exclusive gets leave the entry.
        assert_eq!(tier.entries(), 3);
        // Another page's value in its place.
        bed.cli(port, &["COPY", &name(2), &name(1), "REPLACE"]).unwrap();
        let e = tier.get(k(1), &mut out, false).unwrap_err().to_string();
        assert!(e.contains("MAC mismatch") || e.contains("sequence"), "{e}");
        // An older version of the same page.
        tier.put(k(2), meta(1000), &data(5)).unwrap();
        tier.flush();
        let new = name(2);
        bed.cli(port, &["COPY", &name(1), &new, "REPLACE"]).unwrap();
        assert!(tier.get(k(2), &mut out, false).is_err());
        // Deleted: an error for a persistent page, not a miss.
        bed.cli(port, &["DEL", &new]).unwrap();
        let e = tier.get(k(2), &mut out, false).unwrap_err().to_string();
        assert!(e.contains("gone from the server"), "{e}");
        assert_eq!(tier.stats().mac_errors, 3);
        assert_eq!(tier.stats().lost, 1);
    }
    // Through a store: the get fails, the page is never returned wrong.
    let tier = RemoteTier::connect(config(&bed, Durability::None), None).unwrap();
    let (store, pool) = store_over(tier, 64 << 10);
    put_all(&store, pool, 0..300);
    std::thread::sleep(Duration::from_millis(200));
    let names = bed.cli(port, &["--scan", "--pattern", "zt:*"]).unwrap();
    for n in names.lines() {
        bed.cli(port, &["SETRANGE", n, "100", "\u{1}"]).unwrap();
    }
    let mut out = vec![0u8; PAGE];
    let (mut good, mut refused) = (0, 0);
    for i in 0..300 {
        match store.get(key(pool, i), &mut out, false) {
            Ok(true) => {
                assert!(out == page(i), "page {i} came back wrong");
                good += 1;
            }
            Err(StoreError::Tier(e)) => {
                assert!(e.to_string().contains("MAC mismatch"), "{e}");
                refused += 1;
            }
            r => panic!("{r:?}"),
        }
    }
    assert!(refused > 100 && good > 0, "{refused} {good}");
}

/// Pages are sealed when put (MAC, or encrypted; a writer that
/// encrypts and keeps local copies keeps them plain): while they wait
/// to be written (the flusher held back, as for a fork), gets return
/// them right, a replaced one is never written, and its bytes are
/// counted off once the flusher has passed it; what is written is
/// exactly the current pages, and their values hold no page in clear
/// when encrypting.
#[test]
fn pages_waiting_to_be_written_come_back_right_and_replaced_ones_are_never_written() {
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let dir = temp("waiting");
    for (encrypt, durability) in
        [(true, Durability::None), (false, Durability::None), (true, Durability::Local)]
    {
        bed.cli(port, &["FLUSHALL"]).unwrap();
        let mut c = config(&bed, durability);
        c.encrypt = encrypt;
        let fallback = (durability == Durability::Local)
            .then(|| Box::new(FileTier::create(&dir.join("spill"), 1 << 30).unwrap()) as Box<dyn NextTier>);
        let tier = RemoteTier::connect(c, fallback).unwrap();
        let k = |i| Key { pool: 1, object: 2, index: i };
        let data = |i: u32, v: u8| vec![b'a' + (i % 20) as u8 + v; 1000 + i as usize];
        let m = |i: u32| meta(1000 + i as usize);
        // Held back: nothing is written.
        assert!(!tier.prepare_fork().unwrap());
        for i in 0..40 {
            tier.put(k(i), m(i), &data(i, 0)).unwrap();
        }
        // Half of them replaced, a few removed, while waiting.
        for i in 0..20 {
            tier.put(k(i), m(i), &data(i, 1)).unwrap();
        }
        for i in 35..40 {
            assert!(tier.remove(k(i)));
        }
        let mut out = Vec::new();
        for i in 0..35 {
            assert_eq!(tier.get(k(i), &mut out, false).unwrap(), Some(m(i)), "{encrypt} {durability:?}");
            assert!(
                out == data(i, (i < 20) as u8),
                "page {i} waiting came back wrong ({encrypt} {durability:?})"
            );
        }
        assert_eq!(tier.stats().pending_hits, 35);
        let (queued, bytes) = tier.pending();
        assert_eq!(queued, 60);
        // The replaced and removed pages gave their room back at once
        // (a put never waits for the flusher to pass them).
        let plain: usize = (0..35).map(|i| 1000 + i).sum();
        assert!((plain..=plain + 35 * ztier_remote::seal::OVERHEAD).contains(&bytes), "{bytes}");
        assert_eq!(bed.dbsize(port).unwrap(), 0);
        tier.parent_after_fork();
        tier.flush();
        assert_eq!(tier.pending(), (0, 0), "{encrypt} {durability:?}");
        let s = tier.stats();
        assert_eq!(s.remote_puts, 35, "{s:?}");
        assert_eq!(bed.dbsize(port).unwrap(), 35);
        for i in 0..35 {
            assert_eq!(tier.get(k(i), &mut out, false).unwrap(), Some(m(i)));
            assert!(out == data(i, (i < 20) as u8), "page {i} came back wrong ({encrypt} {durability:?})");
            let name = String::from_utf8(tier.value_name(k(i)).expect("remote")).unwrap();
            let raw = bed.cli(port, &["GET", &name]).unwrap();
            let clear = String::from_utf8(data(i, (i < 20) as u8)[..100].to_vec()).unwrap();
            assert_eq!(raw.contains(&clear), !encrypt, "{encrypt} {durability:?}");
        }
        assert_eq!(tier.stats().local_copies, if durability == Durability::Local { 35 } else { 0 });
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Replies no server would send: errors, never a crash or a page.
#[test]
fn malformed_and_oversized_replies_are_errors() {
    for reply in [
        &b"hello\r\n"[..],
        b"$99999999999\r\n",
        b"$-7\r\n",
        b":12\r\n",
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n",
        b"-ERR something broke\r\n",
    ] {
        let fake = FakeServer::start(reply.to_vec()).unwrap();
        let mut c = RemoteConfig::parse(&format!("redis://127.0.0.1:{}", fake.port)).unwrap();
        c.timeout = Duration::from_millis(300);
        c.get_deadline = Duration::from_millis(600);
        let tier = RemoteTier::connect(c, None).unwrap();
        let k = Key { pool: 0, object: 0, index: 1 };
        tier.put(k, meta(100), &[9; 100]).unwrap();
        tier.flush();
        assert!(tier.value_name(k).is_some(), "{:?}", tier.last_error());
        let mut out = Vec::new();
        let e = tier.get(k, &mut out, false).expect_err("refused");
        assert!(out.is_empty() || out == [9; 100][..0], "{reply:?}");
        eprintln!("{:?} -> {e}", String::from_utf8_lossy(reply));
    }
    // A well-formed reply far larger than any page.
    let mut big = format!("${}\r\n", 1 << 20).into_bytes();
    big.extend(vec![b'x'; 1 << 20]);
    big.extend_from_slice(b"\r\n");
    let fake = FakeServer::start(big).unwrap();
    let c = RemoteConfig::parse(&format!("redis://127.0.0.1:{}", fake.port)).unwrap();
    let tier = RemoteTier::connect(c, None).unwrap();
    let k = Key { pool: 0, object: 0, index: 1 };
    tier.put(k, meta(100), &[9; 100]).unwrap();
    tier.flush();
    let e = tier.get(k, &mut Vec::new(), false).unwrap_err().to_string();
    assert!(e.contains("not a ztier page") || e.contains("length"), "{e}");
}

fn cluster(auth: bool) -> Testbed {
    let opts = Options {
        auth: auth.then(|| ("ztier".to_string(), "pw-cluster".to_string())),
        node_timeout_ms: 1000,
        ..Options::default()
    };
    Testbed::cluster(3, 1, &opts).unwrap()
}

/// SIGKILL of a master while pages are being put and got: every page
/// comes back right (gets wait for the failover), none is lost, and the
/// failover is counted.
#[test]
fn a_master_killed_mid_run_loses_no_page() {
    let mut bed = cluster(true);
    let tier = RemoteTier::connect(config(&bed, Durability::Replica), None).unwrap();
    assert_eq!(tier.durability(), Durability::Replica);
    let (store, pool) = store_over(tier, 64 << 10);
    let store = Arc::new(store);
    put_all(&store, pool, 0..1500);
    let killed = Arc::new(AtomicBool::new(false));
    let worker = {
        let (store, killed) = (store.clone(), killed.clone());
        std::thread::spawn(move || {
            // Puts and gets go on through the kill and the failover.
            let mut i = 1500;
            let mut out = vec![0u8; PAGE];
            let t = Instant::now();
            while !killed.load(Ordering::Relaxed) || t.elapsed() < Duration::from_secs(4) {
                match store.put(key(pool, i), &page(i), PutFlags::default()) {
                    Ok(()) => {}
                    // The store keeps a page it cannot evict: refused only
                    // for want of room, never lost.
                    Err(StoreError::Refused(_)) => continue,
                    Err(e) => panic!("put {i}: {e}"),
                }
                let j = (i * 37) % i;
                assert!(store.get(key(pool, j), &mut out, false).unwrap(), "page {j}");
                assert!(out == page(j), "page {j}");
                i += 1;
                if i > 6000 {
                    break;
                }
            }
            i
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let victim = bed.master_ports().unwrap()[1];
    bed.server(victim).unwrap().kill();
    killed.store(true, Ordering::Relaxed);
    let n = worker.join().unwrap();
    bed.wait_cluster_ok(3, 0, Duration::from_secs(20)).unwrap();
    check_all(&store, pool, 0..n, false);
    let st = store.stats();
    assert_eq!(st.checksum_errors, 0);
    assert!(st.tier_entries > 1000, "{st:?}");
}

/// Every server killed: what was remote comes back from the local
/// copies, new evictions go to the spill file, nothing is lost.
#[test]
fn every_server_down_falls_back_and_loses_nothing() {
    let mut bed = cluster(false);
    let dir = temp("alldown");
    let fallback = FileTier::create(&dir.join("spill"), 1 << 30).unwrap();
    let mut c = config(&bed, Durability::Auto);
    c.timeout = Duration::from_millis(200);
    let tier = RemoteTier::connect(c, Some(Box::new(fallback))).unwrap();
    assert_eq!(tier.durability(), Durability::ReplicaLocal);
    let (store, pool) = store_over(tier, 64 << 10);
    put_all(&store, pool, 0..800);
    check_all(&store, pool, 0..800, false);
    let ports: Vec<u16> = bed.servers.iter().map(|s| s.port).collect();
    for p in ports {
        bed.server(p).unwrap().kill();
    }
    put_all(&store, pool, 800..1600);
    check_all(&store, pool, 0..1600, false);
    check_all(&store, pool, 0..1600, true);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Slots moved between masters (keys with them, MOVED and ASK on the
/// way) while pages are put and got: no error, every page right.
#[test]
fn live_resharding_gives_no_errors() {
    let bed = cluster(false);
    let tier = RemoteTier::connect(config(&bed, Durability::Replica), None).unwrap();
    let (store, pool) = store_over(tier, 64 << 10);
    let store = Arc::new(store);
    put_all(&store, pool, 0..1000);
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            let mut i = 1000;
            let mut out = vec![0u8; PAGE];
            while !done.load(Ordering::Relaxed) && i < 20000 {
                store
                    .put(key(pool, i), &page(i), PutFlags::default())
                    .unwrap_or_else(|e| panic!("put {i}: {e}: {:?}", store.tier_error()));
                let j = (i * 31) % i;
                assert!(store.get(key(pool, j), &mut out, false).unwrap(), "page {j}");
                assert!(out == page(j), "page {j}");
                i += 1;
            }
            i
        })
    };
    let m = bed.master_ports().unwrap();
    bed.reshard(m[0], m[1], 3000).unwrap();
    bed.reshard(m[1], m[2], 1500).unwrap();
    done.store(true, Ordering::Relaxed);
    let n = worker.join().unwrap();
    eprintln!("{n} pages; {:?}; {:?}", store.stats(), store.tier_error());
    check_all(&store, pool, 0..n, true);
    assert_eq!(store.stats().tier_errors, 0);
}

/// A CA and a server certificate for 127.0.0.1 (openssl), in `dir`.
fn certificates(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let run = |args: &[&str]| {
        let out =
            std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=ztier test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
    (dir.join("server.crt"), dir.join("server.key"), dir.join("ca.crt"))
}

/// TLS (Debian's redis-server has it): pages round-trip over rediss://
/// with the test CA trusted; without it, the server is refused.
#[test]
fn tls_round_trip() {
    let dir = temp("tls");
    let opts = Options { tls: Some(certificates(&dir)), ..Options::default() };
    let bed = Testbed::single(&opts).unwrap();
    let mut c = config(&bed, Durability::None);
    assert!(c.tls);
    let e = RemoteTier::connect(c.clone(), None).err().expect("an unknown CA is refused");
    assert!(matches!(e, RemoteError::Connect(_)), "{e}");
    c.tls_ca = Some(dir.join("ca.crt"));
    let tier = RemoteTier::connect(c, None).unwrap();
    let (store, pool) = store_over(tier, 64 << 10);
    put_all(&store, pool, 0..300);
    check_all(&store, pool, 0..300, true);
    drop(bed);
    std::fs::remove_dir_all(&dir).unwrap();
}
