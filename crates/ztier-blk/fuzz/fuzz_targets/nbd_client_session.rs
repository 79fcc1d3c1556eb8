//! The whole client against a server that sends arbitrary bytes: either
//! from the first byte (handshake fuzzing) or after a valid handshake
//! (reply fuzzing while reads, a write and a flush are in flight). The
//! client must return errors, never panic or hang, and a read that
//! succeeds returns exactly its length.
#![no_main]
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ztier_blk::client::{Client, ClientOptions};

static N: AtomicU64 = AtomicU64::new(0);

fn opt_reply(v: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    v.extend_from_slice(&0x0003_e889_0455_65a9u64.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let dir = std::env::temp_dir().join(format!("ztier-fuzz-client-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sock = dir.join(format!("s{}.sock", N.fetch_add(1, Ordering::Relaxed)));
    let l = UnixListener::bind(&sock).unwrap();
    let mut out = Vec::new();
    if sel & 1 == 0 {
        out.extend_from_slice(b"NBDMAGICIHAVEOPT");
        out.extend_from_slice(&3u16.to_be_bytes());
        if sel & 2 == 0 {
            opt_reply(&mut out, 8, 1, &[]); // structured replies: ACK
        } else {
            opt_reply(&mut out, 8, (1 << 31) + 1, &[]); // unsupported
        }
        let mut info = 0u16.to_be_bytes().to_vec();
        info.extend_from_slice(&(1u64 << 20).to_be_bytes());
        info.extend_from_slice(&(1u16 | 4 | 8 | 32 | 64 | 256).to_be_bytes());
        opt_reply(&mut out, 7, 3, &info);
        opt_reply(&mut out, 7, 1, &[]);
    }
    out.extend_from_slice(rest);
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = s.write_all(&out);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let opts = ClientOptions {
        connections: 1,
        timeout: Some(Duration::from_millis(500)),
        handshake_timeout: Duration::from_millis(500),
        reconnect_every: Duration::from_secs(3600),
    };
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    if let Ok(c) = Client::connect(&uri, opts) {
        let size = c.size();
        let mut b = vec![0u8; 8192];
        if size >= 8192 {
            let r = c.read(0, &mut b);
            if r.is_ok() {
                assert_eq!(b.len(), 8192);
            }
            let _ = c.write(0, &[7u8; 512], true);
            let _ = c.flush();
            let _ = c.read(4096, &mut b[..4096]);
        }
        c.close();
    }
    let _ = server.join();
    let _ = std::fs::remove_file(&sock);
});
