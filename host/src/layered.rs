//! The log store's map ([`crate::logkv`]), frozen for a snapshot without
//! a copy, in shards so that no store call waits for the whole map.
//!
//! A compaction needs the store's contents at one moment while writes go
//! on. Until 2026-12-04 the log store cloned its `HashMap` under the lock
//! for that, and every store call waited for the clone: 23 ms at 133,000
//! keys, 194 ms at 942,000 (two atomic increments and their cache misses
//! per entry). Here [`Layered::freeze`] takes the same moment without a
//! copy: each shard's map becomes an immutable base, shared with the
//! snapshot writer, and the writes after it go to the shard's overlay,
//! which reads consult first. Once the snapshot is written and its handle
//! dropped, [`Layered::merge_some`] folds the overlays back into the bases
//! a bounded number of entries at a time, so that no store call waits for
//! more than one such step.
//!
//! Why shards ([`SHARDS`] of them, chosen by a hash of the key): a
//! `HashMap` grows by moving every entry into a table twice the size, all
//! at once, under the store's lock. In one map of a million entries that
//! is a pause of a fifth of a second (`tfa-bench kv-pause` measured
//! overlay resizes of 6, 18, 38 and 180 ms at 57k to 459k entries, worse
//! than the clone the freeze replaced); in a shard it moves a
//! [`SHARDS`]th of them. The same holds for the bases as the store grows.
//!
//! Preconditions, stated plainly: one freeze at a time ([`Layered::freeze`]
//! answers `None` until the last one's merge has ended); a base is
//! changed in place only when nobody else holds it, and
//! [`Layered::merge_some`] before the snapshot's handle is dropped copies
//! the bases once (correct, only slow).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

/// A key of the store.
pub type Key = Arc<str>;
/// A value of the store.
pub type Value = Arc<[u8]>;
/// One shard's keys and values.
pub type Map = HashMap<Key, Value>;

/// How many shards the map is cut into: a resize, or a merge step's
/// share of one, moves at most about this fraction of the entries.
pub const SHARDS: usize = 64;

/// One shard: its base and, while frozen, its overlay of the writes
/// since (a value, or `None` for a delete).
#[derive(Default)]
struct Shard {
    base: Arc<Map>,
    overlay: Option<HashMap<Key, Option<Value>>>,
}

/// The store's contents at the moment of a [`Layered::freeze`], for the
/// snapshot writer.
pub struct Frozen(Vec<Arc<Map>>);

impl Frozen {
    /// How many keys hold a value.
    pub fn len(&self) -> usize {
        self.0.iter().map(|m| m.len()).sum()
    }

    /// Whether no key holds a value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key and its value, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.0.iter().flat_map(|m| m.iter())
    }
}

/// The store's keys and values: [`SHARDS`] bases and, while a snapshot
/// of them is being written, overlays of the writes since. See the
/// module docs.
pub struct Layered {
    shards: Box<[Shard]>,
    /// Picks a key's shard; independent of the shards' own hashers.
    pick: RandomState,
    /// Keys present, every shard's base and overlay together.
    len: usize,
    /// While frozen or merging: the first shard whose overlay is not yet
    /// merged. `None` when writes go to the bases.
    merging: Option<usize>,
}

impl Default for Layered {
    fn default() -> Layered {
        Layered::new(Map::new())
    }
}

impl Layered {
    /// A store holding `map`.
    pub fn new(map: Map) -> Layered {
        let mut l = Layered {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            pick: RandomState::new(),
            len: 0,
            merging: None,
        };
        for (k, v) in map {
            l.insert(k, v);
        }
        l
    }

    fn shard_of(&self, key: &str) -> usize {
        // SHARDS is a power of two: the low bits of an even hash.
        (self.pick.hash_one(key) as usize) & (SHARDS - 1)
    }

