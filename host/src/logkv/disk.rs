//! The store's files: snapshots written and loaded, frames encoded and
//! replayed, recovery at opening, the directory's lock and syncs.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::kv::KvResult;
use crate::layered::{Frozen, Map};

use super::{err, io, Op, MAX_FRAME};

const SNAP_MAGIC: &[u8] = b"tfa-kv-snapshot 1\n";

/// Bytes the snapshot writer gathers before each `write(2)`.
const SNAP_BUFFER: usize = 1 << 20;

/// Writes `map` as the snapshot of `generation` and syncs it into place;
/// returns its length. Streams through one [`SNAP_BUFFER`]-sized buffer:
/// building the whole snapshot in memory first (tens of MB at a few
/// thousand users) had the kernel zero that many fresh pages at every
/// compaction, and the growing buffer copied itself at each doubling.
pub(super) fn write_snapshot(dir: &Path, generation: u64, map: &Frozen) -> KvResult<u64> {
    let tmp = dir.join(format!("kv-{generation}.snap.tmp"));
    let path = snap_file(dir, generation);
    let f = File::create(&tmp).map_err(io("cannot create", &tmp))?;
    let mut out = std::io::BufWriter::with_capacity(SNAP_BUFFER, f);
    let mut frame = Vec::new();
    out.write_all(SNAP_MAGIC)
        .map_err(io("cannot write", &tmp))?;
    for (k, v) in map.iter() {
        frame.clear();
        let at = begin_frame(&mut frame);
        frame.push(b's');
        put_bytes(&mut frame, k.as_bytes());
        put_bytes(&mut frame, v);
        end_frame(&mut frame, at);
        out.write_all(&frame).map_err(io("cannot write", &tmp))?;
    }
    frame.clear();
    let at = begin_frame(&mut frame);
    frame.push(b'e');
    frame.extend_from_slice(&(map.len() as u64).to_le_bytes());
    end_frame(&mut frame, at);
    out.write_all(&frame).map_err(io("cannot write", &tmp))?;
    let f = out
        .into_inner()
        .map_err(|e| io("cannot write", &tmp)(e.into_error()))?;
    f.sync_all().map_err(io("cannot sync", &tmp))?;
    let written = f
        .metadata()
        .map_err(io("cannot read the length of", &tmp))?
        .len();
    std::fs::rename(&tmp, &path).map_err(io("cannot rename", &tmp))?;
    sync_dir(dir)?;
    Ok(written)
}

// --------------------------------------------------------------- recovery

pub(super) struct Recovered {
    pub(super) map: Map,
    /// The generation whose log receives new frames.
    pub(super) generation: u64,
    pub(super) log_bytes: u64,
    pub(super) snap_bytes: u64,
}

pub(super) fn log_file(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("kv-{generation}.log"))
}

pub(super) fn snap_file(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("kv-{generation}.snap"))
}

/// The store's snapshots and logs with their generation (`.tmp` files are
/// an interrupted compaction's and are removed).
pub(super) fn files(dir: &Path) -> KvResult<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("cannot list", dir))? {
        let path = entry.map_err(io("cannot list", dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
            continue;
        }
        let generation = name
            .strip_prefix("kv-")
            .and_then(|n| n.strip_suffix(".log").or_else(|| n.strip_suffix(".snap")))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(g) = generation {
            out.push((path, g));
        }
    }
    Ok(out)
}

pub(super) fn recover(dir: &Path) -> KvResult<Recovered> {
    let found = files(dir)?;
    let is_snap = |p: &Path| p.extension().is_some_and(|e| e == "snap");
    let base = found
        .iter()
        .filter(|(p, _)| is_snap(p))
        .map(|(_, g)| *g)
        .max();
    let mut map = Map::new();
    let mut snap_bytes = 0;
    if let Some(g) = base {
        let path = snap_file(dir, g);
        let bytes = read_all(&path)?;
        snap_bytes = bytes.len() as u64;
        load_snapshot(&bytes, &mut map).map_err(|why| err(format!("{}: {why}", path.display())))?;
    }
    let base = base.unwrap_or(0);
    let mut logs: Vec<u64> = found
        .iter()
        .filter(|(p, g)| !is_snap(p) && *g >= base)
        .map(|(_, g)| *g)
        .collect();
    logs.sort_unstable();
    let newest = logs.last().copied().unwrap_or(base);
    let mut log_bytes = 0;
    for g in logs {
        let path = log_file(dir, g);
        let bytes = read_all(&path)?;
        let good = replay(&bytes, &mut map);
        if good < bytes.len() {
            if g != newest {
                return Err(err(format!(
                    "{} is damaged at byte {good} of {} (not its end: refusing to open)",
                    path.display(),
                    bytes.len()
                )));
            }
            crate::log::info(&format!(
                "log store: {} ends in {} bytes of an interrupted write (never acknowledged); \
                 truncated",
                path.display(),
                bytes.len() - good
            ));
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io("cannot open", &path))?;
            f.set_len(good as u64)
                .map_err(io("cannot truncate", &path))?;
            f.sync_all().map_err(io("cannot sync", &path))?;
        }
        if g == newest {
            log_bytes = good as u64;
        }
    }
    // Files of generations before the snapshot: a compaction ended before
    // removing them.
    for (path, g) in found {
        if g < base {
            std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
        }
    }
    Ok(Recovered {
        map,
        generation: newest,
        log_bytes,
        snap_bytes,
    })
}

fn read_all(path: &Path) -> KvResult<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io("cannot read", path))?;
    Ok(bytes)
}

