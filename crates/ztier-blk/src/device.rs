//! What the NBD server serves: any block device with these operations.
//! The compressed engine is one ([`crate::engine::Engine`]); the cache of
//! `ztier-cache` (a compressed cache in front of slow storage) is another.

use crate::engine::{BlkError, BlockState, Engine};

/// A device the server can export. Every method takes `&self`: one
/// device is shared by every connection and worker thread.
pub trait Device: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Preferred block size (sent as the preferred size in NBD_INFO_BLOCK_SIZE).
    fn block_size(&self) -> usize;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// Whether a write can never fail for lack of space (block status then
    /// reports written blocks as allocated).
    fn provisioned(&self) -> bool {
        true
    }
    /// Reads `buf.len()` bytes at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BlkError>;
    /// Writes `data` at `off`; with `fua`, durable on return.
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), BlkError>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), BlkError>;
    /// Discards `[off, off + len)` (advisory).
    fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), BlkError>;
    /// Writes zeros over `[off, off + len)`; with `fast`, fails with
    /// [`BlkError::NotFast`] rather than write them slowly.
    fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> Result<(), BlkError>;
    /// The state of each block in `[lba, lba + n)` (blocks of [`Device::block_size`]).
    fn block_states(&self, _lba: u64, n: u64) -> Vec<BlockState> {
        vec![BlockState::Data; n as usize]
    }
    /// Background work, called by the server about every 100 ms.
    fn maintain(&self) {}
    /// Serves a read at once if that needs no waiting (all of it cached
    /// in memory, say): the server then answers it from the connection's
    /// own thread, without handing it to a worker. `None`: read it the
    /// ordinary way.
    fn read_fast(&self, _off: u64, _buf: &mut [u8]) -> Option<Result<(), BlkError>> {
        None
    }
    /// Work the requests this thread served left for after their replies
    /// (a cache's fills of the blocks it read from the backing). The
    /// server's workers call it once a reply is sent; whoever calls
    /// [`Device::read`] must call it after.
    fn after_reply(&self) {}
    /// Serves a write at once if that needs no waiting (a write-back
    /// cache taking it into memory and its cache device's page cache,
    /// say): the server then answers it from the connection's own thread.
    /// `None`: nothing was done; write it the ordinary way.
    fn write_fast(&self, _off: u64, _data: &[u8], _fua: bool) -> Option<Result<(), BlkError>> {
        None
    }
}

impl Device for Engine {
    fn size(&self) -> u64 {
        Engine::size(self)
    }
    fn block_size(&self) -> usize {
        Engine::block_size(self)
    }
    fn read_only(&self) -> bool {
        Engine::read_only(self)
    }
    fn provisioned(&self) -> bool {
        Engine::provisioned(self)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BlkError> {
        Engine::read(self, off, buf)
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), BlkError> {
        Engine::write(self, off, data, fua)
    }
    fn flush(&self) -> Result<(), BlkError> {
        Engine::flush(self)
    }
    fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), BlkError> {
        Engine::trim(self, off, len, fua)
    }
    fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> Result<(), BlkError> {
        Engine::write_zeroes(self, off, len, fast, fua)
    }
    fn block_states(&self, lba: u64, n: u64) -> Vec<BlockState> {
        Engine::block_states(self, lba, n)
    }
    /// Seals aged extent buffers, runs the cleaner when free extents run
    /// low and takes a due checkpoint: once a server maintains the engine,
    /// FLUSH leaves due checkpoints to this (see
    /// [`Engine::set_background_checkpoints`]).
    fn maintain(&self) {
        if Engine::read_only(self) {
            return;
        }
        self.set_background_checkpoints(true);
        let _ = self.seal_aged(std::time::Duration::from_secs(1));
        if self.needs_cleaning() {
            let _ = self.clean(false);
        }
        // A failed checkpoint poisons the engine (requests then fail with
        // EIO); it is said once.
        if let Err(e) = self.checkpoint_if_due() {
            if self.first_checkpoint_failure() {
                eprintln!("ztier blk: checkpoint failed: {e}");
            }
        }
    }
}
