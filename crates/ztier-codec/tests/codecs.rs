//! Properties every codec must have, and cross-checks of the library-backed
//! codecs against independent implementations of their formats.

use proptest::prelude::*;
use ztier_codec::corpus::{synth, Corpus};
use ztier_codec::page::{Form, PageEncoder};
use ztier_codec::{new_codec, Codec, CodecId, CompressError, PAGE_SIZE};

/// The codecs these generic tests cover: every one.
fn codecs() -> Vec<CodecId> {
    CodecId::ALL.to_vec()
}

fn round_trip(id: CodecId, data: &[u8]) {
    let mut c = new_codec(id);
    let mut out = vec![0xeeu8; c.max_compressed_len(data.len())];
    let n = c.compress(data, &mut out).unwrap_or_else(|e| panic!("{id}: compress: {e}"));
    assert!(n <= out.len());
    let mut back = vec![0x11u8; data.len()];
    c.decompress(&out[..n], &mut back).unwrap_or_else(|e| panic!("{id}: decompress: {e}"));
    assert!(back == data, "{id}: round trip differs");
    // The tagged form (a tag kept beside the data): at most as long, and
    // it decodes under its tag only.
    let mut c = new_codec(id);
    let (m, tag) = c.compress_tagged(data, &mut out).unwrap_or_else(|e| panic!("{id}: compress_tagged: {e}"));
    assert!(m <= n, "{id}: tagged output {m} longer than {n}");
    back.fill(0x11);
    c.decompress_tagged(tag, &out[..m], &mut back).unwrap_or_else(|e| panic!("{id}: decompress_tagged: {e}"));
    assert!(back == data, "{id}: tagged round trip differs");
    let other = if tag == CodecId::Zstd { CodecId::Lzo } else { CodecId::Zstd };
    assert!(c.decompress_tagged(other, &out[..m], &mut back).is_err(), "{id}: decoded under tag {other}");
}

fn word_data() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        3 => Just(0u32),
        3 => 0u32..1024,
        3 => (0u32..(1 << 20)).prop_map(|x| 0x5555_0000 | (x << 2)),
        1 => any::<u32>(),
    ];
    prop::collection::vec(word, 1..=4096).prop_map(|ws| ws.iter().flat_map(|w| w.to_le_bytes()).collect())
}

