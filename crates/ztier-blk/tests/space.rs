//! NoSpace only when the image is full: writers that outrun the cleaner
//! clean (or wait for the cleaner) before a write fails for space.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use ztier_blk::backing::CrashBacking;
use ztier_blk::engine::{BlkError, CreateOptions, Engine};
use ztier_codec::CodecId;

const BS: usize = 4096;

fn opts(blocks: u64, physical: u64) -> CreateOptions {
    CreateOptions {
        logical_size: blocks * BS as u64,
        block_size: BS as u32,
        extent_size: 32768,
        codec: CodecId::Lz4,
        physical: Some(physical),
    }
}

/// Block `lba`'s contents at version `ver`: incompressible (stored raw)
/// when `raw`, else text that compresses about 3:1.
fn block(lba: u64, ver: u64, raw: bool) -> Vec<u8> {
    let mut x = (lba.wrapping_mul(1_000_003) ^ ver.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    let mut next = move || common::xorshift(&mut x);
    let mut b = Vec::with_capacity(BS + 16);
    if raw {
        while b.len() < BS {
            b.extend_from_slice(&next().to_le_bytes());
        }
    } else {
        let words = ["block ", "extent ", "ztier ", "cleaner ", "checkpoint ", "\n", "log "];
        while b.len() < BS {
            b.extend_from_slice(words[(next() % 7) as usize].as_bytes());
            b.extend_from_slice(format!("{} ", next() % 1000).as_bytes());
        }
    }
    b.truncate(BS);
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&ver.to_le_bytes());
    b
}

/// Two writers overwrite runs of a 16 MiB image whose 18.75 MiB of
/// extents hold every block even stored raw (the image is provisioned):
/// at most 2/3 of the live blocks are raw, so live data stays well under
/// the physical size. No write may fail for space, with the maintenance
/// thread cleaning beside them or without it (the writers clean).
fn overwrite_without_nospace(maintenance: bool) {
    let blocks = 4096u64;
    let dev = Arc::new(CrashBacking::new());
    let eng = Engine::create(Box::new(dev.clone()), &opts(blocks, 600 * 32768)).unwrap();
    assert!(eng.provisioned(), "600 extents hold 4096 raw blocks");
    for lba in 0..blocks {
        eng.write(lba * BS as u64, &block(lba, 0, false), false).unwrap();
    }
    eng.flush().unwrap();
    let done = AtomicBool::new(false);
    let last: Vec<u64> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (eng, done) = (&eng, &done);
                s.spawn(move || {
                    let mut ver = vec![0u64; blocks as usize];
                    let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ w;
                    let r = (|| {
                        for round in 0..300u64 {
                            common::xorshift(&mut x);
                            let start = (x % blocks) & !1 | w;
                            let n = 1 + (x >> 32) % 64;
                            for lba in (start..(start + 2 * n).min(blocks)).step_by(2) {
                                let v = ver[lba as usize] + 1;
                                eng.write(lba * BS as u64, &block(lba, v, v % 3 != 0), false)
                                    .map_err(|e| format!("round {round}, block {lba}: {e}"))?;
                                ver[lba as usize] = v;
                            }
                            if round % 50 == 49 {
                                eng.flush().map_err(|e| e.to_string())?;
                            }
                        }
                        Ok::<(), String>(())
                    })();
                    done.store(true, Relaxed);
                    r.map(|()| ver)
                })
            })
            .collect();
        if maintenance {
            s.spawn(|| {
                while !done.load(Relaxed) {
                    match eng.clean(true) {
                        Ok(_) | Err(BlkError::NoSpace) => {}
                        Err(e) => panic!("clean: {e}"),
                    }
                    eng.checkpoint().unwrap();
                }
            });
        }
        let vers: Vec<Vec<u64>> = writers
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("a write failed: {e}; {:?}", eng.stats())))
            .collect();
        (0..blocks as usize).map(|l| vers[l % 2][l]).collect()
    });
    assert!(eng.stats().extents_cleaned > 0, "the cleaner ran: {:?}", eng.stats());
    let mut all = vec![0u8; blocks as usize * BS];
    eng.read(0, &mut all).unwrap();
    for (lba, b) in all.chunks(BS).enumerate() {
        let v = last[lba];
        assert!(b == block(lba as u64, v, v % 3 != 0).as_slice(), "block {lba}: not version {v}");
    }
    assert!(eng.check().unwrap().is_empty());
}

#[test]
fn writers_outrunning_the_cleaner_get_no_nospace_while_the_image_has_room() {
    overwrite_without_nospace(true);
}

#[test]
fn writers_alone_clean_for_themselves_before_nospace() {
    overwrite_without_nospace(false);
}

/// A thin image that cannot hold the data: writes of incompressible
/// blocks fail with NoSpace, and only once the live data is within a
/// margin of the physical size; what was written before reads back.
#[test]
fn a_truly_full_image_gives_nospace() {
    let blocks = 4096u64; // 16 MiB of raw blocks
    let extents = 256u64; // 8 MiB
    let dev = Arc::new(CrashBacking::new());
    let eng = Engine::create(Box::new(dev.clone()), &opts(blocks, extents * 32768)).unwrap();
    assert!(!eng.provisioned());
    let mut written = 0u64;
    let err = loop {
        match eng.write(written * BS as u64, &block(written, 1, true), false) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < blocks, "16 MiB of random data fit in 8 MiB");
    };
    assert!(matches!(err, BlkError::NoSpace), "{err}");
    // Live raw blocks fill all but the cleaner's reserve, the open
    // buffers and the log extents holding their records.
    let live = written * BS as u64;
    let margin = 24 * 32768;
    assert!(live + margin >= extents * 32768, "NoSpace with {live} bytes live of {}", extents * 32768);
    // A full image is still a good one: the failed write changed
    // nothing, and once blocks are trimmed their space is cleaned for new
    // writes; everything reads back.
    eng.read(written * BS as u64, &mut vec![0u8; BS]).unwrap();
    eng.trim(0, 128 * BS as u64, false).unwrap();
    for lba in written..written + 64 {
        eng.write(lba * BS as u64, &block(lba, 1, true), false).unwrap();
    }
    eng.flush().unwrap();
    let mut b = vec![0u8; BS];
    for lba in 0..written + 64 {
        eng.read(lba * BS as u64, &mut b).unwrap();
        if lba < 128 {
            assert!(b.iter().all(|&x| x == 0), "trimmed block {lba}");
        } else {
            assert!(b == block(lba, 1, true), "block {lba}");
        }
    }
    assert!(eng.check().unwrap().is_empty());
}
