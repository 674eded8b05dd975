//! The request's header map as the host serialises it (proxy-wasm ABI
//! 0.2.1), read in place.
//!
//! The SDK's `get_map_bytes` copies every name and value into its own
//! `String` / `Vec` (two allocations per header) and panics on a map that
//! does not parse; the filter reads a few headers per request, so it keeps
//! the host's one buffer and indexes it here, with every length checked.
//!
//! The layout: a little-endian `u32` count `n`; `n` pairs of little-endian
//! `u32` (name length, value length); then each name and each value, in
//! order, each followed by one NUL byte.

/// Names and values of a serialised header map, borrowed from its buffer.
#[derive(Debug, Default)]
pub struct Headers<'a> {
    pairs: Vec<(&'a [u8], &'a [u8])>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    let word: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(word)).ok()
}

impl<'a> Headers<'a> {
    /// Parses a serialised map; `None` if any length runs past the buffer.
    /// An empty buffer is an empty map.
    pub fn parse(bytes: &'a [u8]) -> Option<Headers<'a>> {
        if bytes.is_empty() {
            return Some(Headers::default());
        }
        let n = u32_at(bytes, 0)?;
        let mut data = n.checked_mul(8)?.checked_add(4)?;
        if data > bytes.len() {
            return None;
        }
        let mut pairs = Vec::with_capacity(n);
        for i in 0..n {
            let sizes = 4 + i * 8;
            let name_len = u32_at(bytes, sizes)?;
            let value_len = u32_at(bytes, sizes + 4)?;
            let name_end = data.checked_add(name_len)?;
            let name = bytes.get(data..name_end)?;
            let value_start = name_end.checked_add(1)?;
            let value_end = value_start.checked_add(value_len)?;
            let value = bytes.get(value_start..value_end)?;
            data = value_end.checked_add(1)?;
            pairs.push((name, value));
        }
        Some(Headers { pairs })
    }

    /// The first value of `name` (ASCII case-insensitive).
    pub fn first(&self, name: &str) -> Option<&'a [u8]> {
        self.all(name).next()
    }

    /// The first value of `name` as UTF-8, if it is.
    pub fn text(&self, name: &str) -> Option<&'a str> {
        self.first(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every value of `name` (ASCII case-insensitive), in order.
    pub fn all<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.pairs
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| *v)
    }

    /// Whether `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.first(name).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serialise(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            out.extend((k.len() as u32).to_le_bytes());
            out.extend((v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            out.extend(k.as_bytes());
            out.push(0);
            out.extend(v.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn reads_what_the_host_serialises() {
        let bytes = serialise(&[
            (":method", "GET"),
            (":path", "/a?b"),
            ("cookie", "a=1"),
            ("Cookie", "b=2"),
            ("empty", ""),
        ]);
        let h = Headers::parse(&bytes).expect("parses");
        assert_eq!(h.text(":method"), Some("GET"));
        assert_eq!(h.text(":PATH"), Some("/a?b"));
        assert_eq!(h.all("cookie").collect::<Vec<_>>(), [b"a=1", b"b=2"]);
        assert_eq!(h.first("empty"), Some(&b""[..]));
        assert!(h.contains("EMPTY"));
        assert!(!h.contains("authorization"));
        assert!(Headers::parse(&[]).expect("empty").first("x").is_none());
        assert!(Headers::parse(&serialise(&[])).is_some());
    }

    #[test]
    fn every_truncation_is_refused_without_panic() {
        let bytes = serialise(&[("authorization", "Bearer x"), ("accept", "*/*")]);
        // Cutting the final NUL alone still leaves every value whole.
        assert!(Headers::parse(&bytes[..bytes.len() - 1]).is_some());
        for len in 1..bytes.len() - 1 {
            assert!(Headers::parse(&bytes[..len]).is_none(), "{len}");
        }
        // Lengths that overflow or point past the end.
        let mut huge = 1u32.to_le_bytes().to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        huge.extend(u32::MAX.to_le_bytes());
        assert!(Headers::parse(&huge).is_none());
        assert!(Headers::parse(&u32::MAX.to_le_bytes()).is_none());
    }
}
