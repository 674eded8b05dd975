//! What the service asks its host to do: deliveries that must happen before
//! the answer (an SMS or e-mail carrying a code, whose failure the client must
//! hear about) and effects that happen after it (audit records, later
//! webhooks).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::http::Response;

/// A response plus the effects to run once it has been sent.
#[derive(Debug)]
pub struct Reply {
    /// What the client is told.
    pub response: Response,
    /// What happens after the client has been answered.
    pub effects: Vec<Effect>,
    /// The user the request acted for, once a credential proved it or
    /// tokens were issued to it: for the operator's request log, never for
    /// the client (a host that shows it must strip it from the response).
    pub user_id: Option<String>,
}

impl Reply {
    /// Drops this request's check of the time-bucketed queues
    /// ([`Effect::Maintenance`]: the `sched:next` read after the response),
    /// for a host that has another request check them often enough.
    /// `tfa-host` lets one request a second check and marks the others
    /// (`spin-tfa-maintenance: skip`); Spin marks none, so there every
    /// request checks. Nothing else after the response changes: audit
    /// records, webhook fan-out and expiry filings still happen.
    pub fn skip_maintenance(&mut self) {
        Effect::drop_maintenance(&mut self.effects);
    }
}

/// A message the host must deliver before the client is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// An SMS, as a complete HTTP request to the SMS gateway (Twilio's
    /// Messages API): the host sends it as is and reports success for a 2xx.
    Sms(HttpCall),
    /// An e-mail to send over SMTP.
    Email(EmailMessage),
}

/// An outbound HTTP request, fully formed by core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// Method, e.g. `POST`.
    pub method: String,
    /// Absolute URL.
    pub url: String,
    /// Headers, including `Content-Type`, `Content-Length` and `Authorization`.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

// The e-mail and how to reach its server: the SMTP crate's types, so the
// host hands core's message to `tfa_smtp::SmtpClient` as it is.
pub use tfa_smtp::{EmailMessage, SmtpTls};

/// Why a delivery failed (detail for the log; the client sees a fixed message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError(pub String);

/// Work that happens after the response has been sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// An audit record to persist ([`crate::Service::complete`] does it),
    /// with the ids of its user's webhooks when the request had read the
    /// user record anyway (the fan-out then need not read it again).
    Audit(AuditRecord, Option<Vec<String>>),
    /// A line for the operator's log only (never shown to the client).
    Log(String),
    /// A webhook delivery already recorded, to attempt after the response.
    Webhook(WebhookCall),
    /// A key the request created that expires, to file in the expiry index
    /// ([`crate::plumbing::housekeeping`]) so that it is swept.
    Expire(Expiry),
    /// Check the time-bucketed queues (webhook retries, expiry sweeps) after
    /// the response. Every request asks for it except `GET /health` and
    /// `/health/ready`, whose whole cost is one store read.
    Maintenance,
}

impl Effect {
    /// Removes the queue check from `effects` (a probe that asks for none,
    /// or a request whose host has another one check).
    pub(crate) fn drop_maintenance(effects: &mut Vec<Effect>) {
        effects.retain(|e| !matches!(e, Effect::Maintenance));
    }
}

/// What a host does after the response: log these lines, then attempt each
/// webhook call and report it with [`crate::Service::webhook_result`].
#[derive(Debug, Default)]
pub struct Completion {
    /// Lines for the operator's log.
    pub log: Vec<String>,
    /// Webhook deliveries to attempt now.
    pub webhooks: Vec<WebhookCall>,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Record id.
    pub id: String,
    /// Owner of the record (user id), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Action name from [`ACTIONS`](crate::api::audit::ACTIONS).
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

/// A delivery attempt for the host to make after the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookCall {
    /// Report the outcome with this id.
    pub delivery_id: String,
    /// The signed POST.
    pub call: HttpCall,
}

/// A key to delete once it has expired: what a request hands on in
/// [`Effect::Expire`], for [`crate::plumbing::housekeeping::schedule`] after
/// the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// The index entry: `c|{key}` for a counter, `r|{key}` for a record.
    entry: String,
    exp_ms: u64,
}

impl Expiry {
    /// The counter at `key`, deleted after `exp_ms`.
    pub fn counter(key: &str, exp_ms: u64) -> Self {
        Expiry {
            entry: ["c|", key].concat(),
            exp_ms,
        }
    }

    /// The JSON record at `key` (which has an `expMs` field), deleted once
    /// that field is in the past.
    pub fn record(key: &str, exp_ms: u64) -> Self {
        Expiry {
            entry: ["r|", key].concat(),
            exp_ms,
        }
    }

    /// The key it names.
    pub fn key(&self) -> &str {
        self.entry.get(2..).unwrap_or_default()
    }

    /// The expiry index's entry: `c|{key}` or `r|{key}`.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// When the key expires (ms since the epoch).
    pub fn exp_ms(&self) -> u64 {
        self.exp_ms
    }
}
