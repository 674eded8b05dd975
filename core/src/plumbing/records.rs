//! What the service keeps in the store, and the few ways it reads and
//! writes it.
//!
//! Key layout (every key the service writes):
//!
//! | key | value |
//! |---|---|
//! | `user:{id}` | [`UserRecord`] (JSON), changed only with [`update`] or [`update_kept`] |
//! | `email:{lower-case e-mail}` | user id |
//! | `username:{lower-case name}` | user id |
//! | `claim:email:{..}`, `claim:username:{..}` | counters; 1 = claimed (removed after 10 minutes) |
//! | `sess:{sid}` | [`crate::api::sessions::SessionRecord`] |
//! | `dev:{did}` | [`crate::api::devices::DeviceRecord`] |
//! | `apikey:{id}`, `apikeyp:{prefix}` | [`crate::api::apikeys::ApiKeyRecord`], prefix → id |
//! | `rl:{rule}:{subject}:{window}` | rate-limit counters |
//! | `tt:{jti}` | temp-token counter: attempts, plus `mfa::EXCHANGED` once exchanged |
//! | `wach:{challenge}`, `wachu:{challenge}` | a WebAuthn challenge and its single-use counter (see [`crate::api::webauthn`]) |
//! | `wacid:{credentialId}` | counter claiming a passkey's credential ID for one user |
//! | `mfafail:{uid}` / `mfalock:{uid}` | failed second-factor counter / lock record |
//! | `audit:{uid}:{n}`, `auditn:{uid}` | audit records and their sequence counter |
//! | `sys:secret:{NAME}` | generated development secrets |
//! | `hk:…` | the housekeeping index (see [`crate::plumbing::housekeeping`]) |
//! | `lk:{key}:{period}` | lock counters (see [`crate::plumbing::lock`]) |
//!
//! Records are JSON. The user record leaves out its empty lists and absent
//! options (each is read back with its default, as every version since the
//! first reads them), so a verification decodes and encodes fewer keys.
//! A record that several requests may change at once is
//! only ever changed with [`update`] and removed with [`remove`], which hold
//! the record's lock (`increment`-based, so it works on every Spin
//! backend): the read, the change and the write happen as one step, and a
//! removal cannot be undone by an update that read the record before it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::contract::error::ApiError;
use crate::contract::ports::{Env, Store};
use crate::plumbing::lock;

/// A user and everything that hangs off it but needs no key of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserRecord {
    pub id: String,
    pub email: String,
    pub username: String,
    pub password_hash: String,
    pub two_factor_enabled: bool,
    pub created_ms: u64,
    pub updated_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<MethodRecord>,
    /// Session ids with their expiry, so expired ones can be pruned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<Ref>,
    /// Trusted-device ids with their expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSet>,
    /// The last TOTP time step accepted (replay protection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totp_last_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_totp: Option<PendingTotp>,
    /// Outstanding SMS / e-mail codes (at most one per method and purpose).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<OtpCode>,
    /// Ids of the user's API keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<String>,
    /// Ids of the user's webhooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<String>,
    /// The user's passkeys (see [`crate::api::webauthn`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webauthn: Vec<WebauthnCredential>,
}

/// A stored passkey.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebauthnCredential {
    /// The service's id of it (UUID), used in paths.
    pub id: String,
    /// The credential ID, base64url.
    pub credential_id: String,
    /// The COSE public key, base64url (parsed again for every assertion).
    pub public_key: String,
    /// COSE algorithm (-7, -8, -257).
    pub algorithm: i64,
    /// Last signature counter.
    pub sign_count: u32,
    /// Transports reported at registration.
    #[serde(default)]
    pub transports: Vec<String>,
    /// BE at registration (a synced passkey).
    pub backup_eligible: bool,
    /// BS as last seen.
    pub backed_up: bool,
    /// AAGUID, hex.
    pub aaguid: String,
    /// The user's name for it.
    pub name: String,
    pub created_ms: u64,
    #[serde(default)]
    pub last_used_ms: Option<u64>,
}

/// An id with its expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ref {
    pub id: String,
    pub exp_ms: u64,
}

/// A second-factor method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodRecord {
    pub id: String,
    /// `totp`, `sms`, `email` or `webauthn` (one record for all passkeys).
    pub kind: String,
    pub enabled: bool,
    /// TOTP secret, base32 (TOTP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Phone number, E.164 (SMS only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    /// Address (e-mail only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    pub verified_ms: u64,
    pub created_ms: u64,
}

