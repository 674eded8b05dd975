//! SMS and e-mail codes: method setup and its verification, codes sent during
//! login (`send-code` / `resend`), and the login check.
//!
//! A code is 6 digits from the host's CSPRNG, kept only as a keyed hash in
//! the user record, valid 300 seconds, single use, with at most 5 wrong
//! tries. Sending is a [`Delivery`] that the host performs before the client
//! is answered; when it fails the code is withdrawn and the rate-limit slot
//! given back.

use serde_json::{json, Value};

use crate::api::mfa;
use crate::api::sessions::{self, Access};
use crate::api::users;
use crate::contract::config::Config;
use crate::contract::error::ApiError;
use crate::contract::http::Response;
use crate::contract::outbox::{Delivery, DeliveryError, EmailMessage, HttpCall};
use crate::crypto::codes;
use crate::plumbing::context::{Ctx, Outcome, Resume};
use crate::plumbing::ratelimit::{self, Slot};
use crate::plumbing::records::{self, MethodRecord, OtpCode, Purpose, UserRecord};
use crate::plumbing::web;

/// Code lifetime.
pub const CODE_TTL_SECS: u64 = 300;
/// Wrong tries allowed per code.
pub const MAX_ATTEMPTS: u32 = 5;

/// SMS or e-mail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// SMS through Twilio.
    Sms,
    /// E-mail through SMTP.
    Email,
}

impl Channel {
    /// `sms` or `email`.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Email => "email",
        }
    }

    fn parse(s: &str) -> Option<Channel> {
        match s {
            "sms" => Some(Channel::Sms),
            "email" => Some(Channel::Email),
            _ => None,
        }
    }

    fn ensure_configured(self, config: &Config) -> Result<(), ApiError> {
        match self {
            Channel::Sms if config.twilio.is_none() => Err(ApiError::SmsNotConfigured),
            Channel::Email if config.email.is_none() => Err(ApiError::EmailNotConfigured),
            _ => Ok(()),
        }
    }

    fn mask(self, target: &str) -> String {
        match self {
            Channel::Sms => web::mask_phone(target),
            Channel::Email => web::mask_email(target),
        }
    }

    fn field(self) -> &'static str {
        match self {
            Channel::Sms => "phoneNumber",
            Channel::Email => "email",
        }
    }
}

/// What to do once the host has tried a delivery.
#[derive(Debug)]
pub struct PendingSend {
    user_id: String,
    channel: Channel,
    purpose: Purpose,
    slot: Option<Slot>,
    success: Response,
    /// The hash of the code being sent (what a failure takes back).
    hash: String,
    /// The code it replaced, restored if the delivery fails: a failed
    /// resend must not cost the user the code they already have.
    previous: Option<OtpCode>,
}

/// An E.164 phone number (`+` and 8–15 digits) with spaces, dots, dashes and
/// parentheses removed.
pub fn normalize_phone(input: &str) -> Result<String, ApiError> {
    let cleaned: String = input
        .trim()
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')'))
        .collect();
    let digits = cleaned.strip_prefix('+').unwrap_or("");
    let ok = (8..=15).contains(&digits.len())
        && digits.chars().all(|c| c.is_ascii_digit())
        && !digits.starts_with('0');
    if ok {
        Ok(cleaned)
    } else {
        Err(ApiError::validation(
            "phoneNumber must be in international format, e.g. +15551234567",
        ))
    }
}

