//! Whole connections from arbitrary bytes: handshake, options, requests,
//! payloads, against a real engine on an in-memory device. The server
//! must neither panic nor hang, and the image must stay consistent.
#![no_main]
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use ztier_blk::backing::CrashBacking;
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_blk::server::{self, Conn, ServeConfig, ServerStats};

fn engine() -> &'static Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        let o = CreateOptions {
            logical_size: 1 << 20,
            block_size: 4096,
            extent_size: 16384,
            codec: ztier_codec::CodecId::Lz4,
            physical: None,
        };
        Arc::new(Engine::create(Box::new(CrashBacking::new()), &o).unwrap())
    })
}

fuzz_target!(|data: &[u8]| {
    let (mut client, srv) = UnixStream::pair().unwrap();
    let drain = {
        let mut c = client.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
        })
    };
    // The client's flags (fixed newstyle), then: with an odd first byte the
    // fuzzer's bytes as they are (handshake fuzzing); with an even one a
    // valid handshake (structured replies, base:allocation, GO) followed by
    // requests built from 16-byte records (right magic, fuzzed fields,
    // write payloads from the input), so the transmission phase is reached.
    let mut input = 1u32.to_be_bytes().to_vec();
    match data.split_first() {
        Some((&b, rest)) if b & 1 == 0 => {
            let opt = |v: &mut Vec<u8>, o: u32, d: &[u8]| {
                v.extend_from_slice(b"IHAVEOPT");
                v.extend_from_slice(&o.to_be_bytes());
                v.extend_from_slice(&(d.len() as u32).to_be_bytes());
                v.extend_from_slice(d);
            };
            if b & 2 == 0 {
                opt(&mut input, 8, &[]);
                let mut m = 0u32.to_be_bytes().to_vec();
                m.extend_from_slice(&1u32.to_be_bytes());
                m.extend_from_slice(&15u32.to_be_bytes());
                m.extend_from_slice(b"base:allocation");
                opt(&mut input, 10, &m);
            }
            opt(&mut input, 7, &[0, 0, 0, 0, 0, 0]);
            let mut rest = rest;
            while rest.len() >= 16 {
                let (r, tail) = rest.split_at(16);
                let kind = (r[0] % 9) as u16;
                let flags = if r[1] & 0x80 != 0 { r[1] as u16 } else { (r[1] & 0x1f) as u16 };
                let offset = u64::from_le_bytes(r[2..10].try_into().unwrap()) % (1 << 21);
                let length = u32::from_le_bytes(r[10..14].try_into().unwrap()) % (1 << 18);
                let req = ztier_blk::nbd::Request { flags, kind, cookie: r[14] as u64, offset, length };
                input.extend_from_slice(&req.encode());
                if kind == 1 {
                    let n = (length as usize).min(tail.len());
                    input.extend_from_slice(&tail[..n]);
                    input.extend(std::iter::repeat(r[15]).take(length as usize - n));
                }
                rest = tail;
            }
        }
        Some((_, rest)) => input.extend_from_slice(rest),
        None => {}
    }
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = client.write_all(&input);
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    let cfg = ServeConfig { name: "ztier".into(), description: String::new(), read_only: false, threads: 2 };
    let _ = server::handle(Conn::Unix(srv), engine(), &cfg, &Arc::new(ServerStats::default()));
    let _ = writer.join();
    let _ = drain.join();
    assert!(engine().check().unwrap().is_empty());
});
