//! The journal of invalidations: before a write (or trim, or zeroing)
//! reaches the backing, a record "copies of these blocks older than
//! generation G are stale" goes to the cache device. After a crash,
//! recovery drops every line a record invalidates, so no line a later
//! write made stale is ever served.
//!
//! Records are written with `pwrite` before the backing is touched: a
//! killed server leaves them in the page cache, which the next start on
//! the same boot reads back. With `sync` (`--journal-sync`) they are also
//! on the device before the backing write is sent (group commit: one
//! `fdatasync` for every writer waiting then), which keeps the cache warm
//! across a power loss too; without it, a start after a reboot finds the
//! cache was served unsynced and starts cold.
//!
//! The journal is a ring of 512-byte sectors (format in [`crate::format`]);
//! a checkpoint makes the sectors before its `journal_head` free again.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use ztier_blk::backing::Backing;

use crate::format::{self, Invalidation, Superblock, RECORDS_PER_SECTOR, SECTOR};

/// Why an append failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Every sector is still needed: a checkpoint must free some first.
    #[error("the invalidation journal is full")]
    Full,
    /// Writing the journal failed.
    #[error("writing the invalidation journal: {0}")]
    Io(#[from] io::Error),
}

struct State {
    /// Sequence of the sector records go to now.
    seq: u64,
    /// Its records so far.
    recs: Vec<Invalidation>,
    /// Oldest sector still needed (the last checkpoint's head).
    head: u64,
    /// A write failed: nothing more can be recorded.
    failed: Option<String>,
}

/// The journal.
pub struct Journal {
    dev: Arc<dyn Backing>,
    sb: Superblock,
    sync: bool,
    st: Mutex<State>,
    /// Appends so far (records).
    appended: AtomicU64,
    /// In sync mode: every append up to this position is on the device.
    durable: AtomicU64,
    /// Held through a group commit's `fdatasync` (milliseconds): a std
    /// mutex, whose waiters sleep on a futex; `parking_lot`'s would call
    /// `sched_yield` about ten times each first (a context switch each
    /// with the write-back threads all waiting here).
    sync_lock: std::sync::Mutex<()>,
    syncs: AtomicU64,
}

/// Where an append ended, to wait for its durability.
#[derive(Debug, Clone, Copy)]
pub struct Ticket(u64);

/// Journal counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct JournalStats {
    /// Records appended.
    pub records: u64,
    /// Sectors in use (since the last checkpoint).
    pub sectors_used: u64,
    /// Sectors in the ring.
    pub sectors: u64,
    /// fdatasync calls for group commits.
    pub syncs: u64,
    /// Whether records are synced before each backing write.
    pub sync: bool,
}

impl Journal {
    /// A journal that appends from sector `next` on and still needs the
    /// sectors from `head`.
    pub fn new(dev: Arc<dyn Backing>, sb: &Superblock, sync: bool, head: u64, next: u64) -> Journal {
        Journal {
            dev,
            sb: *sb,
            sync,
            st: Mutex::new(State { seq: next, recs: Vec::new(), head, failed: None }),
            appended: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            sync_lock: std::sync::Mutex::new(()),
            syncs: AtomicU64::new(0),
        }
    }

    /// Appends records and writes them out (not synced: see [`Journal::wait`]).
    pub fn append(&self, recs: &[Invalidation]) -> Result<Ticket, JournalError> {
        let mut st = self.st.lock();
        if let Some(why) = &st.failed {
            return Err(JournalError::Io(io::Error::other(format!("the journal failed earlier: {why}"))));
        }
        let n = self.sb.journal_sectors();
        // Room: every record fits in the current sector or in new ones
        // that do not reach the head.
        let need_new = (st.recs.len() + recs.len()).div_ceil(RECORDS_PER_SECTOR).saturating_sub(1) as u64;
        if st.seq + need_new - st.head >= n {
            return Err(JournalError::Full);
        }
        for r in recs {
            if st.recs.len() == RECORDS_PER_SECTOR {
                st.seq += 1;
                st.recs.clear();
            }
            st.recs.push(*r);
            if st.recs.len() == RECORDS_PER_SECTOR {
                self.write_sector(&mut st)?;
            }
        }
        if st.recs.len() < RECORDS_PER_SECTOR {
            self.write_sector(&mut st)?;
        }
        let pos = self.appended.fetch_add(recs.len() as u64, Ordering::AcqRel) + recs.len() as u64;
        Ok(Ticket(pos))
    }