fn form_encode(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The Twilio Messages API request that sends `body` to `to`.
pub fn twilio_call(config: &Config, to: &str, body: &str) -> Option<HttpCall> {
    use base64::Engine;
    let t = config.twilio.as_ref()?;
    let form = form_encode(&[("To", to), ("From", &t.from), ("Body", body)]);
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", t.account_sid, t.auth_token));
    Some(HttpCall {
        method: "POST".into(),
        url: format!(
            "{}/2010-04-01/Accounts/{}/Messages.json",
            t.api_base, t.account_sid
        ),
        headers: vec![
            ("Authorization".into(), format!("Basic {auth}")),
            (
                "Content-Type".into(),
                "application/x-www-form-urlencoded".into(),
            ),
            ("Content-Length".into(), form.len().to_string()),
            ("Accept".into(), "application/json".into()),
        ],
        body: form.into_bytes(),
    })
}

fn delivery(config: &Config, channel: Channel, target: &str, code: &str) -> Option<Delivery> {
    let text = format!(
        "Your {} verification code is {code}. It expires in 5 minutes.",
        config.totp_issuer
    );
    match channel {
        Channel::Sms => twilio_call(config, target, &text).map(Delivery::Sms),
        Channel::Email => {
            let e = config.email.as_ref()?;
            Some(Delivery::Email(EmailMessage {
                host: e.host.clone(),
                port: e.port,
                tls: e.tls.clone(),
                auth: e.auth.clone(),
                from: e.from.clone(),
                to: target.to_string(),
                subject: format!("Your {} verification code", config.totp_issuer)
                    .replace(['\r', '\n'], " "),
                html: format!(
                    "<p>Your verification code is <strong>{code}</strong>.</p><p>It expires in 5 minutes.</p>"
                ),
                text,
            }))
        }
    }
}

fn code_hash(
    ctx: &mut Ctx,
    user_id: &str,
    channel: Channel,
    code: &str,
) -> Result<String, ApiError> {
    Ok(codes::keyed_hash(
        &ctx.keys()?.otp(),
        user_id,
        &format!("{}:{code}", channel.name()),
    ))
}

/// Stores a new code for (`channel`, `purpose`) and asks for its delivery.
fn send(
    ctx: &mut Ctx,
    user_id: &str,
    channel: Channel,
    purpose: Purpose,
    target: &str,
    slot: Option<Slot>,
    success: Value,
) -> Result<Outcome, ApiError> {
    let code = codes::otp_code(ctx.env.rng);
    let hash = code_hash(ctx, user_id, channel, &code)?;
    let now = ctx.now_ms();
    let entry = OtpCode {
        method: channel.name().into(),
        purpose,
        target: target.to_string(),
        hash,
        exp_ms: now
            .checked_add(CODE_TTL_SECS * 1000)
            .ok_or(ApiError::Internal)?,
        attempts: 0,
    };
    let previous = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            let previous = u
                .codes
                .iter()
                .find(|c| c.method == channel.name() && c.purpose == purpose)
                .cloned();
            u.codes
                .retain(|c| !(c.method == channel.name() && c.purpose == purpose));
            u.codes.push(entry.clone());
            Ok(previous)
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    let d = delivery(ctx.config, channel, target, &code).ok_or(match channel {
        Channel::Sms => ApiError::SmsNotConfigured,
        Channel::Email => ApiError::EmailNotConfigured,
    })?;
    Ok(Outcome::Deliver(
        d,
        Box::new(PendingSend {
            user_id: user_id.to_string(),
            channel,
            purpose,
            slot,
            success: web::ok(200, success),
            hash: entry.hash,
            previous,
        }),
    ))
}

impl Resume for PendingSend {
    /// Completes a send after the host's delivery attempt.
    fn finish(
        self: Box<Self>,
        ctx: &mut Ctx,
        result: Result<(), DeliveryError>,
    ) -> Result<Outcome, ApiError> {
        finish_send(ctx, *self, result)
    }
}

fn finish_send(
    ctx: &mut Ctx,
    p: PendingSend,
    result: Result<(), DeliveryError>,
) -> Result<Outcome, ApiError> {
    let details = json!({ "method": p.channel.name(), "purpose": match p.purpose { Purpose::Setup => "setup", Purpose::Login => "login" } });
    match result {
        Ok(()) => {
            ctx.audit(Some(&p.user_id), "code_sent", true, details);
            Ok(Outcome::Done(p.success))
        }
        Err(DeliveryError(reason)) => {
            let reason: String = reason
                .chars()
                .filter(|c| !c.is_control())
                .take(300)
                .collect();
            ctx.log(format!(
                "{} delivery failed for user {}: {reason}",
                p.channel.name(),
                p.user_id
            ));
            // Take back the code that was not delivered; put back the one
            // it replaced (unless yet another code has come since).
            let now = ctx.now_ms();
            records::update(
                ctx.env,
                &records::user_key(&p.user_id),
                |u: &mut UserRecord| {
                    let before = u.codes.len();
                    u.codes.retain(|c| c.hash != p.hash);
                    let ours_was_current = u.codes.len() < before;
                    if let Some(prev) = &p.previous {
                        if ours_was_current && prev.exp_ms > now {
                            u.codes.push(prev.clone());
                        }
                    }
                    Ok(())
                },
            )?;
            if let Some(slot) = &p.slot {
                ratelimit::refund(ctx.env, slot)?;
            }
            ctx.audit(Some(&p.user_id), "code_sent", false, details);
            Err(ApiError::DeliveryFailed)
        }
    }
}

/// `POST /2fa/sms/setup` and `POST /2fa/email/setup`.
pub fn setup(ctx: &mut Ctx, channel: Channel) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::SETUP, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let raw = web::req_str(&body, channel.field())?;
    channel.ensure_configured(ctx.config)?;
    let target = match channel {
        Channel::Sms => normalize_phone(&raw)?,
        Channel::Email => users::normalize_email(&raw, "email")?,
    };
    ctx.audit(
        Some(&auth.user.id),
        "2fa_setup_started",
        true,
        json!({ "method": channel.name() }),
    );
    let masked = channel.mask(&target);
    let success = json!({
        channel.field(): masked,
        "codeSent": true,
        "message": format!("Verification code sent to {masked}"),
    });
    send(
        ctx,
        &auth.user.id,
        channel,
        Purpose::Setup,
        &target,
        None,
        success,
    )
}

