//! Output buffers that already hold garbage, in both directions: codecs must
//! not depend on the contents of the buffers they are given, and state
//! reused between calls must not leak from one page into the next.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztier_codec::{new_codec, CodecId};

fuzz_target!(|data: &[u8]| {
    let Some((&fill, rest)) = data.split_first() else { return };
    // Two inputs from one fuzz case, to exercise state carried between calls.
    let mid = rest.len() / 2 / 4 * 4;
    let a = &rest[..mid];
    let b = &rest[mid..mid + (rest.len() - mid) / 4 * 4];
    for id in CodecId::ALL {
        let mut c = new_codec(id);
        for src in [a, b, a] {
            if src.is_empty() || src.len() > ztier_codec::MAX_INPUT {
                continue;
            }
            let mut out = vec![fill; c.max_compressed_len(src.len())];
            let n = c.compress(src, &mut out).unwrap_or_else(|e| panic!("{id}: {e}"));
            let mut back = vec![fill ^ 0xa5; src.len()];
            c.decompress(&out[..n], &mut back).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert!(back == src, "{id}: round trip with a dirty buffer differs");
        }
    }
});
