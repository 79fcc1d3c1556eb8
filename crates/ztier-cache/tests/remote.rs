//! The remote RAM cache (`--remote`) against a real `redis-server` on a
//! loopback port: blocks evicted from RAM and the SSD cache come back
//! from Redis; values the server loses, and a dead server, are misses
//! the backing answers; writes drop the remote copies (never stale).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ztier_cache::backend::{Backend, MemBackend};
use ztier_cache::cache::Remote;
use ztier_cache::{Cache, CacheError, CacheOptions, Mode};
use ztier_remote::testbed::{Options, Testbed};
use ztier_remote::{Durability, RemoteConfig, RemoteTier};

const BLOCKS: u64 = 512;

fn read_block(c: &Cache, b: u64) -> Vec<u8> {
    let mut v = vec![0u8; B];
    c.read(b * B as u64, &mut v).unwrap();
    v
}

fn tier(bed: &Testbed) -> Arc<RemoteTier> {
    let mut cfg = RemoteConfig::parse(&bed.url()).unwrap();
    cfg.durability = Durability::None;
    cfg.timeout = Duration::from_millis(200);
    cfg.get_deadline = Duration::from_millis(200);
    Arc::new(RemoteTier::connect(cfg, None).unwrap())
}

/// Which of `kinds` block `b` holds.
fn kind_of(v: &[u8], b: u64, kinds: &[u8]) -> u8 {
    *kinds.iter().find(|&&k| v == block(b, k)).unwrap_or_else(|| panic!("block {b} holds none of {kinds:?}"))
}

#[test]
fn remote_ram_cache_hits_loses_and_invalidates() {
    let bed =
        Testbed::single(&Options::default()).expect("starting redis-server (Debian package redis-server)");
    let port = bed.servers[0].port;
    let t = tier(&bed);
    let backing = Arc::new(MemBackend::new(BLOCKS * B as u64));
    for b in 0..BLOCKS {
        backing.poke(b * B as u64, &block(b, 0));
    }
    // A small SSD cache (256 KiB) and RAM cache (64 KiB): most of the
    // 2 MiB read is kept only by the remote.
    let dev = Shape { size: 256 << 10, ..Shape::default() }.device();
    let o = CacheOptions {
        ram_cache: 64 << 10,
        mode: Mode::Writearound,
        remote: Some(Remote(t.clone())),
        ..opts()
    };
    let c = open(dev, backing.clone() as Arc<dyn Backend>, o);
    for b in 0..BLOCKS {
        assert_eq!(read_block(&c, b), block(b, 0));
    }
    c.drain();
    t.flush();
    let s = c.stats();
    let r = s.remote.clone().unwrap();
    assert!(r.puts >= BLOCKS - 16, "{r:?}");
    assert!(r.tier.remote_puts >= r.puts, "written to the server: {r:?}");

    // The backing changes behind the cache's back: every block still
    // reads as cached (RAM, SSD or remote), none from the backing.
    for b in 0..BLOCKS {
        backing.poke(b * B as u64, &block(b, 1));
    }
    let before = c.stats();
    for b in 0..BLOCKS {
        assert_eq!(read_block(&c, b), block(b, 0), "block {b}");
    }
    let s = c.stats();
    let r = s.remote.clone().unwrap();
    assert_eq!(s.misses, before.misses, "nothing read from the backing");
    assert!(r.hits >= BLOCKS / 2, "most blocks from the remote: {r:?}");
    assert!(r.tier.remote_gets >= BLOCKS / 2, "fetched from the server: {r:?}");
    assert!(s.latency.remote_hit.count > 0, "{:?}", s.latency);

    // The server loses every value: misses, served by the backing.
    bed.cli(port, &["FLUSHALL"]).unwrap();
    let before = c.stats();
    let mut from_backing = 0;
    for b in 0..BLOCKS {
        let v = read_block(&c, b);
        if kind_of(&v, b, &[0, 1]) == 1 {
            from_backing += 1;
        }
    }
    let s = c.stats();
    let r = s.remote.clone().unwrap();
    assert!(r.errors - before.remote.as_ref().unwrap().errors >= BLOCKS / 2, "lost values: {r:?}");
    assert_eq!(from_backing, s.misses - before.misses, "every miss read the backing's data");
    assert!(from_backing >= BLOCKS / 2);

    // Refilled from the backing, then written (write-around): the writes
    // drop the remote copies, so reads see the written data.
    c.drain();
    t.flush();
    for b in 0..64 {
        c.write(b * B as u64, &block(b, 3), false).unwrap();
    }
    for b in 0..64 {
        assert_eq!(read_block(&c, b), block(b, 3), "block {b} after its write");
    }

    // A dead server: reads are answered from below; after a failed get
    // that waited, the remote rests (a second) instead of every miss
    // waiting for it.
    assert_eq!(c.stats().remote.unwrap().rests, 0, "lost values do not rest the remote");
    let mut bed = bed;
    bed.servers[0].kill();
    let before = c.stats();
    let t0 = Instant::now();
    for b in 64..BLOCKS {
        let v = read_block(&c, b);
        kind_of(&v, b, &[0, 1]);
    }
    let took = t0.elapsed();
    let s = c.stats();
    let (r, r0) = (s.remote.clone().unwrap(), before.remote.unwrap());
    assert!(r.errors > r0.errors && r.rests > r0.rests, "{r:?}");
    // Without the rests every one of these reads waited ~200 ms (90 s).
    assert!(took < Duration::from_secs(10), "reads waited for the dead server: {took:?} {r:?}");
    for b in 0..64 {
        assert_eq!(read_block(&c, b), block(b, 3));
    }
    c.close().unwrap();
}

/// A remote RAM cache without a RAM cache is refused.
#[test]
fn remote_needs_a_ram_cache() {
    let bed = Testbed::single(&Options::default()).expect("starting redis-server");
    let backing = Arc::new(MemBackend::new(64 * B as u64));
    let o = CacheOptions { remote: Some(Remote(tier(&bed))), ..opts() };
    let e = Cache::open(Shape::default().device(), backing as Arc<dyn Backend>, o).err().expect("refused");
    assert!(matches!(e, CacheError::Options(_)), "{e}");
}
