//! Replays the seeds and every saved case of the fuzz target `filter_config`
//! (`edge-filter/fuzz/{seeds,regressions}/filter_config/*`) through the same
//! invariant checks, natively, on every `cargo test`.

use std::path::Path;

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(dir)
        .join("filter_config");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return 0;
    };
    let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    let mut n = 0;
    for file in files {
        if file
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        let data = std::fs::read(&file).expect("readable case");
        let outcome = std::panic::catch_unwind(|| edge_filter::fuzzing::filter_config(&data));
        assert!(outcome.is_ok(), "{} broke an invariant", file.display());
        n += 1;
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
