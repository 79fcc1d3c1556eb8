//! What a served cache reports live: `ztier cache stats` of a served
//! cache (its control socket) and the Prometheus endpoint, through
//! `ztier_blk::live`.

use std::sync::Arc;

use ztier_blk::live::{Prom, Report};
use ztier_blk::server::ServerStats;

use crate::Cache;

/// The cache's statistics plus the NBD server's live counters.
pub struct CacheReport {
    /// The cache served.
    pub cache: Arc<Cache>,
    /// The server's counters.
    pub server: Arc<ServerStats>,
    /// The cache device's path, as given.
    pub path: String,
}

impl Report for CacheReport {
    fn stats(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self.cache.stats()).unwrap_or_default();
        let mut live = self.server.json();
        live.insert("cache".into(), self.path.clone().into());
        if let Some(o) = v.as_object_mut() {
            // The cache's own counters keep their names; the server's
            // request counters go under "server".
            o.insert("served".into(), true.into());
            o.insert("pid".into(), std::process::id().into());
            o.insert("cache".into(), self.path.clone().into());
            o.insert("server".into(), serde_json::Value::Object(live));
        }
        v
    }

    fn prometheus(&self, w: &mut Prom) {
        let s = self.cache.stats();
        let l = [("cache", self.path.as_str())];
        let with = |k: &'static str, v: &'static str| [l[0], (k, v)];
        self.server.prometheus(w, "cache", &l);
        for (r, n) in [
            ("ram_hit", s.ram_hits),
            ("ssd_hit", s.ssd_hits),
            ("remote_hit", s.remote.as_ref().map_or(0, |r| r.hits)),
            ("miss", s.misses),
        ] {
            w.counter(
                "cache_blocks_read_total",
                "blocks read, by where they came from",
                &with("result", r),
                n as f64,
            );
        }
        w.gauge("cache_hit_ratio", "RAM + SSD hits / blocks looked up, since start", &l, s.hit_ratio);
        w.counter("cache_blocks_written_total", "blocks written by clients", &l, s.written_blocks as f64);
        for (lv, n) in [("ssd", s.ssd_fills), ("ram", s.ram_fills)] {
            w.counter("cache_fills_total", "blocks put in a cache level", &with("level", lv), n as f64);
        }
        w.counter(
            "cache_write_through_fills_total",
            "SSD fills of written blocks",
            &l,
            s.write_through_fills as f64,
        );
        for (why, n) in [
            ("race", s.fills_dropped_race),
            ("queue", s.fills_dropped_queue),
            ("space", s.fills_dropped_space),
        ] {
            w.counter("cache_fills_dropped_total", "fills not made, by reason", &with("why", why), n as f64);
        }
        for (op, n) in [("read", s.bypassed_read_blocks), ("write", s.bypassed_write_blocks)] {
            w.counter(
                "cache_bypassed_blocks_total",
                "blocks of sequential streams around the cache",
                &with("op", op),
                n as f64,
            );
        }
        w.counter(
            "cache_invalidated_lines_total",
            "lines dropped by writes, trims, zeroing",
            &l,
            s.invalidated_lines as f64,
        );
        for (why, n) in [("conflict", s.conflict_evictions), ("capacity", s.capacity_evictions)] {
            w.counter("cache_evictions_total", "lines dropped to make room", &with("why", why), n as f64);
        }
        w.counter(
            "cache_reinserted_total",
            "lines copied forward when their segment was recycled",
            &l,
            s.reinserted as f64,
        );
        w.gauge("cache_lines", "directory lines", &l, s.lines as f64);
        w.gauge("cache_lines_used", "lines holding a block", &l, s.lines_used as f64);
        w.gauge("cache_cached_bytes", "logical bytes on the SSD level", &l, s.cached_bytes as f64);
        w.gauge("cache_stored_bytes", "bytes the items take on the cache device", &l, s.stored_bytes as f64);
        w.gauge(
            "cache_saved_bytes",
            "SSD bytes the cached lines do not take thanks to compression",
            &l,
            s.bytes_saved as f64,
        );
        w.gauge("cache_compression_ratio", "4096 per item / bytes it takes", &l, s.ratio);
        w.gauge("cache_metadata_bytes", "RAM for the SSD level's metadata", &l, s.metadata_bytes as f64);
        w.gauge(
            "cache_metadata_bytes_per_cached_block",
            "RAM for metadata per cached block",
            &l,
            s.metadata_bytes_per_cached_block,
        );
        for (what, n) in [
            ("verify", s.verify_failures),
            ("cache_read", s.cache_read_errors),
            ("cache_write", s.cache_write_errors),
            ("backing", s.backing_errors),
        ] {
            w.counter("cache_errors_total", "failures, by where", &with("what", what), n as f64);
        }
        w.counter("cache_checkpoints_total", "checkpoints written", &l, s.checkpoints as f64);
        w.counter("cache_journal_records_total", "invalidations recorded", &l, s.journal.records as f64);
        w.counter("cache_journal_syncs_total", "journal group commits", &l, s.journal.syncs as f64);
        w.gauge(
            "cache_degraded",
            "1 if the SSD level is off or degraded",
            &l,
            f64::from(u8::from(s.degraded.is_some())),
        );
        if let Some(r) = &s.ram {
            w.gauge("cache_ram_configured_bytes", "RAM cache size asked for", &l, r.configured_bytes as f64);
            w.gauge("cache_ram_budget_bytes", "RAM cache budget now", &l, r.budget_bytes as f64);
            w.gauge("cache_ram_used_bytes", "memory the RAM cache uses", &l, r.memory_used as f64);
            w.gauge("cache_ram_blocks", "blocks in the RAM cache", &l, r.blocks as f64);
        }
        if let Some(p) = &s.pressure {
            w.counter(
                "cache_ram_shrinks_total",
                "times memory pressure cut the RAM cache",
                &l,
                p.shrinks as f64,
            );
        }
        let lat = self.cache.latencies();
        for (lv, h) in
            [("ram", &lat.ram_hit), ("ssd", &lat.ssd_hit), ("remote", &lat.remote_hit), ("miss", &lat.miss)]
        {
            w.histogram(
                "cache_read_service_seconds",
                "read served inside the server, by level",
                &with("level", lv),
                h,
            );
        }
        w.histogram("cache_write_service_seconds", "write served inside the server", &l, &lat.write);
    }
}
