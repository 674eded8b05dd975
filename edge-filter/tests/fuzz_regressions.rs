//! Replays the seeds and every saved case of the fuzz target `filter_config`
//! (`edge-filter/fuzz/{seeds,regressions}/filter_config/*`) through the same
//! invariant checks, natively, on every `cargo test`.

use std::path::Path;

use tfa_core::testing::fuzzing::replay_dir;

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(dir);
    replay_dir(
        &root.join("filter_config"),
        edge_filter::fuzzing::filter_config,
    )
}

#[test]
fn regression_cases_hold() {
    replay("regressions");
}

#[test]
fn seeds_hold() {
    assert!(replay("seeds") >= 4, "the seed corpus is present");
}
