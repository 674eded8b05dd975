//! The state of one request while a handler runs: the borrowed host ports,
//! the client's identity, and what accumulates for the response (extra
//! headers) and for after it (effects).

use serde_json::Value;

use crate::contract::config::Config;
use crate::contract::error::ApiError;
use crate::contract::http::{Request, Response};
use crate::contract::outbox::{AuditRecord, Delivery, DeliveryError, Effect};
use crate::contract::ports::Env;
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::ratelimit::{self, Rule, Slot};
use crate::plumbing::records::UserRecord;
use crate::plumbing::secrets::{self, Keys};
use crate::plumbing::util;
use std::rc::Rc;

/// What a handler produces.
pub enum Outcome {
    /// The response.
    Done(Response),
    /// A delivery to make first; then the [`Resume`] decides the response.
    Deliver(Delivery, Box<dyn Resume>),
}

/// The rest of a request that waits on a delivery. The endpoint that asks
/// for the delivery implements it (today the code sender of `api::otp`);
/// the driver calls it with the host's result. Plumbing names only this
/// trait, never the endpoint behind it.
pub trait Resume: std::fmt::Debug + Send {
    /// Decides the response once the host has tried the delivery.
    fn finish(
        self: Box<Self>,
        ctx: &mut Ctx,
        result: Result<(), DeliveryError>,
    ) -> Result<Outcome, ApiError>;
}

/// A request suspended while its host performs a delivery.
#[derive(Debug)]
pub struct Suspended {
    pub(crate) send: Box<dyn Resume>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) effects: Vec<Effect>,
    pub(crate) ip: String,
    pub(crate) ua: String,
    pub(crate) user_id: Option<String>,
    /// The request without its body (for CORS on the eventual response).
    pub(crate) req: Request,
}

/// Per-request state handed to every handler.
pub struct Ctx<'c, 'e, 'a> {
    /// Settings.
    pub config: &'c Config,
    /// Host ports and time.
    pub env: &'e mut Env<'a>,
    /// The request (an empty one while resuming after a delivery).
    pub req: &'c Request,
    /// Client address.
    pub ip: String,
    /// Client user agent (capped).
    pub ua: String,
    /// Headers to add to the response (rate limits, cookies).
    pub headers: Vec<(String, String)>,
    /// Work for after the response.
    pub effects: Vec<Effect>,
    /// The user this request was shown to act for: set when a credential
    /// proved it (access token, API key) or when tokens were issued to it.
    /// For the operator's log only ([`crate::Reply::user_id`]); never set
    /// from a failed attempt, so it tells nothing the client does not know.
    pub user_id: Option<String>,
    keys: Option<Rc<Keys>>,
}

impl<'c, 'e, 'a> Ctx<'c, 'e, 'a> {
    /// A context for `req`.
    pub fn new(config: &'c Config, env: &'e mut Env<'a>, req: &'c Request) -> Self {
        let ua: String = req
            .header_value("user-agent")
            .unwrap_or("")
            .chars()
            .filter(|c| !c.is_control())
            .take(512)
            .collect();
        Ctx {
            ip: crate::plumbing::web::client_ip(req, config),
            ua,
            config,
            env,
            req,
            headers: Vec::new(),
            effects: vec![Effect::Maintenance],
            user_id: None,
            keys: None,
        }
    }

    /// This request does not check the queues after its response (see
    /// [`Effect::Maintenance`]).
    pub fn skip_maintenance(&mut self) {
        Effect::drop_maintenance(&mut self.effects);
    }

    /// A context that resumes a suspended request (`req` is its `req`).
    pub fn resumed(
        config: &'c Config,
        env: &'e mut Env<'a>,
        req: &'c Request,
        headers: Vec<(String, String)>,
        effects: Vec<Effect>,
        ip: String,
        ua: String,
    ) -> Self {
        let mut ctx = Ctx::new(config, env, req);
        ctx.ip = ip;
        ctx.ua = ua;
        ctx.headers = headers;
        ctx.effects = effects;
        ctx
    }

