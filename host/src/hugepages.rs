//! Transparent huge pages for the components' linear memories (Linux).
//!
//! A login hashes with Argon2 in 19 MiB of fresh linear memory. With 4 KiB
//! pages that is about 4,900 page faults per request, each a trap into the
//! kernel, a page allocation and a memory-cgroup charge, and as many page
//! table entries to tear down when the slot is reset: the profile of 32
//! concurrent logins had 19 % of the host's CPU in the kernel for it
//! (BENCHMARKS.md, target 4). With 2 MiB pages it is about ten faults.
//!
//! Linux hands out huge pages for anonymous memory either always or, in the
//! common `madvise` mode (Debian's and this machine's default), only in
//! ranges marked with `madvise(MADV_HUGEPAGE)`. Wasmtime's pooling allocator
//! reserves all linear memories as one `PROT_NONE` mapping when the engine is
//! made and offers no way to mark it, so [`advised`] finds that mapping in
//! `/proc/self/maps` (the largest anonymous mapping the engine's creation
//! added) and marks it. The mark is a hint: memory is still given back
//! after each request exactly as before (wasmtime's `madvise(MADV_DONTNEED)`
//! beyond the kept-resident first 256 KiB), so the resident set after a burst
//! of logins returns as it did (target 5). Where huge pages are off
//! (`never`) or the range cannot be found, nothing changes.

use std::ops::Range;

/// Anonymous mappings of at least this size are candidates: the memory
/// pool reserves gigabytes per slot, nothing else of the host comes close.
const MIN_POOL_BYTES: usize = 1 << 30;

/// The anonymous mappings of this process (start..end), from
/// `/proc/self/maps`; empty where it cannot be read.
fn anonymous_mappings() -> Vec<Range<usize>> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines().filter_map(parse_anonymous).collect()
}

/// One `/proc/self/maps` line: its range if it maps no file (inode 0, no
/// path: heap, stack and named kernel areas such as `[stack]` excluded).
fn parse_anonymous(line: &str) -> Option<Range<usize>> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let inode = fields.nth(3)?;
    if inode != "0" || fields.next().is_some() {
        return None;
    }
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (end > start).then_some(start..end)
}

/// The mapping the memory pool added: the largest anonymous range in
/// `after` of at least [`MIN_POOL_BYTES`] that was not in `before`.
fn pool_range(before: &[Range<usize>], after: &[Range<usize>]) -> Option<Range<usize>> {
    after
        .iter()
        .filter(|r| r.end - r.start >= MIN_POOL_BYTES && !before.contains(r))
        .max_by_key(|r| r.end - r.start)
        .cloned()
}

/// Makes an engine with `make` and marks the memory pool its creation
/// reserved for transparent huge pages, as the server runs: the mappings are
/// read before `make` runs, so the pool is the range it added. Returns the
/// engine and what marking gave (the marked size in bytes, or why nothing was
/// marked); an error only from `make`.
pub fn advised<E>(
    make: impl FnOnce() -> anyhow::Result<E>,
) -> anyhow::Result<(E, Result<usize, String>)> {
    let before = anonymous_mappings();
    let engine = make()?;
    Ok((engine, advise(&before)))
}

/// Marks the memory pool created since `before` was read for transparent
/// huge pages. Returns the marked size in bytes, or why nothing was marked.
fn advise(before: &[Range<usize>]) -> Result<usize, String> {
    let range = pool_range(before, &anonymous_mappings())
        .ok_or_else(|| "no new anonymous mapping of 1 GiB or more".to_string())?;
    mark(range)
}

#[cfg(target_os = "linux")]
fn mark(range: Range<usize>) -> Result<usize, String> {
    let len = range.end - range.start;
    // SAFETY: the range is a whole mapping of this process (the pool's
    // reservation, alive as long as the engine); MADV_HUGEPAGE changes no
    // contents and no protection, only how later faults are served.
    let rc = unsafe { libc::madvise(range.start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    if rc == 0 {
        Ok(len)
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

#[cfg(not(target_os = "linux"))]
fn mark(_: Range<usize>) -> Result<usize, String> {
    Err("not Linux".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_anonymous_lines_only() {
        let anon = "7f0000000000-7f0040000000 ---p 00000000 00:00 0 ";
        assert_eq!(
            parse_anonymous(anon),
            Some(0x7f00_0000_0000..0x7f00_4000_0000)
        );
        let file = "55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1234  /usr/bin/tfa-host";
        assert_eq!(parse_anonymous(file), None);
        let stack = "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0  [stack]";
        assert_eq!(parse_anonymous(stack), None);
        assert_eq!(parse_anonymous("garbage"), None);
    }

    #[test]
    fn the_pool_is_the_largest_new_range() {
        let old = 0x1000_0000..0x1000_0000 + (2 << 30);
        let small = 0x9000_0000..0x9000_1000;
        let pool = 0x10_0000_0000..0x90_0000_0000;
        let tables = 0xa0_0000_0000..0xa0_0000_0000 + (1 << 30);
        let before = vec![old.clone()];
        let after = vec![old, small, tables, pool.clone()];
        assert_eq!(pool_range(&before, &after), Some(pool));
        assert_eq!(pool_range(&after, &after), None);
    }

    /// The real engine: its pool is found, and marking it succeeds where
    /// the kernel has huge pages (madvise fails with EINVAL without THP).
    #[test]
    fn finds_and_marks_the_engines_pool() {
        let before = anonymous_mappings();
        assert!(!before.is_empty(), "/proc/self/maps is readable on Linux");
        let engine = crate::runtime::engine(false).unwrap();
        let after = anonymous_mappings();
        let pool = pool_range(&before, &after).expect("the memory pool's reservation");
        assert!(pool.end - pool.start >= 64 << 30, "{pool:x?}");
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.contains("[always]") || thp.contains("[madvise]") {
            assert_eq!(advise(&before), Ok(pool.end - pool.start));
            assert!(
                vm_flags(pool.start).contains(&"hg".to_string()),
                "{pool:x?}"
            );
        }
        drop(engine);
    }

    /// The kernel's flags of the mapping that starts at `start` (`hg`:
    /// huge pages advised).
    fn vm_flags(start: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&header));
        let flags = lines.find_map(|l| l.strip_prefix("VmFlags:"));
        flags
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect()
    }
}
