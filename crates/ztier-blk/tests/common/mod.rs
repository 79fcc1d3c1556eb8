//! Helpers shared by the engine's integration tests.

/// One step of Marsaglia's xorshift64 (13, 7, 17): the tests' cheap,
/// reproducible pseudo-random sequence. `x` must not be 0.
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
