//! The signing secrets in force, and the keys derived from them.
//!
//! Configured secrets are used as they are. Outside production a missing
//! secret is generated once, kept in the store under `sys:secret:{NAME}` and
//! shared by every instance; the first instance to claim
//! `sys:secret-claim:{NAME}` writes it, the others read it.

use crate::contract::config::{Config, SECRET_NAMES};
use crate::contract::error::ApiError;
use crate::contract::ports::Env;
use crate::crypto::codes::derive_key;
use crate::crypto::tokens::TokenKeys;

/// Everything derived from the four secrets.
#[derive(Clone)]
pub struct Keys {
    /// JWT signing and verification.
    pub tokens: TokenKeys,
    /// Key of the backup-code hashes.
    pub backup: [u8; 32],
    /// Key of the SMS / e-mail code hashes.
    pub otp: [u8; 32],
}

impl Keys {
    /// Keys from four secrets in [`SECRET_NAMES`] order.
    pub fn from_secrets(secrets: &[String; 4], config: &Config) -> Keys {
        Keys {
            tokens: TokenKeys::new(
                secrets[0].as_bytes(),
                secrets[1].as_bytes(),
                secrets[2].as_bytes(),
                secrets[3].as_bytes(),
                &config.jwt_issuer,
                &config.jwt_audience,
            ),
            backup: derive_key(secrets[2].as_bytes(), "backup-codes"),
            otp: derive_key(secrets[2].as_bytes(), "otp-codes"),
        }
    }
}

/// Resolves the secrets: configured ones directly, missing ones from the
/// store (generating them the first time).
pub fn resolve(config: &Config, env: &mut Env) -> Result<Keys, ApiError> {
    let mut out: [String; 4] = Default::default();
    for (i, name) in SECRET_NAMES.iter().enumerate() {
        out[i] = match &config.secrets[i] {
            Some(s) => s.clone(),
            None => stored_secret(env, name)?,
        };
    }
    Ok(Keys::from_secrets(&out, config))
}

fn stored_secret(env: &mut Env, name: &str) -> Result<String, ApiError> {
    let key = format!("sys:secret:{name}");
    if let Some(v) = env.store.get(&key)? {
        return String::from_utf8(v).map_err(|_| ApiError::Internal);
    }
    if env
        .store
        .increment(&format!("sys:secret-claim:{name}"), 1)?
        == 1
    {
        let secret = crate::plumbing::util::random_hex(env, 48);
        env.store.set(&key, secret.as_bytes())?;
        return Ok(secret);
    }
    // Another instance is writing it right now.
    match env.store.get(&key)? {
        Some(v) => String::from_utf8(v).map_err(|_| ApiError::Internal),
        None => Err(ApiError::Unavailable),
    }
}