/// The user's backup codes, as keyed hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSet {
    pub codes: Vec<BackupSlot>,
}

/// One backup code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSlot {
    pub hash: String,
    pub used: bool,
}

/// A TOTP setup waiting for its first code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingTotp {
    pub secret: String,
    pub backup_hashes: Vec<String>,
    pub exp_ms: u64,
}

/// Why an SMS / e-mail code was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Purpose {
    /// Confirms a new method (`/2fa/{sms,email}/verify-setup`).
    Setup,
    /// Second factor of a login (`/2fa/verify`).
    Login,
}

/// An SMS or e-mail code, hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtpCode {
    /// `sms` or `email`.
    pub method: String,
    pub purpose: Purpose,
    /// Where it went (phone or address).
    pub target: String,
    pub hash: String,
    pub exp_ms: u64,
    pub attempts: u32,
}

impl UserRecord {
    /// The enabled method of `kind`, if any.
    pub fn method(&self, kind: &str) -> Option<&MethodRecord> {
        self.methods.iter().find(|m| m.kind == kind && m.enabled)
    }

    /// Types of the enabled methods, in a stable order.
    pub fn method_kinds(&self) -> Vec<&'static str> {
        ["totp", "sms", "email", "webauthn"]
            .into_iter()
            .filter(|k| self.method(k).is_some())
            .collect()
    }

    /// Drops expired pending state (codes, TOTP setup, session and device
    /// references) so the record never grows without bound.
    pub fn prune(&mut self, now_ms: u64) {
        self.codes.retain(|c| c.exp_ms > now_ms);
        if self
            .pending_totp
            .as_ref()
            .is_some_and(|p| p.exp_ms <= now_ms)
        {
            self.pending_totp = None;
        }
        self.sessions.retain(|r| r.exp_ms > now_ms);
        self.devices.retain(|r| r.exp_ms > now_ms);
    }

    /// Recomputes `two_factor_enabled` from the methods; voids backup codes
    /// when no method is left.
    pub fn refresh_two_factor(&mut self) {
        self.two_factor_enabled = self.methods.iter().any(|m| m.enabled);
        if !self.two_factor_enabled {
            self.backup = None;
            self.totp_last_step = None;
        }
    }
}

/// Checks the record's UTF-8 once, then parses it as text: `from_slice`
/// checks each string on its own (a record has dozens), which was about
/// 2 % of the instructions of `GET /auth/me` (callgrind). The two accept
/// the same records: JSON outside strings is ASCII.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ApiError::Internal)?;
    serde_json::from_str(text).map_err(|_| ApiError::Internal)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|_| ApiError::Internal)
}

/// Whether `a` and `b` are the same bytes, compared eight at a time: `==`
/// on byte slices calls the C library's `memcmp`, which wasi-libc runs a
/// byte at a time (a 1.7 KB user record found unchanged took 0.8 % of a
/// `/2fa/verify`'s host CPU that way). Not constant-time: not for secrets.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or_default());
    let words = x
        .by_ref()
        .zip(y.by_ref())
        .fold(0, |d, (p, q)| d | (word(p) ^ word(q)));
    words == 0 && x.remainder() == y.remainder()
}

/// Reads and decodes the record at `key`.
/// The key of a user's record, `user:{id}`.
pub fn user_key(id: &str) -> String {
    crate::plumbing::util::key(&["user:", id])
}

pub fn load<T: DeserializeOwned>(store: &dyn Store, key: &str) -> Result<Option<T>, ApiError> {
    match store.get(key)? {
        None => Ok(None),
        Some(bytes) => decode(&bytes).map(Some),
    }
}

/// Encodes and writes `value` at `key` unconditionally. Only for keys the
/// caller owns exclusively (a fresh id, a name it has just claimed).
pub fn save<T: Serialize>(store: &dyn Store, key: &str, value: &T) -> Result<(), ApiError> {
    store.set(key, &encode(value)?)?;
    Ok(())
}

/// Reads and decodes the records at `keys`, one key at a time (no batch
/// read: see [`crate::contract::ports`]), skipping missing ones. Records that do not
/// decode are skipped too: a list shows what it can.
pub fn load_each<T: DeserializeOwned>(
    store: &dyn Store,
    keys: &[String],
) -> Result<Vec<T>, ApiError> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(bytes) = store.get(key)? {
            if let Ok(value) = decode(&bytes) {
                out.push(value);
            }
        }
    }
    Ok(out)
}

