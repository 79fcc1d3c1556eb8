//! Arbitrary bytes given to every decoder, for several output lengths: a
//! decoder may return an error, never panic or touch memory out of bounds
//! (the fuzzer runs with AddressSanitizer).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

use ztier_codec::{new_codec, Codec, CodecId};

/// One instance of every codec, reused across runs (as in real use, state
/// carries over from one call to the next).
static CODECS: Mutex<Vec<Box<dyn Codec>>> = Mutex::new(Vec::new());

fuzz_target!(|data: &[u8]| {
    // The first byte picks the output length, so lengths that match the
    // input's header are reached too.
    let Some((&sel, input)) = data.split_first() else { return };
    let lens = [4usize, 8, 64, 4096, 4 * (1 + sel as usize)];
    let mut codecs = CODECS.lock().unwrap();
    if codecs.is_empty() {
        codecs.extend(CodecId::ALL.into_iter().map(new_codec));
    }
    for c in codecs.iter_mut() {
        for len in lens {
            let mut out = vec![0u8; len];
            let _ = c.decompress(input, &mut out);
        }
    }
});