enum Check {
    Matched(OtpCode),
    Wrong,
    Missing,
}

/// Tries `code` against the outstanding codes of `user_id` for `purpose`
/// (and `only` that channel, when given). A match is removed (single use)
/// when `spend`, else left for the caller to spend with [`spend_login_code`];
/// a miss counts one try against each code tried, and a code out of tries
/// is removed.
fn check(
    ctx: &mut Ctx,
    user_id: &str,
    purpose: Purpose,
    only: Option<Channel>,
    code: &str,
    spend: bool,
) -> Result<Check, ApiError> {
    let hashes = [Channel::Sms, Channel::Email]
        .into_iter()
        .map(|c| Ok((c.name(), code_hash(ctx, user_id, c, code)?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let now = ctx.now_ms();
    let out = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            let mut matched = None;
            let mut tried = false;
            for (i, c) in u.codes.iter_mut().enumerate() {
                if c.purpose != purpose || only.is_some_and(|o| o.name() != c.method) {
                    continue;
                }
                tried = true;
                let expected = hashes
                    .iter()
                    .find(|(m, _)| *m == c.method)
                    .map(|(_, h)| h.as_str());
                let ok = expected.is_some_and(|h| codes::ct_eq(h.as_bytes(), c.hash.as_bytes()));
                if ok && c.attempts < MAX_ATTEMPTS && matched.is_none() {
                    matched = Some(i);
                } else {
                    c.attempts = c.attempts.saturating_add(1);
                }
            }
            if let Some(i) = matched {
                let c = if spend {
                    u.codes.remove(i)
                } else {
                    u.codes[i].clone()
                };
                return Ok(Check::Matched(c));
            }
            u.codes.retain(|c| c.attempts < MAX_ATTEMPTS);
            Ok(if tried { Check::Wrong } else { Check::Missing })
        },
    )?;
    Ok(out.unwrap_or(Check::Missing))
}

/// `POST /2fa/sms/verify-setup` and `POST /2fa/email/verify-setup`.
pub fn verify_setup(ctx: &mut Ctx, channel: Channel) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::VERIFY_SETUP, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let code = codes::normalize_otp_code(&web::req_str(&body, "code")?)
        .ok_or_else(|| ApiError::validation("code must be 6 digits"))?;
    let matched = match check(
        ctx,
        &auth.user.id,
        Purpose::Setup,
        Some(channel),
        &code,
        true,
    )? {
        Check::Matched(c) => c,
        Check::Wrong => {
            ctx.audit(
                Some(&auth.user.id),
                "2fa_failed",
                false,
                json!({ "method": channel.name(), "stage": "setup" }),
            );
            return Err(ApiError::InvalidCode);
        }
        Check::Missing => return Err(ApiError::SetupNotInitiated),
    };
    let now = ctx.now_ms();
    let id = ctx.uuid();
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.methods.retain(|m| m.kind != channel.name());
            u.methods.push(MethodRecord {
                id: id.clone(),
                kind: channel.name().into(),
                enabled: true,
                secret: None,
                phone: (channel == Channel::Sms).then(|| matched.target.clone()),
                email: (channel == Channel::Email).then(|| matched.target.clone()),
                verified_ms: now,
                created_ms: now,
            });
            u.refresh_two_factor();
            u.updated_ms = now;
            Ok(())
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&auth.user.id),
        "2fa_enabled",
        true,
        json!({ "method": channel.name() }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "enabled": true, "method": channel.name(), channel.field(): channel.mask(&matched.target) }),
    )))
}

