//! [`RedisKv`]: the key-value store in a Redis server (`KV_URL`), over
//! plain TCP or TLS; its Spin 4.0.2 semantics are in [`super`]'s
//! documentation.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::{KvBackend, KvEmulation, KvError, KvResult};

/// Key-value store in a Redis server.
pub struct RedisKv {
    client: redis::Client,
    url_for_logs: String,
    pool: Mutex<Vec<redis::Connection>>,
    cas: redis::Script,
    emulation: KvEmulation,
}

/// Connections kept open for reuse.
const REDIS_POOL: usize = 16;

/// One PEM bundle of the system's roots (found as the `redis` crate finds
/// them without a CA file: `rustls-native-certs`, which honours
/// `SSL_CERT_FILE` / `SSL_CERT_DIR`) followed by `extra_pem`, for the
/// `redis` crate, which takes either its own roots or one bundle. A system
/// certificate rustls cannot use as a trust anchor is left out (the crate
/// would refuse the whole bundle); problems are logged, not fatal.
pub fn system_roots_and(extra_pem: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        crate::log::warn(&format!("KV_CA_FILE: reading the system's roots: {e}"));
    }
    let mut out = Vec::new();
    let mut usable = rustls::RootCertStore::empty();
    for cert in found.certs {
        if usable.add(cert.clone()).is_err() {
            continue;
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        out.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    out.extend_from_slice(extra_pem);
    out
}

impl RedisKv {
    /// Connects to `url` (`redis://…`), checking the server answers.
    pub fn open(url: &str, emulation: KvEmulation) -> KvResult<RedisKv> {
        RedisKv::open_tls(url, emulation, None)
    }

    /// Connects to `url` (`redis://…`, or `rediss://…` over TLS: the
    /// server's certificate is checked against the system's roots, and
    /// also against the PEM certificates of `ca_file` when it is given),
    /// checking the server answers.
    pub fn open_tls(
        url: &str,
        emulation: KvEmulation,
        ca_file: Option<&Path>,
    ) -> KvResult<RedisKv> {
        let client = match ca_file {
            Some(path) if url.starts_with("rediss://") => {
                let pem = std::fs::read(path).map_err(|e| {
                    KvError(format!("cannot read KV_CA_FILE {}: {e}", path.display()))
                })?;
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(system_roots_and(&pem)),
                    },
                )?
            }
            Some(_) => {
                return Err(KvError(
                    "KV_CA_FILE is set but KV_URL is not a rediss:// URL".into(),
                ))
            }
            None => redis::Client::open(url)?,
        };
        let kv = RedisKv {
            client,
            url_for_logs: redact(url),
            pool: Mutex::new(Vec::new()),
            // GET, compare, SET in one script: Redis runs it atomically. A
            // missing key reads as false, which never equals ARGV[1].
            cas: redis::Script::new(
                "local v = redis.call('GET', KEYS[1])
                 if v == ARGV[1] then
                   redis.call('SET', KEYS[1], ARGV[2])
                   return 1
                 end
                 return 0",
            ),
            emulation,
        };
        kv.with(|c| redis::cmd("PING").query::<String>(c).map(|_| ()))?;
        Ok(kv)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> KvResult<T> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        let mut conn = match pooled {
            Some(c) => c,
            None => self
                .client
                .get_connection_with_timeout(Duration::from_secs(5))?,
        };
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        conn.set_write_timeout(Some(Duration::from_secs(10)))?;
        let out = match f(&mut conn) {
            Ok(out) => out,
            Err(e) => {
                // The server went away (restart, network): every pooled
                // connection is as dead as this one; the next operations
                // connect afresh instead of failing once per pooled one.
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                    if let Ok(mut p) = self.pool.lock() {
                        p.clear();
                    }
                }
                return Err(e.into());
            }
        };
        if let Ok(mut p) = self.pool.lock() {
            if p.len() < REDIS_POOL {
                p.push(conn);
            }
        }
        Ok(out)
    }
}

