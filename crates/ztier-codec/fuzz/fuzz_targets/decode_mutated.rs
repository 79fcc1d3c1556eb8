//! Valid compressed pages, then damaged: every codec compresses the input,
//! the output is changed at fuzzer-chosen places (byte flips, a cut) and
//! decompressed. Random bytes rarely get past a decoder's header checks;
//! damaged real output reaches the inner loops. A decoder may return an
//! error or (when the damage hits only data bits) a different page, never
//! panic or touch memory out of bounds.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use ztier_codec::{new_codec, Codec, CodecId};

static CODECS: Mutex<Vec<Box<dyn Codec>>> = Mutex::new(Vec::new());

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let (ctl, page) = data.split_at(8);
    let len = (page.len() / 4 * 4).min(ztier_codec::MAX_INPUT);
    if len == 0 {
        return;
    }
    let page = &page[..len];
    let mut codecs = CODECS.lock().unwrap();
    if codecs.is_empty() {
        codecs.extend(CodecId::ALL.into_iter().map(new_codec));
    }
    for c in codecs.iter_mut() {
        let mut out = vec![0u8; c.max_compressed_len(len)];
        let n = c.compress(page, &mut out).expect("compress into a bound-sized buffer");
        out.truncate(n);
        // Up to three flips at control-chosen places, then maybe a cut.
        for k in 0..3 {
            let pos = u16::from_le_bytes([ctl[2 * k], ctl[2 * k + 1]]) as usize;
            if !out.is_empty() && ctl[6] & (1 << k) != 0 {
                let at = pos % out.len();
                out[at] ^= ctl[7] | 1;
            }
        }
        if ctl[6] & 0x80 != 0 && !out.is_empty() {
            let cut = u16::from_le_bytes([ctl[0], ctl[7]]) as usize % out.len();
            out.truncate(cut);
        }
        let mut back = vec![0u8; len];
        let _ = c.decompress(&out, &mut back);
    }
});
