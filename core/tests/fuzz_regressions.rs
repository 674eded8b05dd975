//! Replays every saved fuzz case (`core/fuzz/regressions/<target>/*`) and the
//! seeds (`core/fuzz/seeds/<target>/*`) through the same invariant checks the
//! fuzz targets run (`tfa_core::testing::fuzzing`), natively, on every
//! `cargo test`. A case that once broke an invariant stays fixed.

use std::path::Path;

use tfa_core::testing::fuzzing::{replay_dir, TARGETS};

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(dir);
    TARGETS
        .iter()
        .map(|(name, check)| replay_dir(&root.join(name), *check))
        .sum()
}

#[test]
fn regression_cases_hold() {
    replay("regressions");
}

#[test]
fn seeds_hold() {
    assert!(replay("seeds") >= 4, "the seed corpus is present");
}