/// `url` without its password.
pub(super) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl KvBackend for RedisKv {
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>> {
        self.with(|c| redis::cmd("GET").arg(key).query(c))
    }

    fn set(&self, key: &str, value: &[u8]) -> KvResult<()> {
        self.with(|c| redis::cmd("SET").arg(key).arg(value).query(c))
    }

    fn delete(&self, key: &str) -> KvResult<()> {
        self.with(|c| redis::cmd("DEL").arg(key).query::<i64>(c).map(|_| ()))
    }

    fn exists(&self, key: &str) -> KvResult<bool> {
        self.with(|c| redis::cmd("EXISTS").arg(key).query(c))
    }

    fn keys(&self) -> KvResult<Vec<String>> {
        let mut keys: Vec<String> = self.with(|c| {
            let mut all = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000)
                    .query(c)?;
                all.extend(batch);
                if next == 0 {
                    break Ok(all);
                }
                cursor = next;
            }
        })?;
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.with(|c| redis::cmd("MGET").arg(keys).query(c))
    }

    fn increment(&self, key: &str, delta: i64) -> KvResult<i64> {
        self.with(|c| redis::cmd("INCRBY").arg(key).arg(delta).query(c))
    }

    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool> {
        let n: i64 = self.with(|c| self.cas.key(key).arg(expected).arg(new).invoke(c))?;
        Ok(n == 1)
    }

    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        if self.emulation == KvEmulation::None {
            return pairs.iter().try_for_each(|(k, v)| self.set(k, v));
        }
        // Spin: one `MSET k1 v1 k2 v2 …` (atomic); an empty batch never
        // reaches the store.
        if pairs.is_empty() {
            return Ok(());
        }
        self.with(|c| redis::cmd("MSET").arg(pairs).query(c))
    }

    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        if self.emulation == KvEmulation::None {
            return keys.iter().try_for_each(|k| self.delete(k));
        }
        // Spin: one `DEL k1 k2 …`.
        if keys.is_empty() {
            return Ok(());
        }
        self.with(|c| redis::cmd("DEL").arg(keys).query::<i64>(c).map(|_| ()))
    }

    fn emulation(&self) -> KvEmulation {
        self.emulation
    }

    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        if self.emulation == KvEmulation::None {
            return Ok(keys.iter().cloned().zip(self.get_many(keys)?).collect());
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Spin sends `KEYS k1 k2 …` and reads the reply as (key, value)
        // pairs. Redis refuses KEYS with two arguments or more; with one,
        // the key is a pattern and the matching names are paired up two by
        // two, and an odd number of them hits an `unreachable!` in the
        // `redis` crate (Spin's request panics: here an error).
        let names: Vec<Vec<u8>> = self.with(|c| redis::cmd("KEYS").arg(keys).query(c))?;
        if names.len() % 2 == 1 {
            return Err(KvError(format!(
                "redis: KEYS {:?} matched {} keys, an odd number (Spin 4.0.2 would panic here)",
                keys[0],
                names.len()
            )));
        }
        names
            .chunks(2)
            .map(|pair| {
                let key = String::from_utf8(pair[0].clone())
                    .map_err(|_| KvError("redis: KEYS answered a name that is not UTF-8".into()))?;
                Ok((key, Some(pair[1].clone())))
            })
            .collect()
    }

    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        if self.emulation == KvEmulation::None {
            return match seen {
                Some(Some(expected)) => self.compare_and_swap(key, expected, new),
                _ => Ok(false),
            };
        }
        // Spin: `MULTI; SET key new; EXEC` on the handle's connection, which
        // `current` made `WATCH` the key, then `UNWATCH key`, which Redis
        // refuses (UNWATCH takes no argument), so the answer is always
        // `cas-failed`. The write itself has happened unless the key changed
        // after `current` (WATCH; here: unless it holds another value now).
        // Its outcome is not reported, as in Spin, where the refused
        // UNWATCH is what decides the answer.
        let _written = match seen {
            None => self.set(key, new).map(|()| true),
            Some(None) => self.with(|c| {
                redis::cmd("SET")
                    .arg(key)
                    .arg(new)
                    .arg("NX")
                    .query::<Option<String>>(c)
                    .map(|ok| ok.is_some())
            }),
            Some(Some(expected)) => self.compare_and_swap(key, expected, new),
        };
        Ok(false)
    }

    fn describe(&self) -> String {
        format!("redis {}", self.url_for_logs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://***@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }
}
