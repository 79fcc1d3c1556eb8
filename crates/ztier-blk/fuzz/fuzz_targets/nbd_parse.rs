//! The option and request parsers never panic and agree with themselves.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ztier_blk::nbd::{self, Request, Session};

fuzz_target!(|data: &[u8]| {
    if let Some(g) = nbd::parse_go(data) {
        assert!(g.name.len() <= nbd::MAX_STRING);
    }
    if let Some(m) = nbd::parse_meta(data) {
        for q in &m.queries {
            let _ = nbd::selects_base_allocation(q, true);
        }
    }
    if data.len() >= nbd::REQUEST_LEN + 11 {
        let hdr: [u8; nbd::REQUEST_LEN] = data[..nbd::REQUEST_LEN].try_into().unwrap();
        let rest = &data[nbd::REQUEST_LEN..];
        let req = Request::parse(&hdr).unwrap_or(Request {
            flags: u16::from_le_bytes([hdr[4], hdr[5]]),
            kind: u16::from_le_bytes([hdr[6], hdr[7]]) % 10,
            cookie: 1,
            offset: u64::from_le_bytes(hdr[8..16].try_into().unwrap()),
            length: u32::from_le_bytes(hdr[16..20].try_into().unwrap()),
        });
        assert_eq!(Request::parse(&req.encode()), Some(req));
        let s = Session {
            size: u64::from_le_bytes(rest[..8].try_into().unwrap()) % (1 << 40),
            flags: u16::from_le_bytes([rest[8], rest[9]]),
            structured: rest[10] & 1 != 0,
            base_allocation: rest[10] & 2 != 0,
        };
        if nbd::validate(&req, &s).is_ok() && req.kind != nbd::cmd::FLUSH && req.kind != nbd::cmd::DISC {
            assert!(req.offset.checked_add(req.length as u64).is_some_and(|e| e <= s.size));
        }
        // Descriptors cover the range exactly, or one descriptor with REQ_ONE.
        let bs = 4096u64;
        let (off, len) = (req.offset % (1 << 20), (req.length % (1 << 18)).max(1));
        let blocks = ((off + len as u64 - 1) / bs - off / bs + 1) as usize;
        let flags: Vec<u32> = (0..blocks).map(|i| (rest[i % rest.len()] & 3) as u32).collect();
        let d = nbd::status_descriptors(off, len, bs, &flags, false);
        assert_eq!(d.iter().map(|x| x.0 as u64).sum::<u64>(), len as u64);
        let one = nbd::status_descriptors(off, len, bs, &flags, true);
        assert!(one.len() == 1 && one[0].0 <= len);
    }
});
