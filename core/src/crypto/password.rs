//! Argon2id password hashing (placeholder for the parameters type).
/// Argon2id cost parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Params {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}
impl Default for Argon2Params {
    fn default() -> Self {
        Argon2Params {
            memory_kib: 19456,
            iterations: 2,
            parallelism: 1,
        }
    }
}
