//! A write-back case proptest shrank (issue 71): whole blocks written
//! dirty, some written back by a trim and zeroing, reads, then the final
//! write-back of every dirty block.

use super::{Config, Op};

/// Its configuration and operations.
pub fn case() -> (Config, Vec<Op>) {
    use Op::*;
    (
        Config {
            direct: false,
            policy_lru: true,
            raw: true,
            ram: true,
            around: false,
            back: true,
            sync: true,
            seen: true,
        },
        vec![
            Write { block: 221, n: 1, seed: 10928391219472478371, kind: 1, skew: 2 },
            Write { block: 312, n: 3, seed: 11314728596624219701, kind: 3, skew: 0 },
            Trim { block: 330, n: 3 },
            Zero { block: 311, n: 5 },
            Read { block: 173, n: 2, skew: 1 },
            Write { block: 260, n: 2, seed: 4652157107244042948, kind: 0, skew: 0 },
            Read { block: 137, n: 1, skew: 1 },
            Write { block: 375, n: 1, seed: 14700111117013382393, kind: 1, skew: 1 },
            Write { block: 52, n: 1, seed: 8703973452224258083, kind: 3, skew: 0 },
            Read { block: 149, n: 2, skew: 1 },
            Read { block: 141, n: 1, skew: 1 },
        ],
    )
}
