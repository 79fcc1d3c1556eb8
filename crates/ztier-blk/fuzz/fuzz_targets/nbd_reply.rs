//! The client's reply parser on arbitrary bytes, against requests in
//! flight: it never panics, and a read it completes without error was
//! covered byte for byte by data and hole chunks inside its range.
#![no_main]
use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use ztier_blk::client::{read_reply, Slot};
use ztier_blk::nbd::cmd;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let structured = sel & 1 == 0;
    // Requests in flight: reads of assorted ranges, a write, a flush.
    let reqs = [
        (1u64, cmd::READ, 0u64, 4096u32),
        (2, cmd::READ, 1000, 3000),
        (3, cmd::WRITE, 0, 512),
        (4, cmd::FLUSH, 0, 0),
        (5, cmd::READ, 1 << 40, 65536),
        (6, cmd::READ, 0, 0),
    ];
    let slots: Vec<(u64, Arc<Slot>)> =
        reqs.iter().map(|&(c, k, o, l)| (c, Slot::new(k, o, l))).collect();
    let mut map: HashMap<u64, Arc<Slot>> = slots.iter().cloned().collect();
    let mut r = Cursor::new(rest);
    for _ in 0..64 {
        let res = read_reply(&mut r, structured, |c, done| if done { map.remove(&c) } else { map.get(&c).cloned() });
        if res.is_err() {
            break;
        }
    }
    for (c, s) in &slots {
        let st = s.st.lock().unwrap();
        let len = reqs.iter().find(|x| x.0 == *c).unwrap().3 as usize;
        if st.kind == cmd::READ {
            assert_eq!(st.data.len(), len, "the read buffer keeps its length");
            if st.done && st.error.is_none() {
                assert!(st.coverage.complete(), "a completed read is fully covered");
            }
        }
    }
});
