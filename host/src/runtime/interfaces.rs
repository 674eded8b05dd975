//! The host side of what the component imports beyond WASI and wasi:http:
//! Spin's `fermyon:spin/key-value` and `variables`, `wasi:config/store`, and
//! `wasi:keyvalue` (store, atomics, batch), all over the one store labelled
//! [`STORE_LABEL`], with Spin's errors for what Spin
//! refuses.

use wasmtime::component::Resource;

use super::{atomics, batch, key_value, variables, wasi_config, wasi_kv};
use super::{BucketRes, CasRes, HostState, KvOp, KvStoreRes, STORE_LABEL};
use crate::kv::{KvError, WriteOp};

// ------------------------------------------------------ fermyon:spin/key-value

fn spin_err(e: KvError) -> key_value::Error {
    key_value::Error::Other(e.0)
}

impl key_value::Host for HostState {}

impl key_value::HostStore for HostState {
    async fn open(&mut self, label: String) -> Result<Resource<KvStoreRes>, key_value::Error> {
        if !self.shared.grants.key_value {
            return Err(key_value::Error::AccessDenied);
        }
        if label != STORE_LABEL {
            // Spin: a label the manifest does not grant is access-denied.
            return Err(if self.shared.spin() {
                key_value::Error::AccessDenied
            } else {
                key_value::Error::NoSuchStore
            });
        }
        self.table
            .push(KvStoreRes)
            .map_err(|_| key_value::Error::StoreTableFull)
    }

