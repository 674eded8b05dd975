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
use crate::crypto::tokens::{TokenKeys, TokenKind};
use crate::plumbing::util;
use std::cell::OnceCell;
use std::rc::Rc;

/// Everything derived from the four secrets. Each key is derived the first
/// time it is asked for (most requests need one token kind and no code key).
#[derive(Clone)]
pub struct Keys {
    /// JWT signing and verification. Its temp-token secret is also the
    /// one the code keys are derived from.
    pub tokens: TokenKeys,
    backup: OnceCell<[u8; 32]>,
    otp: OnceCell<[u8; 32]>,
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
            backup: OnceCell::new(),
            otp: OnceCell::new(),
        }
    }

    /// Key of the backup-code hashes.
    pub fn backup(&self) -> [u8; 32] {
        *self
            .backup
            .get_or_init(|| derive_key(self.tokens.secret(TokenKind::Temp), "backup-codes"))
    }

    /// Key of the SMS / e-mail code hashes.
    pub fn otp(&self) -> [u8; 32] {
        *self
            .otp
            .get_or_init(|| derive_key(self.tokens.secret(TokenKind::Temp), "otp-codes"))
    }
}

/// Resolves the secrets: configured ones directly, missing ones from the
/// store (generating them the first time).
pub fn resolve(config: &Config, env: &mut Env) -> Result<Rc<Keys>, ApiError> {
    let mut out: [String; 4] = Default::default();
    for (i, name) in SECRET_NAMES.iter().enumerate() {
        out[i] = match &config.secrets[i] {
            Some(s) => s.clone(),
            None => stored_secret(env, name)?,
        };
    }
    Ok(Rc::new(Keys::from_secrets(&out, config)))
}

/// The key of a secret the service made on first use, `sys:secret:{name}`.
fn secret_key(name: &str) -> String {
    util::key(&["sys:secret:", name])
}

/// The counter that lets one instance make the secret `name`,
/// `sys:secret-claim:{name}`.
fn secret_claim_key(name: &str) -> String {
    util::key(&["sys:secret-claim:", name])
}

fn stored_secret(env: &mut Env, name: &str) -> Result<String, ApiError> {
    let key = secret_key(name);
    if let Some(v) = env.store.get(&key)? {
        return String::from_utf8(v).map_err(|_| ApiError::Internal);
    }
    if env.store.increment(&secret_claim_key(name), 1)? == 1 {
        let secret = util::random_hex(env, 48);
        env.store.set(&key, secret.as_bytes())?;
        return Ok(secret);
    }
    // Another instance is writing it right now.
    match env.store.get(&key)? {
        Some(v) => String::from_utf8(v).map_err(|_| ApiError::Internal),
        None => Err(ApiError::Unavailable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::tokens::Extra;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn secret_keys_keep_their_spelling() {
        assert_eq!(secret_key("JWT_SECRET"), "sys:secret:JWT_SECRET");
        assert_eq!(
            secret_claim_key("JWT_SECRET"),
            "sys:secret-claim:JWT_SECRET"
        );
    }

    /// Keys made on first use are the keys of the secrets, whichever is
    /// asked for first and whichever copy asks.
    #[test]
    fn keys_made_on_first_use_are_those_of_the_secrets() {
        let config = crate::testing::test_config(&[]);
        let secrets: [String; 4] =
            ["access", "refresh", "temp", "device"].map(|s| format!("{s}-secret"));
        let keys = Keys::from_secrets(&secrets, &config);
        let early = keys.clone();
        assert_eq!(early.otp(), derive_key(b"temp-secret", "otp-codes"));
        assert_eq!(keys.backup(), derive_key(b"temp-secret", "backup-codes"));
        assert_eq!(early.backup(), keys.backup());
        assert_ne!(keys.backup(), keys.otp());

        let extra = Extra {
            sid: Some("s".into()),
            mfa: Some(true),
            ..Extra::default()
        };
        let token = keys.tokens.issue(TokenKind::Access, "u", extra, 1_000);
        assert_eq!(
            early
                .tokens
                .verify(TokenKind::Access, &token, 1_001)
                .map(|c| c.sub),
            Ok("u".to_string())
        );
        // Each kind has its own key: the refresh key refuses it.
        assert!(early
            .tokens
            .verify(TokenKind::Refresh, &token, 1_001)
            .is_err());
    }
}
