//! Replays every saved fuzz case (`core/fuzz/regressions/<target>/*`) and the
//! seeds (`core/fuzz/seeds/<target>/*`) through the same invariant checks the
//! fuzz targets run (`tfa_core::testing::fuzzing`), natively, on every
//! `cargo test`. A case that once broke an invariant stays fixed.

use std::path::Path;

use tfa_core::testing::fuzzing::TARGETS;

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(dir);
    let mut n = 0;
    for (name, check) in TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            if file
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let data = std::fs::read(&file).expect("readable case");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{name}: {} broke an invariant",
                file.display()
            );
            n += 1;
        }
    }
    n
}

#[test]
fn regression_cases_hold() {
    replay("regressions");
}

#[test]
fn seeds_hold() {
    assert!(replay("seeds") >= 4, "the seed corpus is present");
}