    async fn get(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<Option<Vec<u8>>, key_value::Error> {
        self.kv(KvOp::Get, move |kv| kv.get(&key))
            .await
            .map_err(spin_err)
    }

    async fn set(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), key_value::Error> {
        self.kv_write(KvOp::Set, WriteOp::Set(key, value))
            .await
            .map(|_| ())
            .map_err(spin_err)
    }

    async fn delete(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<(), key_value::Error> {
        self.kv_write(KvOp::Delete, WriteOp::Delete(key))
            .await
            .map(|_| ())
            .map_err(spin_err)
    }

    async fn exists(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<bool, key_value::Error> {
        self.kv(KvOp::Other, move |kv| kv.exists(&key))
            .await
            .map_err(spin_err)
    }

    async fn get_keys(&mut self, _: Resource<KvStoreRes>) -> Result<Vec<String>, key_value::Error> {
        self.kv(KvOp::Other, |kv| kv.keys()).await.map_err(spin_err)
    }

    async fn drop(&mut self, rep: Resource<KvStoreRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

// ---------------------------------------------------- fermyon:spin/variables

/// Spin's rule for variable names: lower-case letters, digits and single
/// underscores, starting with a letter.
fn valid_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
}

impl variables::Host for HostState {
    async fn get(&mut self, name: String) -> Result<String, variables::Error> {
        if !valid_variable_name(&name) {
            return Err(variables::Error::InvalidName(name));
        }
        match self.shared.variables.get(&name) {
            Some(v) => Ok(v.clone()),
            None => Err(variables::Error::Undefined(format!(
                "no variable for {name:?}"
            ))),
        }
    }
}

// ------------------------------------------------------- wasi:config/store

/// The same variables as `fermyon:spin/variables`, as Spin 3.x and 4.x
/// give them through `wasi:config`: an undefined (or invalid) name is
/// `none`; `get-all` lists every variable of the component, so a component
/// reads its settings in one call.
impl wasi_config::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<String>, wasi_config::Error> {
        Ok(self.shared.variables.get(&key).cloned())
    }

    async fn get_all(&mut self) -> Result<Vec<(String, String)>, wasi_config::Error> {
        Ok(self
            .shared
            .variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

// ---------------------------------------------------------- wasi:keyvalue

fn wasi_err(e: KvError) -> wasi_kv::Error {
    wasi_kv::Error::Other(e.0)
}

impl wasi_kv::Host for HostState {
    async fn open(&mut self, identifier: String) -> Result<Resource<BucketRes>, wasi_kv::Error> {
        if !self.shared.grants.key_value {
            return Err(wasi_kv::Error::AccessDenied);
        }
        if identifier != STORE_LABEL {
            return Err(if self.shared.spin() {
                wasi_kv::Error::AccessDenied
            } else {
                wasi_kv::Error::NoSuchStore
            });
        }
        self.table
            .push(BucketRes)
            .map_err(|e| wasi_kv::Error::Other(format!("resource table: {e}")))
    }
}

impl wasi_kv::HostBucket for HostState {
    async fn get(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<Option<Vec<u8>>, wasi_kv::Error> {
        self.kv(KvOp::Get, move |kv| kv.get(&key))
            .await
            .map_err(wasi_err)
    }

    async fn set(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv_write(KvOp::Set, WriteOp::Set(key, value))
            .await
            .map(|_| ())
            .map_err(wasi_err)
    }

    async fn delete(&mut self, _: Resource<BucketRes>, key: String) -> Result<(), wasi_kv::Error> {
        self.kv_write(KvOp::Delete, WriteOp::Delete(key))
            .await
            .map(|_| ())
            .map_err(wasi_err)
    }

    async fn exists(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<bool, wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.exists(&key))
            .await
            .map_err(wasi_err)
    }

    async fn list_keys(
        &mut self,
        _: Resource<BucketRes>,
        cursor: Option<String>,
    ) -> Result<wasi_kv::KeyResponse, wasi_kv::Error> {
        // One page with every key (after `cursor`, exclusive). Spin 4.0.2
        // refuses any cursor.
        if cursor.is_some() && self.shared.spin() {
            return Err(wasi_kv::Error::Other(
                "list_keys: cursor not supported".into(),
            ));
        }
        let keys = self
            .kv(KvOp::Other, |kv| kv.keys())
            .await
            .map_err(wasi_err)?;
        let keys = match cursor {
            Some(c) => keys.into_iter().filter(|k| *k > c).collect(),
            None => keys,
        };
        Ok(wasi_kv::KeyResponse { keys, cursor: None })
    }

    async fn drop(&mut self, rep: Resource<BucketRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl atomics::Host for HostState {
    async fn increment(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
        delta: i64,
    ) -> Result<i64, wasi_kv::Error> {
        self.kv_write(KvOp::Increment, WriteOp::Increment(key, delta))
            .await
            .map_err(wasi_err)
    }

    async fn swap(
        &mut self,
        cas: Resource<CasRes>,
        value: Vec<u8>,
    ) -> Result<(), atomics::CasError> {
        let cas = self
            .table
            .delete(cas)
            .map_err(|e| atomics::CasError::StoreError(wasi_kv::Error::Other(e.to_string())))?;
        let key = cas.key.clone();
        // The backend applies its rule (see crate::kv): this host's own, or
        // Spin 4.0.2's for SQLite or Redis.
        let swapped = self
            .kv(KvOp::Other, {
                let key = key.clone();
                move |kv| kv.swap(&key, cas.seen.as_ref().map(Option::as_deref), &value)
            })
            .await
            .map_err(|e| atomics::CasError::StoreError(wasi_err(e)))?;
        if swapped {
            return Ok(());
        }
        // Hand back a fresh handle holding the value now in the store (Spin
        // also makes a new handle and calls `current` on it).
        let current = self
            .kv(KvOp::Other, {
                let key = key.clone();
                move |kv| kv.get(&key)
            })
            .await
            .map_err(|e| atomics::CasError::StoreError(wasi_err(e)))?;
        let again = self
            .table
            .push(CasRes {
                key,
                seen: Some(current),
            })
            .map_err(|e| atomics::CasError::StoreError(wasi_kv::Error::Other(e.to_string())))?;
        Err(atomics::CasError::CasFailed(again))
    }
}

impl atomics::HostCas for HostState {
    async fn new(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<Resource<CasRes>, wasi_kv::Error> {
        // Spin 4.0.2 reads nothing here: the value is read by `current`.
        let seen = if self.shared.spin() {
            None
        } else {
            Some(
                self.kv(KvOp::Other, {
                    let key = key.clone();
                    move |kv| kv.get(&key)
                })
                .await
                .map_err(wasi_err)?,
            )
        };
        self.table
            .push(CasRes { key, seen })
            .map_err(|e| wasi_kv::Error::Other(format!("resource table: {e}")))
    }

    async fn current(&mut self, cas: Resource<CasRes>) -> Result<Option<Vec<u8>>, wasi_kv::Error> {
        let handle = self
            .table
            .get(&cas)
            .map_err(|e| wasi_kv::Error::Other(e.to_string()))?;
        if !self.shared.spin() {
            return Ok(handle.seen.clone().flatten());
        }
        // Spin 4.0.2 reads the store on every call and remembers the value
        // for `swap`.
        let key = handle.key.clone();
        let now = self
            .kv(KvOp::Other, move |kv| kv.get(&key))
            .await
            .map_err(wasi_err)?;
        self.table
            .get_mut(&cas)
            .map_err(|e| wasi_kv::Error::Other(e.to_string()))?
            .seen = Some(now.clone());
        Ok(now)
    }

    async fn drop(&mut self, rep: Resource<CasRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl batch::Host for HostState {
    async fn get_many(
        &mut self,
        _: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> Result<Vec<(String, Option<Vec<u8>>)>, wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.get_many_pairs(&keys))
            .await
            .map_err(wasi_err)
    }

    async fn set_many(
        &mut self,
        _: Resource<BucketRes>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.set_many(&key_values))
            .await
            .map_err(wasi_err)
    }

    async fn delete_many(
        &mut self,
        _: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.delete_many(&keys))
            .await
            .map_err(wasi_err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::kv::{FailingKv, KvBackend, KvEmulation, SqliteKv};
    use crate::outbound::AllowList;
    use crate::runtime::{Grants, Shared};
    use atomics::{Host as _, HostCas as _};
    use batch::Host as _;

    #[test]
    fn variable_names_follow_spin_rules() {
        assert!(valid_variable_name("jwt_access_secret"));
        assert!(valid_variable_name("a1"));
        assert!(!valid_variable_name("JWT"));
        assert!(!valid_variable_name("1a"));
        assert!(!valid_variable_name("a__b"));
        assert!(!valid_variable_name("a_"));
        assert!(!valid_variable_name(""));
    }

    fn state(
        name: &str,
        fail_after: Option<u64>,
        emulation: KvEmulation,
    ) -> (HostState, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("tfa-rt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut kv: Arc<dyn KvBackend> = Arc::new(SqliteKv::open_dir(&dir, emulation).unwrap());
        if let Some(n) = fail_after {
            kv = Arc::new(FailingKv::new(kv, n, None));
        }
        let shared = Arc::new(Shared {
            kv,
            variables: [("node_env".to_string(), "production".to_string())]
                .into_iter()
                .collect(),
            environment: Vec::new(),
            allow: Arc::new(AllowList::default()),
            guard: Arc::default(),
            clock_offset: Duration::ZERO,
            kv_count: false,
            grants: Grants::API,
            chain: None,
            gate: crate::gate::Gate::new(1),
        });
        (HostState::new(&shared), dir)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn spin_and_wasi_interfaces_share_one_store() {
        let (mut s, dir) = state("share", None, KvEmulation::None);
        assert!(matches!(
            key_value::HostStore::open(&mut s, "other".into()).await,
            Err(key_value::Error::NoSuchStore)
        ));
        assert!(matches!(
            wasi_kv::Host::open(&mut s, "other".into()).await,
            Err(wasi_kv::Error::NoSuchStore)
        ));
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        let rep = st.rep();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"1".to_vec())
            .await
            .unwrap();
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        let b = || Resource::<BucketRes>::new_borrow(bucket.rep());
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "a".into())
                .await
                .unwrap(),
            Some(b"1".to_vec())
        );
        // Counters.
        assert_eq!(s.increment(b(), "n".into(), 2).await.unwrap(), 2);
        assert_eq!(s.increment(b(), "n".into(), 0).await.unwrap(), 2);
        // Batch: every asked key answered, in order.
        let many = s
            .get_many(b(), vec!["n".into(), "zz".into(), "a".into()])
            .await
            .unwrap();
        assert_eq!(
            many,
            vec![
                ("n".to_string(), Some(b"2".to_vec())),
                ("zz".to_string(), None),
                ("a".to_string(), Some(b"1".to_vec())),
            ]
        );
        // CAS: wins on the value seen, fails after someone else wrote, and
        // never creates a missing key.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        let current = s.current(Resource::new_borrow(cas.rep())).await.unwrap();
        assert_eq!(current, Some(b"1".to_vec()));
        s.swap(cas, b"2".to_vec()).await.unwrap();
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"3".to_vec())
            .await
            .unwrap();
        match s.swap(cas, b"4".to_vec()).await {
            Err(atomics::CasError::CasFailed(again)) => {
                let now = s.current(Resource::new_borrow(again.rep())).await.unwrap();
                assert_eq!(now, Some(b"3".to_vec()));
            }
            other => panic!("expected CasFailed, got {:?}", other.is_ok()),
        }
        let cas = atomics::HostCas::new(&mut s, b(), "missing".into())
            .await
            .unwrap();
        assert!(matches!(
            s.swap(cas, b"x".to_vec()).await,
            Err(atomics::CasError::CasFailed(_))
        ));
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "missing".into())
                .await
                .unwrap(),
            None
        );
        // Variables.
        assert_eq!(
            variables::Host::get(&mut s, "node_env".into())
                .await
                .unwrap(),
            "production"
        );
        assert!(matches!(
            variables::Host::get(&mut s, "nope".into()).await,
            Err(variables::Error::Undefined(_))
        ));
        assert!(matches!(
            variables::Host::get(&mut s, "NODE_ENV".into()).await,
            Err(variables::Error::InvalidName(_))
        ));
        // The same variables through wasi:config: one, or all at once.
        assert_eq!(
            wasi_config::Host::get(&mut s, "node_env".into())
                .await
                .unwrap(),
            Some("production".into())
        );
        assert_eq!(
            wasi_config::Host::get(&mut s, "nope".into()).await.unwrap(),
            None
        );
        assert_eq!(
            wasi_config::Host::get_all(&mut s).await.unwrap(),
            vec![("node_env".to_string(), "production".to_string())]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn store_failures_are_error_values() {
        let (mut s, dir) = state("fail", Some(1), KvEmulation::None);
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        assert!(matches!(
            key_value::HostStore::get(&mut s, Resource::new_borrow(st.rep()), "a".into()).await,
            Err(key_value::Error::Other(_))
        ));
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        assert!(matches!(
            s.increment(Resource::new_borrow(bucket.rep()), "n".into(), 1)
                .await,
            Err(wasi_kv::Error::Other(_))
        ));
        assert!(
            atomics::HostCas::new(&mut s, Resource::new_borrow(bucket.rep()), "k".into())
                .await
                .is_err()
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `KV_EMULATE=spin-4.0.2` over SQLite, through the interfaces the
    /// component calls: what Spin 4.0.2's SQLite store and dispatch do.
    #[tokio::test(flavor = "multi_thread")]
    async fn spin_4_0_2_sqlite_through_the_interfaces() {
        let (mut s, dir) = state("spin402", None, KvEmulation::Spin402);
        // Labels the manifest does not grant are access-denied.
        assert!(matches!(
            key_value::HostStore::open(&mut s, "other".into()).await,
            Err(key_value::Error::AccessDenied)
        ));
        assert!(matches!(
            wasi_kv::Host::open(&mut s, "other".into()).await,
            Err(wasi_kv::Error::AccessDenied)
        ));
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        let rep = st.rep();
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        let b = || Resource::<BucketRes>::new_borrow(bucket.rep());

        // A counter reads back, through Spin's key-value, as 8 LE bytes.
        assert_eq!(s.increment(b(), "n".into(), 258).await.unwrap(), 258);
        assert_eq!(
            key_value::HostStore::get(&mut s, Resource::new_borrow(rep), "n".into())
                .await
                .unwrap(),
            Some(258i64.to_le_bytes().to_vec())
        );
        // Incrementing a value that is not 8 bytes is an error, not a trap.
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"1".to_vec())
            .await
            .unwrap();
        assert!(matches!(
            s.increment(b(), "a".into(), 1).await,
            Err(wasi_kv::Error::Other(_))
        ));

        // get-many: only the keys that exist, each once, in key order.
        let many = s
            .get_many(b(), vec!["zz".into(), "n".into(), "a".into(), "n".into()])
            .await
            .unwrap();
        assert_eq!(
            many,
            vec![
                ("a".to_string(), Some(b"1".to_vec())),
                ("n".to_string(), Some(258i64.to_le_bytes().to_vec())),
            ]
        );
        assert_eq!(s.get_many(b(), vec![]).await.unwrap(), vec![]);

        // CAS on a missing key writes unconditionally.
        let cas = atomics::HostCas::new(&mut s, b(), "fresh".into())
            .await
            .unwrap();
        assert_eq!(
            s.current(Resource::new_borrow(cas.rep())).await.unwrap(),
            None
        );
        s.swap(cas, b"x".to_vec()).await.unwrap();
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "fresh".into())
                .await
                .unwrap(),
            Some(b"x".to_vec())
        );
        // So does a swap without `current` (nothing was read), even over
        // a value someone wrote.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"2".to_vec())
            .await
            .unwrap();
        s.swap(cas, b"3".to_vec()).await.unwrap();
        // With `current`, it is UPDATE … WHERE value = old: the value read
        // when `current` ran (not when the handle was made) wins…
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"4".to_vec())
            .await
            .unwrap();
        assert_eq!(
            s.current(Resource::new_borrow(cas.rep())).await.unwrap(),
            Some(b"4".to_vec())
        );
        s.swap(cas, b"5".to_vec()).await.unwrap();
        // …and a write after `current` makes it fail, with a fresh handle.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        s.current(Resource::new_borrow(cas.rep())).await.unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"6".to_vec())
            .await
            .unwrap();
        match s.swap(cas, b"7".to_vec()).await {
            Err(atomics::CasError::CasFailed(again)) => {
                let now = s.current(Resource::new_borrow(again.rep())).await.unwrap();
                assert_eq!(now, Some(b"6".to_vec()));
            }
            other => panic!("expected CasFailed, got {:?}", other.is_ok()),
        }

        // list-keys: no cursor allowed.
        let page = wasi_kv::HostBucket::list_keys(&mut s, b(), None)
            .await
            .unwrap();
        assert_eq!(page.keys, ["a", "fresh", "n"]);
        assert!(matches!(
            wasi_kv::HostBucket::list_keys(&mut s, b(), Some("a".into())).await,
            Err(wasi_kv::Error::Other(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
