//! Audit records: built during a request, persisted after the response.
//!
//! Records are kept per user as `audit:{uid}:{n}` with `n` from the atomic
//! counter `auditn:{uid}`, so the newest are found without listing keys.
//! Events with no known user (a login for an unknown name) go under the user
//! id `-`. A record never carries a secret, a code or a token: handlers put
//! only ids, method names and reasons in `details`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::ports::Env;

/// Every action name the service records.
pub const ACTIONS: &[&str] = &[
    "register",
    "login_success",
    "login_failed",
    "logout",
    "token_refreshed",
    "sessions_revoked",
    "2fa_setup_started",
    "2fa_enabled",
    "2fa_disabled",
    "2fa_verified",
    "2fa_failed",
    "code_sent",
    "backup_code_used",
    "backup_codes_regenerated",
    "trusted_device_added",
    "trusted_device_removed",
    "api_key_created",
    "api_key_revoked",
    "webhook_created",
    "webhook_deleted",
    "rate_limited",
];

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Record id.
    pub id: String,
    /// Owner of the record (user id), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Action name from [`ACTIONS`].
    pub action: String,
    /// Whether the action succeeded.
    pub success: bool,
    /// Client address.
    pub ip_address: String,
    /// Client user agent.
    pub user_agent: String,
    /// Extra details; never secrets, codes or tokens.
    pub details: Value,
    /// ISO 8601 time.
    pub created_at: String,
}

/// Writes `record` to the store.
pub fn persist(env: &mut Env, record: &AuditRecord) -> Result<(), ApiError> {
    let owner = record.user_id.as_deref().unwrap_or("-");
    let n = env.store.increment(&format!("auditn:{owner}"), 1)?;
    crate::records::save(env.store, &format!("audit:{owner}:{n}"), record)
}