    /// Suspends this context around a pending delivery.
    pub fn suspend(self, send: Box<dyn Resume>) -> Suspended {
        Suspended {
            send,
            headers: self.headers,
            effects: self.effects,
            ip: self.ip,
            ua: self.ua,
            user_id: self.user_id,
            req: Request {
                method: self.req.method.clone(),
                path: self.req.path.clone(),
                headers: self.req.headers.clone(),
                body: Vec::new(),
                peer: self.req.peer.clone(),
            },
        }
    }

    /// The signing keys (resolved on first use).
    pub fn keys(&mut self) -> Result<Rc<Keys>, ApiError> {
        if self.keys.is_none() {
            self.keys = Some(secrets::resolve(self.config, self.env)?);
        }
        self.keys.clone().ok_or(ApiError::Internal)
    }

    /// Current time in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.env.now_ms
    }

    /// Current time in seconds.
    pub fn now_secs(&self) -> u64 {
        self.env.now_secs()
    }

    /// A fresh UUID.
    pub fn uuid(&mut self) -> String {
        util::uuid_v4(self.env)
    }

    /// Counts this request against `rule` for `subject`; sets the rate-limit
    /// headers; records a `rate_limited` audit event when refused.
    pub fn limit(&mut self, rule: Rule, subject: &str) -> Result<Option<Slot>, ApiError> {
        if !self.config.rate_limit_enabled {
            return Ok(None);
        }
        let (result, expiry) = ratelimit::hit(self.env, rule, subject);
        if let Some(expiry) = expiry {
            self.expire(expiry);
        }
        match result {
            Ok(slot) => {
                self.headers
                    .retain(|(k, _)| !k.to_ascii_lowercase().starts_with("x-ratelimit-"));
                self.headers
                    .push(("X-RateLimit-Limit".into(), slot.info.limit.to_string()));
                self.headers.push((
                    "X-RateLimit-Remaining".into(),
                    slot.info.remaining.to_string(),
                ));
                self.headers
                    .push(("X-RateLimit-Reset".into(), slot.info.reset_secs.to_string()));
                Ok(Some(slot))
            }
            Err(e) => {
                if let ApiError::RateLimited(_) = e {
                    let user = (!subject.contains('.') && !subject.contains(':'))
                        .then(|| subject.to_string())
                        .filter(|s| util::is_uuid(s));
                    self.audit(
                        user.as_deref(),
                        "rate_limited",
                        false,
                        serde_json::json!({ "rule": rule.name }),
                    );
                }
                Err(e)
            }
        }
    }

    /// Has `expiry` filed in the expiry index after the response (see
    /// [`crate::plumbing::housekeeping`]): whatever this request created that
    /// expires is swept once it has.
    pub fn expire(&mut self, expiry: Expiry) {
        self.effects.push(Effect::Expire(expiry));
    }

    /// Records an audit event (written after the response; the webhook event
    /// it announces, if any, is derived from it then: [`crate::Service::complete`]).
    pub fn audit(&mut self, user_id: Option<&str>, action: &str, success: bool, details: Value) {
        let record = self.audit_record(user_id, action, success, details);
        self.effects.push(Effect::Audit(record, None));
    }

    /// [`Ctx::audit`] for `user`, a record this request has read: the
    /// webhook event goes to the webhooks it lists, without reading it again.
    pub fn audit_of(&mut self, user: &UserRecord, action: &str, success: bool, details: Value) {
        let record = self.audit_record(Some(&user.id), action, success, details);
        self.effects
            .push(Effect::Audit(record, Some(user.webhooks.clone())));
    }

    fn audit_record(
        &mut self,
        user_id: Option<&str>,
        action: &str,
        success: bool,
        details: Value,
    ) -> AuditRecord {
        AuditRecord {
            id: util::uuid_v4(self.env),
            user_id: user_id.map(str::to_string),
            action: action.to_string(),
            success,
            ip_address: self.ip.clone(),
            user_agent: self.ua.clone(),
            details,
            created_at: util::iso8601(self.env.now_ms),
        }
    }

    /// A line for the operator's log.
    pub fn log(&mut self, line: String) {
        self.effects.push(Effect::Log(line));
    }

    /// Adds a response header.
    pub fn header(&mut self, name: &str, value: String) {
        self.headers.push((name.to_string(), value));
    }
}
