//! What the service keeps in the store, and the few ways it reads and
//! writes it.
//!
//! Key layout (every key the service writes):
//!
//! | key | value |
//! |---|---|
//! | `user:{id}` | [`UserRecord`] (JSON), updated only by compare-and-swap |
//! | `email:{lower-case e-mail}` | user id |
//! | `username:{lower-case name}` | user id |
//! | `claim:email:{..}`, `claim:username:{..}` | counters; 1 = claimed (removed after 10 minutes) |
//! | `sess:{sid}` | [`crate::sessions::SessionRecord`] |
//! | `dev:{did}` | [`crate::devices::DeviceRecord`] |
//! | `apikey:{id}`, `apikeyp:{prefix}` | [`crate::apikeys::ApiKeyRecord`], prefix → id |
//! | `rl:{rule}:{subject}:{window}` | rate-limit counters |
//! | `tt:{jti}`, `ttu:{jti}` | temp-token attempt and use counters |
//! | `mfafail:{uid}` / `mfalock:{uid}` | failed second-factor counter / lock record |
//! | `audit:{uid}:{n}`, `auditn:{uid}` | audit records and their sequence counter |
//! | `sys:secret:{NAME}` | generated development secrets |
//! | `hk:…` | the housekeeping index (see [`crate::housekeeping`]) |
//!
//! Records are JSON. A record that several requests may change at once is
//! only ever changed with [`update`], a compare-and-swap loop.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::ports::Store;

/// How often [`update`] retries a compare-and-swap that lost a race.
const CAS_RETRIES: usize = 200;

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
    #[serde(default)]
    pub methods: Vec<MethodRecord>,
    /// Session ids with their expiry, so expired ones can be pruned.
    #[serde(default)]
    pub sessions: Vec<Ref>,
    /// Trusted-device ids with their expiry.
    #[serde(default)]
    pub devices: Vec<Ref>,
    #[serde(default)]
    pub backup: Option<BackupSet>,
    /// The last TOTP time step accepted (replay protection).
    #[serde(default)]
    pub totp_last_step: Option<u64>,
    #[serde(default)]
    pub pending_totp: Option<PendingTotp>,
    /// Outstanding SMS / e-mail codes (at most one per method and purpose).
    #[serde(default)]
    pub codes: Vec<OtpCode>,
    /// Ids of the user's API keys.
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// Ids of the user's webhooks.
    #[serde(default)]
    pub webhooks: Vec<String>,
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
    /// `totp`, `sms` or `email`.
    pub kind: String,
    pub enabled: bool,
    /// TOTP secret, base32 (TOTP only).
    #[serde(default)]
    pub secret: Option<String>,
    /// Phone number, E.164 (SMS only).
    #[serde(default)]
    pub phone: Option<String>,
    /// Address (e-mail only).
    #[serde(default)]
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
        ["totp", "sms", "email"]
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

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|_| ApiError::Internal)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|_| ApiError::Internal)
}

/// Reads and decodes the record at `key`.
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

/// Reads the record at `key`, lets `change` modify it, and writes it back
/// with compare-and-swap, retrying from a fresh read when another writer got
/// there first. `change` may run several times and must only touch the
/// record. When it returns an error nothing is written. A missing record is
/// `Ok(None)`.
pub fn update<T, R>(
    store: &dyn Store,
    key: &str,
    mut change: impl FnMut(&mut T) -> Result<R, ApiError>,
) -> Result<Option<R>, ApiError>
where
    T: Serialize + DeserializeOwned,
{
    for _ in 0..CAS_RETRIES {
        let Some(old) = store.get(key)? else {
            return Ok(None);
        };
        let mut value: T = decode(&old)?;
        let out = change(&mut value)?;
        let new = encode(&value)?;
        if new == old || store.compare_and_swap(key, &old, &new)? {
            return Ok(Some(out));
        }
    }
    Err(ApiError::Unavailable)
}
