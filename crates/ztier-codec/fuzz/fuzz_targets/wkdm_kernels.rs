//! Every WKdm kernel this build and CPU run, against the safe kernel: the
//! input decoded as a compressed page, and compressed as a page, by each.
//! The kernels must agree byte for byte — on refusals too — and none may
//! panic or touch memory out of bounds (the fuzzer runs with
//! AddressSanitizer). With `--features avx512` on an AVX-512 CPU the
//! AVX-512 kernel is among them.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use ztier_codec::wkdm::{Kernel, Wkdm};
use ztier_codec::{Codec, MAX_INPUT};

/// One codec per kernel, reused across runs (as in real use, its buffers
/// carry over from one call to the next); the safe one first.
static CODECS: Mutex<Vec<Wkdm>> = Mutex::new(Vec::new());

fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else { return };
    let mut codecs = CODECS.lock().unwrap();
    if codecs.is_empty() {
        codecs.extend(Kernel::ALL.into_iter().filter_map(Wkdm::with_kernel));
    }
    let (safe, others) = codecs.split_first_mut().expect("the safe kernel");

    // Decoding: the length the header names (so that real pages get past
    // the checks) and one the selector byte picks.
    let named = input.get(2..4).map_or(0, |b| 4 * u16::from_le_bytes([b[0], b[1]]) as usize);
    for len in [named, 4 * (1 + sel as usize)] {
        if len == 0 || len > MAX_INPUT {
            continue;
        }
        let mut want = vec![0u8; len];
        let want = safe.decompress(input, &mut want).map(|()| want);
        for c in others.iter_mut() {
            let mut got = vec![0x5a; len];
            let got = c.decompress(input, &mut got).map(|()| got);
            assert!(got == want, "the {} kernel decodes differently", c.kernel());
        }
    }

    // Encoding: the input as a page, into a buffer of the bound and into
    // one the selector byte cuts short.
    let len = input.len() / 4 * 4;
    if len == 0 || len > MAX_INPUT {
        return;
    }
    let page = &input[..len];
    let bound = safe.max_compressed_len(len);
    for cap in [bound, bound * sel as usize / 255] {
        let mut want = vec![0u8; cap];
        let want = safe.compress(page, &mut want).map(|n| want[..n].to_vec());
        for c in others.iter_mut() {
            let mut got = vec![0xa5; cap];
            let got = c.compress(page, &mut got).map(|n| got[..n].to_vec());
            assert!(got == want, "the {} kernel encodes differently", c.kernel());
        }
        if let Ok(out) = want {
            let mut back = vec![0u8; len];
            safe.decompress(&out, &mut back).expect("a page the safe kernel wrote");
            assert!(back == page, "round trip differs");
        }
    }
});