fn byte_data() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..=2048).prop_map(|mut v| {
        v.truncate(v.len() / 4 * 4);
        if v.is_empty() {
            v.extend_from_slice(&[1, 2, 3, 4]);
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_codec_round_trips_word_data(data in word_data()) {
        for id in codecs() {
            round_trip(id, &data);
        }
    }

    #[test]
    fn every_codec_round_trips_random_bytes(data in byte_data()) {
        for id in codecs() {
            round_trip(id, &data);
        }
    }

    #[test]
    fn decoders_never_panic_on_garbage(data in prop::collection::vec(any::<u8>(), 0..600), words in 1usize..2048) {
        for id in codecs() {
            let mut c = new_codec(id);
            let mut out = vec![0u8; words * 4];
            let _ = c.decompress(&data, &mut out);
        }
    }
}

#[test]
fn every_codec_round_trips_edge_sizes_and_fills() {
    let mut rng = synth::Rng::new(3);
    for len in [4usize, 8, 12, 60, 4096, 4100, 65532, 65536] {
        let mut buf = vec![0u8; len + 4];
        synth::fill(&mut buf[..(len + 4) / 8 * 8], synth::Kind::Pointers, &mut rng);
        buf.truncate(len);
        for id in codecs() {
            round_trip(id, &buf);
            round_trip(id, &vec![0u8; len]);
            round_trip(id, &vec![0x5au8; len]);
        }
    }
}

#[test]
fn every_codec_round_trips_synthetic_kinds() {
    for (i, kind) in synth::KINDS.iter().enumerate() {
        let p = synth::page(*kind, i as u64);
        for id in codecs() {
            round_trip(id, &p);
        }
    }
}

#[test]
fn invalid_lengths_are_errors_not_panics() {
    for id in codecs() {
        let mut c = new_codec(id);
        let mut out = vec![0u8; 70000];
        for len in [0usize, 3, 4097, 65540] {
            let src = vec![1u8; len];
            assert!(
                matches!(c.compress(&src, &mut out), Err(CompressError::InvalidLength { .. })),
                "{id} accepted length {len}"
            );
        }
        let mut bad = vec![0u8; 6];
        assert!(c.decompress(&[1, 2, 3], &mut bad).is_err(), "{id} decoded into 6 bytes");
    }
}

#[test]
fn small_output_buffers_give_overflow_never_a_partial_write_past_the_end() {
    let page = synth::page(synth::Kind::Random, 9);
    for id in codecs() {
        let mut c = new_codec(id);
        for cap in [0usize, 1, 16, 1000, 3072] {
            let mut out = vec![0u8; cap + 64];
            out[cap..].fill(0xcd);
            let r = c.compress(&page, &mut out[..cap]);
            assert!(matches!(r, Err(CompressError::Overflow { .. })), "{id} cap {cap}: {r:?}");
            assert!(out[cap..].iter().all(|&b| b == 0xcd), "{id} wrote past {cap}");
        }
    }
}

#[test]
fn truncated_and_flipped_outputs_are_errors_or_different_never_panics() {
    let page = synth::page(synth::Kind::Pointers, 5);
    for id in codecs() {
        let mut c = new_codec(id);
        let mut out = vec![0u8; c.max_compressed_len(PAGE_SIZE)];
        let n = c.compress(&page, &mut out).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        for cut in 0..n {
            if c.decompress(&out[..cut], &mut back).is_ok() {
                // Some formats end in bytes the decoder does not need; the
                // result must still be the page then.
                assert!(back == page, "{id}: truncation at {cut} decoded to a wrong page");
            }
        }
        let mut rng = synth::Rng::new(11);
        for _ in 0..300 {
            let mut bad = out[..n].to_vec();
            let at = rng.below(n as u64) as usize;
            bad[at] ^= 1 << rng.below(8);
            let _ = c.decompress(&bad, &mut back);
        }
    }
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

#[test]
fn every_corpus_page_round_trips_through_the_page_encoder() {
    let dir = corpus_dir();
    let files: Vec<_> =
        ["python-dict.pages", "python-sqlite.pages", "gcc-cc1.pages"].iter().map(|f| dir.join(f)).collect();
    for f in &files {
        assert!(f.exists(), "corpus file {} is missing (CI provides ../shared/corpus)", f.display());
    }
    let corpus = Corpus::load(&files).unwrap();
    let mut out = vec![0u8; PAGE_SIZE];
    let mut back = vec![0u8; PAGE_SIZE];
    // Hybrid also as the page store runs it: the inner codec's tag, no trailer.
    for (id, tagged) in codecs().into_iter().map(|id| (id, false)).chain([(CodecId::Hybrid, true)]) {
        let mut enc = if tagged { PageEncoder::new(id).inner_tags() } else { PageEncoder::new(id) };
        let (mut compressed, mut raw) = (0, 0);
        for p in corpus.pages() {
            let e = enc.encode(p, &mut out).unwrap();
            match e.form {
                Form::Compressed(_) => compressed += 1,
                Form::Raw => raw += 1,
                _ => {}
            }
            assert!(e.len <= enc.limit(PAGE_SIZE) || e.form == Form::Raw);
            enc.decode(e.form, &out[..e.len], &mut back).unwrap();
            assert!(back == p, "{id}: corpus page differs after round trip");
        }
        if id != CodecId::Raw {
            assert!(
                compressed > corpus.len() / 2,
                "{id}: only {compressed} of {} pages compressed",
                corpus.len()
            );
        } else {
            assert_eq!(raw, corpus.len());
        }
    }
}

#[test]
fn hybrids_lz4_writes_liblz4s_bytes_on_every_corpus_page() {
    let dir = corpus_dir();
    let files: Vec<_> =
        ["python-dict.pages", "python-sqlite.pages", "gcc-cc1.pages"].iter().map(|f| dir.join(f)).collect();
    let corpus = Corpus::load(&files).expect("the corpus files (CI provides ../shared/corpus)");
    let mut ours = ztier_codec::lz4page::Lz4Page::new();
    let mut lib = new_codec(CodecId::Lz4);
    let bound = lib.max_compressed_len(PAGE_SIZE);
    let (mut a, mut b) = (vec![0u8; bound], vec![0u8; bound]);
    for (i, p) in corpus.pages().enumerate() {
        // Room for any output, the page encoder's 3/4 limit, and one byte
        // short of liblz4's output (both must refuse).
        let full = lib.compress(p, &mut b).unwrap();
        for cap in [bound, PAGE_SIZE * 3 / 4, full - 1] {
            let x = ours.compress(p, &mut a[..cap]).ok().map(|n| a[..n].to_vec());
            let y = lib.compress(p, &mut b[..cap]).ok().map(|n| b[..n].to_vec());
            assert!(x == y, "page {i}, room {cap}: lz4page and liblz4 differ");
        }
    }
}

// ---- cross-checks against independent implementations of each format ----

fn cross_pages() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = synth::KINDS.iter().map(|k| synth::page(*k, 1)).collect();
    let f = corpus_dir().join("python-dict.pages");
    let c = Corpus::load(&[f]).expect("corpus file python-dict.pages (CI provides ../shared/corpus)");
    v.extend(c.pages().step_by(97).map(|p| p.to_vec()));
    v
}

#[test]
fn lz4_interoperates_with_lz4_flex() {
    let mut c = new_codec(CodecId::Lz4);
    for p in cross_pages() {
        let mut out = vec![0u8; c.max_compressed_len(p.len())];
        let n = c.compress(&p, &mut out).unwrap();
        assert_eq!(lz4_flex::block::decompress(&out[..n], p.len()).unwrap(), p);
        let other = lz4_flex::block::compress(&p);
        let mut back = vec![0u8; p.len()];
        c.decompress(&other, &mut back).unwrap();
        assert_eq!(back, p);
    }
}

#[test]
fn zstd_output_decodes_with_ruzstd_and_c_streaming_frames_decode_here() {
    use std::io::Read;
    let mut c = new_codec(CodecId::Zstd);
    for p in cross_pages() {
        let mut out = vec![0u8; c.max_compressed_len(p.len())];
        let n = c.compress(&p, &mut out).unwrap();
        let mut dec = ruzstd::decoding::StreamingDecoder::new(&out[..n]).unwrap();
        let mut got = Vec::new();
        dec.read_to_end(&mut got).unwrap();
        assert_eq!(got, p);
        // A frame from the C library's streaming API, with checksum and size.
        let frame = zstd::stream::encode_all(&p[..], 3).unwrap();
        let mut back = vec![0u8; p.len()];
        c.decompress(&frame, &mut back).unwrap();
        assert_eq!(back, p);
    }
}

#[test]
fn deflate_interoperates_with_c_zlib() {
    use std::io::{Read, Write};
    let mut c = new_codec(CodecId::Deflate);
    for p in cross_pages() {
        let mut out = vec![0u8; c.max_compressed_len(p.len())];
        let n = c.compress(&p, &mut out).unwrap();
        let mut got = Vec::new();
        flate2::read::DeflateDecoder::new(&out[..n]).read_to_end(&mut got).unwrap();
        assert_eq!(got, p);
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        enc.write_all(&p).unwrap();
        let z = enc.finish().unwrap();
        let mut back = vec![0u8; p.len()];
        c.decompress(&z, &mut back).unwrap();
        assert_eq!(back, p);
    }
}

#[test]
fn lz4_acceleration_and_zstd_negative_levels_work() {
    use ztier_codec::Codec;
    let p = synth::corpus(20, 2);
    let mut sizes = Vec::new();
    for acc in [1, 8, 64] {
        let mut c = ztier_codec::lz4::Lz4::new(acc);
        let mut total = 0;
        for page in p.pages() {
            let mut out = vec![0u8; 5000];
            let n = c.compress(page, &mut out).unwrap();
            let mut back = vec![0u8; PAGE_SIZE];
            c.decompress(&out[..n], &mut back).unwrap();
            assert_eq!(back, page);
            total += n;
        }
        sizes.push(total);
    }
    assert!(sizes[0] <= sizes[1] && sizes[1] <= sizes[2], "acceleration should trade ratio: {sizes:?}");
    for level in [-5, -1, 1, 3] {
        let mut c = ztier_codec::zstd::Zstd::new(level);
        for page in p.pages() {
            let mut out = vec![0u8; 5000];
            let n = c.compress(page, &mut out).unwrap();
            let mut back = vec![0u8; PAGE_SIZE];
            c.decompress(&out[..n], &mut back).unwrap();
            assert_eq!(back, page);
        }
    }
}