    /// The value at `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let s = &self.shards[self.shard_of(key)];
        if let Some(o) = &s.overlay {
            if let Some(v) = o.get(key) {
                return v.as_ref();
            }
        }
        s.base.get(key)
    }

    /// Whether `key` holds a value.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// How many keys hold a value.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key holds a value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: Key, value: Value) {
        let i = self.shard_of(&key);
        let s = &mut self.shards[i];
        let added = match s.overlay.as_mut() {
            Some(o) => {
                let had = match o.get(&key) {
                    Some(v) => v.is_some(),
                    None => s.base.contains_key(&key),
                };
                o.insert(key, Some(value));
                !had
            }
            None => Arc::make_mut(&mut s.base).insert(key, value).is_none(),
        };
        if added {
            self.len += 1;
        }
    }

    /// Deletes `key` (nothing when it holds no value).
    pub fn remove(&mut self, key: &str) {
        let i = self.shard_of(key);
        let s = &mut self.shards[i];
        let removed = match s.overlay.as_mut() {
            // Kept as a delete only where the base still has the key.
            Some(o) if s.base.contains_key(key) => {
                o.insert(Arc::from(key), None).is_none_or(|v| v.is_some())
            }
            Some(o) => o.remove(key).is_some_and(|v| v.is_some()),
            None => Arc::make_mut(&mut s.base).remove(key).is_some(),
        };
        if removed {
            self.len -= 1;
        }
    }

    /// Every key holding a value, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.shards.iter().flat_map(|s| {
            let overlay = s.overlay.as_ref();
            let from_base = s
                .base
                .keys()
                .filter(move |k| !overlay.is_some_and(|o| o.contains_key(&***k)));
            let from_overlay = overlay
                .into_iter()
                .flat_map(|o| o.iter().filter_map(|(k, v)| v.as_ref().map(|_| k)));
            from_base.chain(from_overlay)
        })
    }

    /// The contents as they are now, for a snapshot: later writes go to
    /// overlays until [`Layered::merge_some`] has folded them back.
    /// [`SHARDS`] pointer copies. `None` while an earlier freeze is not
    /// yet merged: its bases lack the overlays' writes.
    pub fn freeze(&mut self) -> Option<Frozen> {
        if self.merging.is_some() {
            return None;
        }
        self.merging = Some(0);
        let bases = self
            .shards
            .iter_mut()
            .map(|s| {
                s.overlay = Some(HashMap::new());
                s.base.clone()
            })
            .collect();
        Some(Frozen(bases))
    }

    /// Entries in the overlays (writes since the freeze, not yet merged).
    pub fn overlay_len(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|s| s.overlay.as_ref())
            .map(HashMap::len)
            .sum()
    }

    /// Whether writes go to overlays (frozen, or merging).
    pub fn is_frozen(&self) -> bool {
        self.merging.is_some()
    }

    /// Moves up to `at_most` of the overlays' entries into the bases; true
    /// once every overlay is gone (then writes go to the bases again).
    /// Call it after the snapshot's handle from [`Layered::freeze`] is
    /// dropped.
    pub fn merge_some(&mut self, at_most: usize) -> bool {
        let mut budget = at_most;
        while let Some(i) = self.merging {
            let Some(s) = self.shards.get_mut(i) else {
                self.merging = None;
                break;
            };
            if let Some(o) = s.overlay.as_mut() {
                if !o.is_empty() {
                    if budget == 0 {
                        return false;
                    }
                    let base = Arc::make_mut(&mut s.base);
                    let keys: Vec<Key> = o.keys().take(budget).cloned().collect();
                    budget -= keys.len();
                    for k in keys {
                        match o.remove(&k).flatten() {
                            Some(v) => {
                                base.insert(k, v);
                            }
                            None => {
                                base.remove(&k);
                            }
                        }
                    }
                    if !o.is_empty() {
                        return false;
                    }
                }
                s.overlay = None;
            }
            self.merging = Some(i + 1);
        }
        true
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn val(s: &str) -> Value {
        Arc::from(s.as_bytes())
    }

    /// The contents as a sorted map, through `keys` and `get`.
    fn contents(l: &Layered) -> BTreeMap<String, Vec<u8>> {
        let all: BTreeMap<String, Vec<u8>> = l
            .keys()
            .map(|k| (k.to_string(), l.get(k).unwrap().to_vec()))
            .collect();
        assert_eq!(all.len(), l.len(), "len agrees with keys");
        assert_eq!(l.keys().count(), l.len(), "no key listed twice");
        all
    }

    #[test]
    fn a_frozen_base_keeps_its_moment_while_writes_go_on() {
        let mut l = Layered::new(Map::new());
        l.insert("a".into(), val("1"));
        l.insert("b".into(), val("2"));
        l.insert("c".into(), val("3"));
        let snapshot = l.freeze().unwrap();
        assert!(l.is_frozen());
        assert!(l.freeze().is_none(), "one freeze at a time");
        l.insert("a".into(), val("10")); // overwritten
        l.remove("b"); // deleted from the base
        l.insert("d".into(), val("4")); // new
        l.insert("e".into(), val("5"));
        l.remove("e"); // new, then deleted: no trace
        l.remove("nope"); // never there
        let want: BTreeMap<String, Vec<u8>> = [("a", "10"), ("c", "3"), ("d", "4")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(contents(&l), want);
        assert!(!l.contains("b") && !l.contains("e"));
        // The snapshot saw none of it.
        let mut seen: Vec<(&str, &[u8])> = snapshot.iter().map(|(k, v)| (&**k, &**v)).collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![("a", &b"1"[..]), ("b", &b"2"[..]), ("c", &b"3"[..])]
        );
        drop(snapshot);
        // Merged one entry at a time, with a write in between each step.
        let mut steps = 0;
        while !l.merge_some(1) {
            steps += 1;
            assert_eq!(contents(&l), want, "mid-merge reads");
            assert!(steps < 10, "the merge ends");
        }
        assert!(!l.is_frozen());
        assert!(
            l.shards.iter().all(|s| s.overlay.is_none()),
            "no overlay left"
        );
        assert_eq!(contents(&l), want);
        l.insert("f".into(), val("6"));
        assert_eq!(l.len(), 4);
    }

    #[test]
    fn writes_during_a_merge_are_kept() {
        let mut l = Layered::new(Map::new());
        for i in 0..100 {
            l.insert(format!("k{i}").into(), val("old"));
        }
        let snapshot = l.freeze().unwrap();
        for i in 0..100 {
            if i % 3 == 0 {
                l.remove(&format!("k{i}"));
            } else {
                l.insert(format!("k{i}").into(), val("new"));
            }
        }
        drop(snapshot);
        let mut model: BTreeMap<String, Vec<u8>> = contents(&l);
        let mut round = 0;
        while !l.merge_some(7) {
            // A write between steps, to a key merged or not yet merged.
            let k = format!("k{}", (round * 13) % 100);
            if round % 2 == 0 {
                l.insert(k.as_str().into(), val("newer"));
                model.insert(k, b"newer".to_vec());
            } else {
                l.remove(&k);
                model.remove(&k);
            }
            assert_eq!(contents(&l), model);
            round += 1;
        }
        assert_eq!(contents(&l), model);
        for s in l.shards.iter() {
            assert_eq!(Arc::strong_count(&s.base), 1, "a base was never copied");
        }
    }

    #[test]
    fn merging_while_the_snapshot_is_held_copies_but_loses_nothing() {
        let mut l = Layered::new(Map::from([("a".into(), val("1"))]));
        let snapshot = l.freeze().unwrap();
        l.insert("a".into(), val("2"));
        assert!(l.merge_some(usize::MAX));
        assert_eq!(&**l.get("a").unwrap(), b"2");
        let held: Vec<_> = snapshot.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(held, vec![("a", &b"1"[..])]);
    }

    #[test]
    fn not_frozen_it_is_a_plain_map() {
        let mut l = Layered::default();
        assert!(l.is_empty() && l.merge_some(1));
        l.insert("x".into(), val("1"));
        l.insert("x".into(), val("2"));
        assert_eq!(l.len(), 1);
        l.remove("x");
        l.remove("x");
        assert!(l.is_empty() && l.get("x").is_none());
    }
}