/// Applies the log's frames to `map`; the length of its intact prefix.
fn replay(bytes: &[u8], map: &mut Map) -> usize {
    let mut at = 0;
    while let Some((payload, next)) = frame(bytes, at) {
        let Some(ops) = parse_ops(payload) else {
            break;
        };
        for op in ops {
            match op {
                Op::Set(k, v) => {
                    map.insert(Arc::from(k), Arc::from(v));
                }
                Op::Delete(k) => {
                    map.remove(k);
                }
            }
        }
        at = next;
    }
    at
}

fn load_snapshot(bytes: &[u8], map: &mut Map) -> Result<(), String> {
    let mut at = bytes
        .strip_prefix(SNAP_MAGIC)
        .map(|_| SNAP_MAGIC.len())
        .ok_or("not a snapshot of this store")?;
    loop {
        let (payload, next) = frame(bytes, at).ok_or(format!("damaged at byte {at}"))?;
        if let Some(count) = payload.strip_prefix(b"e") {
            let count = <[u8; 8]>::try_from(count)
                .map(u64::from_le_bytes)
                .map_err(|_| format!("damaged end at byte {at}"))?;
            if count != map.len() as u64 || next != bytes.len() {
                return Err(format!("holds {} keys, its end says {count}", map.len()));
            }
            return Ok(());
        }
        for op in parse_ops(payload).ok_or(format!("damaged at byte {at}"))? {
            match op {
                Op::Set(k, v) => {
                    map.insert(Arc::from(k), Arc::from(v));
                }
                Op::Delete(_) => return Err(format!("a delete at byte {at}")),
            }
        }
        at = next;
    }
}

// ----------------------------------------------------------------- frames

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Starts a frame at the end of `out`: room for its header, filled in by
/// [`end_frame`] once the payload has been appended after it. Returns
/// where the frame starts.
pub(super) fn begin_frame(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    start
}

/// Ends the frame begun at `start`: its header gets the length and the
/// checksum of everything appended since.
pub(super) fn end_frame(out: &mut [u8], start: usize) {
    let payload = &out[start + 8..];
    let (len, crc) = (payload.len() as u32, crc32fast::hash(payload));
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The intact frame at `at` and where the next begins; `None` at the end,
/// or where a frame is cut short or fails its checksum.
fn frame(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = bytes.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    if len > MAX_FRAME {
        return None;
    }
    let end = at.checked_add(8)?.checked_add(len)?;
    let payload = bytes.get(at + 8..end)?;
    (crc32fast::hash(payload) == crc).then_some((payload, end))
}

fn parse_ops(mut p: &[u8]) -> Option<Vec<Op<'_>>> {
    fn take<'a>(p: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
        let b = p.get(4..4usize.checked_add(len)?)?;
        *p = &p[4 + len..];
        Some(b)
    }
    let mut ops = Vec::new();
    while let Some((&tag, rest)) = p.split_first() {
        p = rest;
        let key = std::str::from_utf8(take(&mut p)?).ok()?;
        ops.push(match tag {
            b's' => Op::Set(key, take(&mut p)?),
            b'd' => Op::Delete(key),
            _ => return None,
        });
    }
    (!ops.is_empty()).then_some(ops)
}

/// `flock(LOCK_EX | LOCK_NB)`: held until the file is closed, released by
/// the kernel when the process ends however it ends. (`File::try_lock`
/// needs Rust 1.89; the workspace's MSRV is 1.85.)
pub(super) fn lock_exclusive(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `flock` on a descriptor this `File` owns and keeps open for
    // the call; it touches no memory.
    match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

pub(super) fn sync_dir(dir: &Path) -> KvResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("cannot sync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layered::Layered;

    #[test]
    fn frames_round_trip_and_damage_is_seen() {
        let mut log = Vec::new();
        let at = begin_frame(&mut log);
        log.push(b's');
        put_bytes(&mut log, b"a");
        put_bytes(&mut log, b"1");
        end_frame(&mut log, at);
        let one = log.len();
        let at = begin_frame(&mut log);
        log.push(b'd');
        put_bytes(&mut log, b"a");
        end_frame(&mut log, at);
        let mut map = Map::new();
        assert_eq!(replay(&log, &mut map), log.len());
        assert!(map.is_empty());
        // Cut short anywhere in the second frame: only the first applies.
        for cut in one..log.len() {
            let mut map = Map::new();
            assert_eq!(replay(&log[..cut], &mut map), one, "cut at {cut}");
            assert_eq!(map.get("a").map(|v| v.to_vec()), Some(b"1".to_vec()));
        }
        // A flipped bit anywhere in the first frame: nothing applies.
        for byte in 0..one {
            let mut bad = log.clone();
            bad[byte] ^= 0x10;
            let mut map = Map::new();
            assert_eq!(replay(&bad, &mut map), 0, "bit flipped in byte {byte}");
            assert!(map.is_empty());
        }
    }

    #[test]
    fn snapshots_check_their_end() {
        let dir = std::env::temp_dir().join(format!("logkv-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut map = Map::new();
        for i in 0..50 {
            map.insert(Arc::from(format!("k{i}")), Arc::from(vec![i as u8; i]));
        }
        let len = write_snapshot(&dir, 3, &Layered::new(map.clone()).freeze().unwrap()).unwrap();
        let bytes = std::fs::read(snap_file(&dir, 3)).unwrap();
        assert_eq!(bytes.len() as u64, len);
        let mut back = Map::new();
        load_snapshot(&bytes, &mut back).unwrap();
        assert_eq!(back, map);
        for cut in [bytes.len() - 1, bytes.len() / 2, SNAP_MAGIC.len()] {
            assert!(load_snapshot(&bytes[..cut], &mut Map::new()).is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
