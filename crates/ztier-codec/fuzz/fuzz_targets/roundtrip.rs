//! Arbitrary input (cut to a multiple of 4 bytes) through every codec:
//! compress, then decompress, must give the input back exactly. Also with
//! an output buffer cut short: that must be an overflow, never a wrong page.
//! And hybrid's LZ4 ([`ztier_codec::lz4page`]) must write liblz4's bytes
//! exactly, with room for any output and with too little.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

use ztier_codec::lz4page::{self, Lz4Page};
use ztier_codec::{new_codec, Codec, CodecId, CompressError};

/// One instance of every codec, reused across runs (as in real use, state
/// carries over from one call to the next).
static CODECS: Mutex<Vec<Box<dyn Codec>>> = Mutex::new(Vec::new());
static LZ4PAGE: Mutex<Option<(Lz4Page, Box<dyn Codec>)>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let len = (data.len() / 4 * 4).min(ztier_codec::MAX_INPUT);
    if len == 0 {
        return;
    }
    let src = &data[..len];
    if len <= lz4page::MAX_LEN {
        let mut pair = LZ4PAGE.lock().unwrap();
        let (ours, lib) = pair.get_or_insert_with(|| (Lz4Page::new(), new_codec(CodecId::Lz4)));
        let bound = lz4page::bound(len);
        let (mut a, mut b) = (vec![0u8; bound], vec![0u8; bound]);
        // Room for any output, then the first input byte's share of it.
        for room in [bound, 1 + usize::from(data[0]) * bound / 256] {
            let x = ours.compress(src, &mut a[..room]).ok().map(|n| a[..n].to_vec());
            let y = lib.compress(src, &mut b[..room]).ok().map(|n| b[..n].to_vec());
            assert!(x == y, "lz4page differs from liblz4 (room {room})");
        }
    }
    let mut codecs = CODECS.lock().unwrap();
    if codecs.is_empty() {
        codecs.extend(CodecId::ALL.into_iter().map(new_codec));
    }
    for c in codecs.iter_mut() {
        let id = c.id();
        let mut out = vec![0u8; c.max_compressed_len(len)];
        let n = c.compress(src, &mut out).unwrap_or_else(|e| panic!("{id}: {e}"));
        let mut back = vec![0u8; len];
        c.decompress(&out[..n], &mut back).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert!(back == src, "{id}: round trip differs");
        // Half the room: either it still fits (and round-trips) or overflows.
        let mut short = vec![0u8; n / 2];
        match c.compress(src, &mut short) {
            Ok(m) => {
                c.decompress(&short[..m], &mut back).unwrap_or_else(|e| panic!("{id}: {e}"));
                assert!(back == src, "{id}: short round trip differs");
            }
            Err(CompressError::Overflow { .. }) => {}
            Err(e) => panic!("{id}: {e}"),
        }
    }
});