/// `POST /2fa/send-code` and `POST /2fa/resend`.
pub fn send_code(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "tempToken")?;
    let method = web::req_str(&body, "method")?;
    let channel = Channel::parse(&method)
        .ok_or_else(|| ApiError::validation("method must be sms or email"))?;
    let claims = mfa::temp_claims(ctx, &token)?;
    let user: UserRecord = records::load(ctx.env.store, &records::user_key(&claims.sub))?
        .ok_or(ApiError::InvalidTempToken)?;
    let target = match user.method(channel.name()) {
        Some(m) => match channel {
            Channel::Sms => m.phone.clone(),
            Channel::Email => m.email.clone(),
        }
        .ok_or(ApiError::Internal)?,
        None => return Err(ApiError::NoMethod),
    };
    channel.ensure_configured(ctx.config)?;
    let rule = match channel {
        Channel::Sms => ratelimit::SEND_SMS,
        Channel::Email => ratelimit::SEND_EMAIL,
    };
    let slot = ctx.limit(rule, &user.id)?;
    let success = json!({ "codeSent": true, "method": channel.name(), "expiresIn": CODE_TTL_SECS });
    send(
        ctx,
        &user.id,
        channel,
        Purpose::Login,
        &target,
        slot,
        success,
    )
}

/// The login check: the outstanding SMS / e-mail login code of `user_id`
/// (restricted to `only` when given) that `code` matches, if any. The code
/// is not spent here: [`spend_login_code`] removes it inside the
/// locked update that links the new session (see [`crate::api::mfa`]). A miss
/// counts against the codes tried, as in every check.
pub fn login_match(
    ctx: &mut Ctx,
    user_id: &str,
    only: Option<Channel>,
    code: &str,
) -> Result<Option<OtpCode>, ApiError> {
    Ok(
        match check(ctx, user_id, Purpose::Login, only, code, false)? {
            Check::Matched(c) => Some(c),
            _ => None,
        },
    )
}

/// Removes login code `code` (found by [`login_match`]) from `u`, inside a
/// locked update; `InvalidCode` when it is gone meanwhile (spent by
/// another request, expired, out of tries).
pub fn spend_login_code(u: &mut UserRecord, code: &OtpCode, now_ms: u64) -> Result<(), ApiError> {
    let i = u
        .codes
        .iter()
        .position(|c| {
            c.purpose == Purpose::Login
                && c.method == code.method
                && c.exp_ms > now_ms
                && c.attempts < MAX_ATTEMPTS
                && codes::ct_eq(c.hash.as_bytes(), code.hash.as_bytes())
        })
        .ok_or(ApiError::InvalidCode)?;
    u.codes.remove(i);
    Ok(())
}

/// Parses an optional `method` narrowing of `/2fa/verify`.
pub fn parse_method(m: Option<String>) -> Result<Option<&'static str>, ApiError> {
    match m.as_deref() {
        None => Ok(None),
        Some("totp") => Ok(Some("totp")),
        Some(s) => Channel::parse(s)
            .map(|c| Some(c.name()))
            .ok_or_else(|| ApiError::validation("method must be totp, sms or email")),
    }
}

/// The channel for a method name.
pub fn channel_of(name: &str) -> Option<Channel> {
    Channel::parse(name)
}
