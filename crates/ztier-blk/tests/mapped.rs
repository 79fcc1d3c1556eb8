//! Reads of a file image in place from its mapping, and what a bus error
//! under that mapping (the image truncated by another program) becomes.

use std::fs::OpenOptions;
use std::path::PathBuf;

use ztier_blk::backing::FileBacking;
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_codec::CodecId;

const BS: usize = 4096;
const MIB: usize = 1 << 20;

/// A fresh path in the temp folder, removed on drop.
struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
fn tmp(name: &str) -> Tmp {
    let p = std::env::temp_dir().join(format!("ztier-blk-mapped-{}-{name}.ztb", std::process::id()));
    let _ = std::fs::remove_file(&p);
    Tmp(p)
}

/// Text-like, compressible, different for every block.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 32);
    let mut i = seed;
    while v.len() < len {
        v.extend_from_slice(format!("block {} of the image, line {}\n", i / 97, i).as_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// 8 MiB written (most of it in sealed extents) and flushed.
fn filled(path: &std::path::Path) -> (Engine, Vec<u8>) {
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(path).unwrap();
    let o = CreateOptions {
        logical_size: 16 * MIB as u64,
        block_size: BS as u32,
        extent_size: 32768,
        codec: CodecId::Lz4,
        physical: None,
    };
    let eng = Engine::create(Box::new(FileBacking::new(f)), &o).unwrap();
    let d = data(8 * MIB, 7);
    for (i, c) in d.chunks(MIB).enumerate() {
        eng.write((i * MIB) as u64, c, false).unwrap();
    }
    eng.flush().unwrap();
    (eng, d)
}

#[test]
fn warm_reads_of_a_file_image_decode_in_place() {
    let t = tmp("warm");
    let (eng, d) = filled(&t.0);
    let mut buf = vec![0u8; MIB];
    for i in 0..8 {
        eng.read((i * MIB) as u64, &mut buf).unwrap();
        assert!(buf == d[i * MIB..(i + 1) * MIB], "MiB {i} reads back what was written");
    }
    let s = eng.stats();
    assert!(s.mapped_reads > 0, "no span was read from the mapping: {s:?}");
    assert_eq!(s.corrupt_reads, 0);
    // The same image reopened reads the same through its own mapping.
    drop(eng);
    let f = OpenOptions::new().read(true).write(true).open(&t.0).unwrap();
    let eng = Engine::open(Box::new(FileBacking::new(f)), false).unwrap();
    for i in 0..8 {
        eng.read((i * MIB) as u64, &mut buf).unwrap();
        assert!(buf == d[i * MIB..(i + 1) * MIB], "MiB {i} after reopening");
    }
    assert!(eng.stats().mapped_reads > 0);
}

#[test]
fn a_read_of_a_truncated_image_is_an_error_not_a_bus_error() {
    let t = tmp("trunc");
    let (eng, d) = filled(&t.0);
    let mut buf = vec![0u8; MIB];
    eng.read(0, &mut buf).unwrap();
    assert!(buf == d[..MIB]);
    let mapped = eng.stats().mapped_reads;
    assert!(mapped > 0, "the first read did not use the mapping");
    // Another program cuts the image to its first page: the mapped pages
    // of the data are gone (a plain mapping would raise SIGBUS here).
    OpenOptions::new().write(true).open(&t.0).unwrap().set_len(4096).unwrap();
    for i in 0..8 {
        let r = eng.read((i * MIB) as u64, &mut buf);
        assert!(r.is_err(), "MiB {i} of a truncated image read as Ok");
    }
    // The mapping is given up after its first bus error: later reads pread
    // (and fail the same way) rather than read zero pages in place.
    let after = eng.stats().mapped_reads;
    assert!(eng.read(0, &mut buf).is_err());
    assert_eq!(eng.stats().mapped_reads, after, "a read used the mapping after a bus error");
    assert!(after <= mapped + 1, "reads went on in place after the bus error: {mapped} -> {after}");
}
