//! Arbitrary input (cut to a multiple of 4 bytes) through every codec:
//! compress, then decompress, must give the input back exactly. Also with
//! an output buffer cut short: that must be an overflow, never a wrong page.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

use ztier_codec::{new_codec, Codec, CodecId, CompressError};

/// One instance of every codec, reused across runs (as in real use, state
/// carries over from one call to the next).
static CODECS: Mutex<Vec<Box<dyn Codec>>> = Mutex::new(Vec::new());

fuzz_target!(|data: &[u8]| {
    let len = (data.len() / 4 * 4).min(ztier_codec::MAX_INPUT);
    if len == 0 {
        return;
    }
    let src = &data[..len];
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
