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
    // The client's flags (fixed newstyle) then the fuzzer's bytes.
    let mut input = 1u32.to_be_bytes().to_vec();
    input.extend_from_slice(data);
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = client.write_all(&input);
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    let cfg = ServeConfig { name: "ztier".into(), description: String::new(), read_only: false, threads: 2 };
    let _ = server::handle(Conn::Unix(srv), engine(), &cfg, &ServerStats::default());
    let _ = writer.join();
    let _ = drain.join();
    assert!(engine().check().unwrap().is_empty());
});