/// Reads the record at `key`, lets `change` modify it, and writes it back,
/// all under the record's lock ([`crate::plumbing::lock`]), so concurrent updates of
/// one record happen one after the other and none is lost. When `change`
/// returns an error nothing is written; when it changes nothing the record
/// is not rewritten. A missing record is `Ok(None)` (`change` does not run).
pub fn update<T, R>(
    env: &Env,
    key: &str,
    change: impl FnOnce(&mut T) -> Result<R, ApiError>,
) -> Result<Option<R>, ApiError>
where
    T: Serialize + DeserializeOwned,
{
    update_with(env, key, decode, change)
}

/// A record as [`load_kept`] read it: its bytes and their decoded value
/// (which it dereferences to), so that [`update_kept`] can skip decoding
/// the same bytes again under the lock.
pub struct Kept<T> {
    bytes: Vec<u8>,
    value: T,
}

impl<T> std::ops::Deref for Kept<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// [`load`], keeping the bytes read beside the value.
pub fn load_kept<T: DeserializeOwned>(
    store: &dyn Store,
    key: &str,
) -> Result<Option<Kept<T>>, ApiError> {
    match store.get(key)? {
        None => Ok(None),
        Some(bytes) => Ok(Some(Kept {
            value: decode(&bytes)?,
            bytes,
        })),
    }
}

/// [`update`] of a record read before with [`load_kept`]: the record is
/// read again under its lock as always, and when its bytes are the ones
/// `kept` holds (nobody changed it meanwhile) `change` gets a copy of the
/// kept value instead of a second decoding of the same JSON (a user record
/// is about 1.7 KB: decoding it was 2.3 % of a `/2fa/verify`'s host CPU).
pub fn update_kept<T, R>(
    env: &Env,
    key: &str,
    kept: &Kept<T>,
    change: impl FnOnce(&mut T) -> Result<R, ApiError>,
) -> Result<Option<R>, ApiError>
where
    T: Serialize + DeserializeOwned + Clone,
{
    let read = |bytes: &[u8]| {
        if same_bytes(bytes, &kept.bytes) {
            Ok(kept.value.clone())
        } else {
            decode(bytes)
        }
    };
    update_with(env, key, read, change)
}

fn update_with<T, R>(
    env: &Env,
    key: &str,
    read: impl FnOnce(&[u8]) -> Result<T, ApiError>,
    change: impl FnOnce(&mut T) -> Result<R, ApiError>,
) -> Result<Option<R>, ApiError>
where
    T: Serialize,
{
    let store = env.store;
    lock::with(store, key, env.now_ms, || {
        let Some(old) = store.get(key)? else {
            return Ok(None);
        };
        let mut value = read(&old)?;
        let out = change(&mut value)?;
        let new = encode(&value)?;
        if !same_bytes(&new, &old) {
            store.set(key, &new)?;
        }
        Ok(Some(out))
    })
}

/// Replaces the value at `key` with `new` if it is `old`, under the key's
/// lock: compare-and-swap for the few plain values (queue pointers) that
/// are not JSON records. Returns whether it replaced.
pub fn replace(env: &Env, key: &str, old: &[u8], new: &[u8]) -> Result<bool, ApiError> {
    let store = env.store;
    lock::with(store, key, env.now_ms, || {
        if store.get(key)?.as_deref() != Some(old) {
            return Ok(false);
        }
        store.set(key, new)?;
        Ok(true)
    })
}

/// Removes the record at `key` under its lock, so that no update that read
/// it before can write it back.
pub fn remove(env: &Env, key: &str) -> Result<(), ApiError> {
    lock::with(env.store, key, env.now_ms, || Ok(env.store.delete(key)?))
}

/// Removes the record at `key` under its lock if its `expMs` field is not
/// after `env.now_ms`. A record without a readable expiry is left alone.
/// Returns whether it was removed.
pub fn remove_expired(env: &Env, key: &str) -> Result<bool, ApiError> {
    let store = env.store;
    lock::with(store, key, env.now_ms, || {
        let Some(bytes) = store.get(key)? else {
            return Ok(false);
        };
        let exp = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("expMs").and_then(|e| e.as_u64()));
        if exp.is_none_or(|e| e > env.now_ms) {
            return Ok(false);
        }
        store.delete(key)?;
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_finds_every_difference() {
        for len in 0..40usize {
            let a: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37)).collect();
            assert!(same_bytes(&a, &a.clone()), "len {len}");
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!same_bytes(&a, &b), "len {len}, byte {at}");
            }
            assert!(!same_bytes(&a, &a[..len.saturating_sub(1)]) || len == 0);
        }
    }
}