    fn write_sector(&self, st: &mut State) -> Result<(), JournalError> {
        let b = format::encode_sector(st.seq, self.sb.uuid, &st.recs);
        if let Err(e) = self.dev.write_at(&b, self.sb.sector_offset(st.seq)) {
            st.failed = Some(e.to_string());
            return Err(e.into());
        }
        Ok(())
    }

    /// In sync mode, returns once the append `t` is on the device (one
    /// `fdatasync` covers every append made before it); else at once.
    pub fn wait(&self, t: Ticket) -> Result<(), JournalError> {
        if !self.sync || self.durable.load(Ordering::Acquire) >= t.0 {
            return Ok(());
        }
        let _g = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.durable.load(Ordering::Acquire) >= t.0 {
            return Ok(());
        }
        let upto = self.appended.load(Ordering::Acquire);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.dev.sync() {
            self.st.lock().failed = Some(e.to_string());
            return Err(e.into());
        }
        self.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// The sector records go to now (a checkpoint's `journal_head`).
    pub fn position(&self) -> u64 {
        self.st.lock().seq
    }

    /// Frees the sectors before `head` (after a checkpoint that needs
    /// only those from `head` on is on the device).
    pub fn set_head(&self, head: u64) {
        let mut st = self.st.lock();
        st.head = st.head.max(head);
    }

    /// Fraction of the ring in use.
    pub fn fill(&self) -> f64 {
        let st = self.st.lock();
        (st.seq + 1 - st.head) as f64 / self.sb.journal_sectors() as f64
    }

    /// Counters.
    pub fn stats(&self) -> JournalStats {
        let st = self.st.lock();
        JournalStats {
            records: self.appended.load(Ordering::Relaxed),
            sectors_used: st.seq + 1 - st.head,
            sectors: self.sb.journal_sectors(),
            syncs: self.syncs.load(Ordering::Relaxed),
            sync: self.sync,
        }
    }

    /// Whether a write to the journal has failed.
    pub fn failed(&self) -> Option<String> {
        self.st.lock().failed.clone()
    }
}

/// Reads the journal from `head` on: the records of every sector whose
/// seq follows on, and the sequence the next append should use.
pub fn replay(dev: &dyn Backing, sb: &Superblock, head: u64) -> io::Result<(Vec<Invalidation>, u64)> {
    let n = sb.journal_sectors();
    let mut area = vec![0u8; sb.journal_size as usize];
    dev.read_at(&mut area, sb.journal_off)?;
    let mut recs = Vec::new();
    let mut seq = head;
    while seq < head + n {
        let i = (seq % n) as usize * SECTOR;
        match format::decode_sector(&area[i..i + SECTOR]) {
            Some((s, uuid, r)) if s == seq && uuid == sb.uuid => {
                recs.extend(r);
                seq += 1;
            }
            _ => break,
        }
    }
    Ok((recs, seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Geometry, Placement, Policy};
    use ztier_blk::backing::CrashBacking;

    fn sb() -> Superblock {
        Geometry {
            size: 8 << 20,
            segment_size: 64 << 10,
            lines_per_block: 2.0,
            placement: Placement::Direct,
            ways: 1,
            policy: Policy::Clock,
            codec: 0,
            journal_size: None,
        }
        .superblock(5, 0)
        .unwrap()
    }

    #[test]
    fn appends_replay_in_order_and_fill_up() {
        let sb = sb();
        let dev = Arc::new(CrashBacking::from_image(vec![0u8; sb.device_size() as usize]));
        let j = Journal::new(dev.clone(), &sb, true, 10, 10);
        let mut all = Vec::new();
        for g in 0..100u64 {
            let r = Invalidation { gen: g, lba: g * 3, n: 1 + g % 5 };
            let t = j.append(&[r]).unwrap();
            j.wait(t).unwrap();
            all.push(r);
        }
        // Synced: a crash that drops every unsynced write keeps them all.
        let img = dev.crash(|_, _| 0);
        let (recs, next) = replay(&CrashBacking::from_image(img), &sb, 10).unwrap();
        assert_eq!(recs, all);
        assert_eq!(next, 10 + 100u64.div_ceil(RECORDS_PER_SECTOR as u64));
        // Replay from another head finds nothing (sequence mismatch).
        assert!(replay(&*dev, &sb, 3).unwrap().0.is_empty());
        // Fill the ring; a checkpoint's head frees it again.
        let n = sb.journal_sectors();
        let r = Invalidation { gen: 1, lba: 1, n: 1 };
        let mut k = 0;
        loop {
            match j.append(&[r]) {
                Ok(_) => k += 1,
                Err(JournalError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(k as u64 >= (n - 5) * RECORDS_PER_SECTOR as u64, "{k}");
        j.set_head(j.position());
        j.append(&[r]).unwrap();
    }
}
