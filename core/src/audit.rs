//! Audit records (the records themselves; persisting happens after the response).

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Owner of the record (user id), when known.
    pub user_id: Option<String>,
    /// Action name from the decisions' list.
    pub action: String,
    /// Whether the action succeeded.
    pub success: bool,
    /// Client address.
    pub ip_address: Option<String>,
    /// Client user agent.
    pub user_agent: Option<String>,
    /// Extra JSON details; never secrets, codes or tokens.
    pub details: String,
    /// Unix time in milliseconds.
    pub created_ms: u64,
}
