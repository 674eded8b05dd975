//! Settings, read by the specification's names from a name → value map.
//!
//! Parsing is a pure function: the host collects the values (environment,
//! Spin variables) and calls [`Config::from_map`]. Production checks on the
//! secrets happen here; secrets that are missing outside production are
//! generated once and kept in the store (see [`crate::plumbing::secrets`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::contract::outbox::SmtpTls;
use crate::crypto::password::Argon2Params;

/// Every setting name the service reads, in the specification's spelling.
/// Spin variables use the same names in lower case.
pub const SETTING_NAMES: &[&str] = &[
    "JWT_ACCESS_SECRET",
    "JWT_REFRESH_SECRET",
    "TEMP_TOKEN_SECRET",
    "DEVICE_TOKEN_SECRET",
    "PORT",
    "CORS_ORIGINS",
    "API_BASE_PATH",
    "NODE_ENV",
    "TWILIO_ACCOUNT_SID",
    "TWILIO_AUTH_TOKEN",
    "TWILIO_PHONE_NUMBER",
    "TWILIO_API_BASE",
    "EMAIL_SERVICE",
    "EMAIL_HOST",
    "EMAIL_PORT",
    "EMAIL_USER",
    "EMAIL_PASSWORD",
    "EMAIL_FROM",
    "EMAIL_TLS_CA_PEM",
    "TOTP_ISSUER",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
    "TRUST_PROXY",
    "RATE_LIMIT_ENABLED",
    "ARGON2_MEMORY_KIB",
    "ARGON2_ITERATIONS",
    "ARGON2_PARALLELISM",
    "WEBHOOK_ALLOW_PRIVATE",
    "LOG_LEVEL",
    "WEBAUTHN_RP_ID",
    "WEBAUTHN_RP_NAME",
    "WEBAUTHN_ORIGINS",
];

/// The four signing secrets, by setting name.
pub const SECRET_NAMES: [&str; 4] = [
    "JWT_ACCESS_SECRET",
    "JWT_REFRESH_SECRET",
    "TEMP_TOKEN_SECRET",
    "DEVICE_TOKEN_SECRET",
];

/// Shortest secret accepted in production.
pub const MIN_SECRET_LEN: usize = 32;

/// A setting that cannot be used; the message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "configuration error: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Twilio's Messages API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwilioConfig {
    /// Account SID (also the Basic-auth user).
    pub account_sid: String,
    /// Auth token (Basic-auth password).
    pub auth_token: String,
    /// Sender number.
    pub from: String,
    /// API base URL, default `https://api.twilio.com`.
    pub api_base: String,
}

/// The SMTP server that e-mail codes go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailConfig {
    /// Host name.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Implicit TLS on 465, else STARTTLS when offered.
    pub tls: SmtpTls,
    /// `AUTH` credentials when `EMAIL_USER` is set.
    pub auth: Option<(String, String)>,
    /// Sender address.
    pub from: String,
    /// `EMAIL_TLS_CA_PEM`: PEM certificates trusted for the SMTP server's TLS
    /// in addition to the public roots (a private CA, or a test server's).
    /// Literal `\n` sequences in the setting stand for line breaks, for
    /// platforms whose variables cannot hold several lines.
    pub extra_ca_pem: Option<String>,
}

/// Parsed settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Signing secrets as given (None when missing; generated later outside
    /// production).
    pub secrets: [Option<String>; 4],
    /// Listening port (for hosts).
    pub port: u16,
    /// Allowed CORS origins, exact strings.
    pub cors_origins: Vec<String>,
    /// API path prefix without a trailing slash (`/api`; empty for root).
    pub base_path: String,
    /// `NODE_ENV=production`.
    pub production: bool,
    /// SMS gateway, when configured.
    pub twilio: Option<TwilioConfig>,
    /// SMTP server, when configured.
    pub email: Option<EmailConfig>,
    /// Issuer shown in authenticator apps.
    pub totp_issuer: String,
    /// `iss` of our tokens.
    pub jwt_issuer: String,
    /// `aud` of our tokens.
    pub jwt_audience: String,
    /// Honour `X-Forwarded-For`.
    pub trust_proxy: bool,
    /// Rate limits on (default).
    pub rate_limit_enabled: bool,
    /// Argon2id parameters for new hashes.
    pub argon2: Argon2Params,
    /// Allow webhook URLs that point at private addresses.
    pub webhook_allow_private: bool,
    /// Log level name (`info` by default).
    pub log_level: String,
    /// WebAuthn relying-party ID: the domain passkeys are scoped to
    /// (`localhost` by default outside production).
    pub webauthn_rp_id: String,
    /// WebAuthn relying-party name shown by authenticators (the TOTP issuer
    /// by default).
    pub webauthn_rp_name: String,
    /// Exact origins WebAuthn ceremonies may come from
    /// (`http://localhost:3001` by default outside production); each is the
    /// RP ID or one of its subdomains.
    pub webauthn_origins: Vec<String>,
    /// Warnings for the host to log at start (never secrets).
    pub warnings: Vec<String>,
}

/// Well-known SMTP providers for `EMAIL_SERVICE`: name → (host, port).
pub const EMAIL_SERVICES: &[(&str, &str, u16)] = &[
    ("gmail", "smtp.gmail.com", 465),
    ("outlook", "smtp-mail.outlook.com", 587),
    ("hotmail", "smtp-mail.outlook.com", 587),
    ("office365", "smtp.office365.com", 587),
    ("yahoo", "smtp.mail.yahoo.com", 465),
    ("icloud", "smtp.mail.me.com", 587),
    ("zoho", "smtp.zoho.com", 465),
    ("fastmail", "smtp.fastmail.com", 465),
    ("sendgrid", "smtp.sendgrid.net", 587),
    ("mailgun", "smtp.mailgun.org", 587),
    ("postmark", "smtp.postmarkapp.com", 587),
    ("ses", "email-smtp.us-east-1.amazonaws.com", 465),
];

/// How many settings there are: the slots of a [`Settings`].
const SETTING_COUNT: usize = SETTING_NAMES.len();

/// Setting values, one slot per entry of [`SETTING_NAMES`]: what a host
/// collects and [`Config::from_settings`] parses.
///
/// A lookup while parsing is an index fixed at compile time, not a string
/// comparison: the Spin component parses its settings on every request
/// (a fresh instance each time), and the name-keyed map this replaces cost
/// it 12,700 more instructions per request, in string compares and the
/// map's allocations (docs/decisions.md, "The component's per-request work, counted in
/// instructions"). Deliberately not `Debug`: it holds the secrets.
#[derive(Clone)]
pub struct Settings {
    values: [Option<String>; SETTING_COUNT],
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            values: std::array::from_fn(|_| None),
        }
    }
}

impl Settings {
    /// No setting set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The slot of `name` (the specification's spelling) in
    /// [`SETTING_NAMES`], if it names a setting. A `const fn`, so that
    /// the `slot!` macro below resolves a name at compile time.
    pub const fn slot(name: &str) -> Option<usize> {
        let b = name.as_bytes();
        let mut i = 0;
        while i < SETTING_COUNT {
            let n = SETTING_NAMES[i].as_bytes();
            if n.len() == b.len() {
                let mut j = 0;
                while j < n.len() && n[j] == b[j] {
                    j += 1;
                }
                if j == n.len() {
                    return Some(i);
                }
            }
            i += 1;
        }
        None
    }

    /// The slot of `name`, for use in constants: a name that is not in
    /// [`SETTING_NAMES`] stops the build (or panics, at run time).
    const fn slot_of(name: &str) -> usize {
        match Self::slot(name) {
            Some(slot) => slot,
            None => panic!("not a setting name"),
        }
    }

    /// Sets the setting in `slot` (an index into [`SETTING_NAMES`], as
    /// [`Settings::slot`] gives it). A slot out of range is ignored.
    pub fn set_slot(&mut self, slot: usize, value: String) {
        if let Some(v) = self.values.get_mut(slot) {
            *v = Some(value);
        }
    }

    /// Sets setting `name`; `false` (and nothing kept) when `name` is not
    /// a setting.
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> bool {
        match Self::slot(name) {
            Some(slot) => {
                self.values[slot] = Some(value.into());
                true
            }
            None => false,
        }
    }

    /// The value of setting `name` as it was set (blank values included);
    /// `None` when unset or not a setting.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.get_slot(Self::slot(name)?)
    }

    /// [`Settings::get`] by slot; `None` also for a slot out of range.
    pub fn get_slot(&self, slot: usize) -> Option<&str> {
        self.values.get(slot)?.as_deref()
    }

    /// Whether setting `name` has a value (blank or not).
    pub fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The settings of a name → value map; keys that name no setting are
    /// ignored.
    pub fn from_map(vars: &BTreeMap<String, String>) -> Settings {
        let mut settings = Settings::new();
        for (name, value) in vars {
            settings.set(name, value.as_str());
        }
        settings
    }

    /// The trimmed value in `slot`; blank counts as unset.
    fn value(&self, slot: usize) -> Option<&str> {
        self.values[slot]
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }
}

/// The slot of a setting name, resolved at compile time.
macro_rules! slot {
    ($name:literal) => {
        const { Settings::slot_of($name) }
    };
}

/// The slots of [`SECRET_NAMES`], in their order.
const SECRET_SLOTS: [usize; 4] = {
    let mut slots = [0; 4];
    let mut i = 0;
    while i < 4 {
        slots[i] = Settings::slot_of(SECRET_NAMES[i]);
        i += 1;
    }
    slots
};

fn get(vars: &Settings, slot: usize) -> Option<&str> {
    vars.value(slot)
}

fn parse_bool(vars: &Settings, slot: usize, default: bool) -> Result<bool, ConfigError> {
    match get(vars, slot) {
        None => Ok(default),
        Some(v) => {
            if ["true", "1", "yes", "on"]
                .iter()
                .any(|t| v.eq_ignore_ascii_case(t))
            {
                Ok(true)
            } else if ["false", "0", "no", "off"]
                .iter()
                .any(|f| v.eq_ignore_ascii_case(f))
            {
                Ok(false)
            } else {
                Err(ConfigError(format!(
                    "{} must be true or false",
                    SETTING_NAMES[slot]
                )))
            }
        }
    }
}

fn parse_num<T: std::str::FromStr>(
    vars: &Settings,
    slot: usize,
    default: T,
) -> Result<T, ConfigError> {
    match get(vars, slot) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| {
            ConfigError(format!(
                "{} must be a whole number in range",
                SETTING_NAMES[slot]
            ))
        }),
    }
}

impl Config {
    /// Parses settings from `vars` (keys are the specification's names;
    /// others are ignored): [`Config::from_settings`] of
    /// [`Settings::from_map`].
    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        Self::from_settings(&Settings::from_map(vars))
    }

    /// Parses `vars`. Blank values count as unset. In production, refuses
    /// missing, short (< 32 characters) or repeated secrets.
    pub fn from_settings(vars: &Settings) -> Result<Config, ConfigError> {
        // Any spelling of "production" selects the strict mode: a typo in case
        // must not quietly start a production deployment with generated secrets.
        let production =
            get(vars, slot!("NODE_ENV")).is_some_and(|v| v.eq_ignore_ascii_case("production"));
        let mut warnings = Vec::new();
        let secrets = SECRET_SLOTS.map(|slot| get(vars, slot).map(str::to_string));
        for (i, name) in SECRET_NAMES.iter().enumerate() {
            match &secrets[i] {
                None if production => {
                    return Err(ConfigError(format!("{name} is required in production")))
                }
                None => warnings.push(format!(
                    "{name} is not set: a random secret is generated and kept in the store (development only)"
                )),
                Some(s) if s.chars().count() < MIN_SECRET_LEN => {
                    let msg = format!("{name} must be at least {MIN_SECRET_LEN} characters");
                    if production {
                        return Err(ConfigError(msg));
                    }
                    warnings.push(msg);
                }
                Some(_) => {}
            }
            for (j, other) in SECRET_NAMES.iter().enumerate().take(i) {
                if secrets[i].is_some() && secrets[i] == secrets[j] {
                    let msg = format!("{name} must differ from {other}");
                    if production {
                        return Err(ConfigError(msg));
                    }
                    warnings.push(msg);
                }
            }
        }

        let base_path = match get(vars, slot!("API_BASE_PATH")) {
            None => "/api".to_string(),
            Some(p) => {
                let p = p.trim_end_matches('/');
                if p.is_empty() {
                    String::new()
                } else if !p.starts_with('/')
                    || p.contains("//")
                    || p.contains('?')
                    || p.contains(' ')
                {
                    return Err(ConfigError(
                        "API_BASE_PATH must be a path such as /api".to_string(),
                    ));
                } else {
                    p.to_string()
                }
            }
        };

        let cors_origins = get(vars, slot!("CORS_ORIGINS"))
            .map(|v| {
                v.split(',')
                    .map(|o| o.trim().trim_end_matches('/').to_string())
                    .filter(|o| !o.is_empty())
                    .collect()
            })
            .unwrap_or_default();

        let twilio = match (
            get(vars, slot!("TWILIO_ACCOUNT_SID")),
            get(vars, slot!("TWILIO_AUTH_TOKEN")),
            get(vars, slot!("TWILIO_PHONE_NUMBER")),
        ) {
            (Some(sid), Some(token), Some(from)) => Some(TwilioConfig {
                account_sid: sid.to_string(),
                auth_token: token.to_string(),
                from: from.to_string(),
                api_base: get(vars, slot!("TWILIO_API_BASE"))
                    .unwrap_or("https://api.twilio.com")
                    .trim_end_matches('/')
                    .to_string(),
            }),
            (None, None, None) => None,
            _ => {
                return Err(ConfigError(
                    "TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_PHONE_NUMBER must be set together"
                        .to_string(),
                ))
            }
        };

        let email = Self::email_from(vars)?;

        let argon2 = Argon2Params {
            memory_kib: parse_num(
                vars,
                slot!("ARGON2_MEMORY_KIB"),
                Argon2Params::default().memory_kib,
            )?,
            iterations: parse_num(
                vars,
                slot!("ARGON2_ITERATIONS"),
                Argon2Params::default().iterations,
            )?,
            parallelism: parse_num(
                vars,
                slot!("ARGON2_PARALLELISM"),
                Argon2Params::default().parallelism,
            )?,
        };
        if argon2.memory_kib < 8 * argon2.parallelism.max(1)
            || argon2.iterations == 0
            || argon2.parallelism == 0
            || argon2.parallelism > 16
            || argon2.memory_kib > 4 * 1024 * 1024
        {
            return Err(ConfigError(
                "ARGON2_MEMORY_KIB / ARGON2_ITERATIONS / ARGON2_PARALLELISM are out of range"
                    .to_string(),
            ));
        }
        if production && argon2.memory_kib < Argon2Params::default().memory_kib {
            warnings.push("ARGON2_MEMORY_KIB is below the OWASP minimum of 19456".to_string());
        }

        let (webauthn_rp_id, webauthn_origins) =
            Self::webauthn_from(vars, production, &mut warnings)?;
        let totp_issuer = get(vars, slot!("TOTP_ISSUER"))
            .unwrap_or("TwoFactorAuth")
            .to_string();

        Ok(Config {
            secrets,
            port: parse_num(vars, slot!("PORT"), 3001u16)?,
            cors_origins,
            base_path,
            production,
            twilio,
            email,
            webauthn_rp_name: get(vars, slot!("WEBAUTHN_RP_NAME"))
                .map(str::to_string)
                .unwrap_or_else(|| totp_issuer.clone()),
            totp_issuer,
            webauthn_rp_id,
            webauthn_origins,
            jwt_issuer: get(vars, slot!("JWT_ISSUER"))
                .unwrap_or("two-factor-auth")
                .to_string(),
            jwt_audience: get(vars, slot!("JWT_AUDIENCE"))
                .unwrap_or("two-factor-auth-api")
                .to_string(),
            trust_proxy: parse_bool(vars, slot!("TRUST_PROXY"), false)?,
            rate_limit_enabled: parse_bool(vars, slot!("RATE_LIMIT_ENABLED"), true)?,
            argon2,
            webhook_allow_private: parse_bool(vars, slot!("WEBHOOK_ALLOW_PRIVATE"), false)?,
            log_level: get(vars, slot!("LOG_LEVEL"))
                .unwrap_or("info")
                .to_ascii_lowercase(),
            warnings,
        })
    }

    /// `WEBAUTHN_RP_ID` and `WEBAUTHN_ORIGINS`: both required in
    /// production; the RP ID a lower-case host name, each origin
    /// `http(s)://host[:port]` on the RP ID or a subdomain of it.
    fn webauthn_from(
        vars: &Settings,
        production: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(String, Vec<String>), ConfigError> {
        let rp_id = match get(vars, slot!("WEBAUTHN_RP_ID")) {
            None if production => {
                return Err(ConfigError(
                    "WEBAUTHN_RP_ID is required in production".to_string(),
                ))
            }
            None => "localhost".to_string(),
            Some(v) => v.to_ascii_lowercase(),
        };
        let host_ok = |h: &str| {
            !h.is_empty()
                && h.len() <= 253
                && h.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
        };
        if !host_ok(&rp_id) {
            return Err(ConfigError(
                "WEBAUTHN_RP_ID must be a domain name such as example.com (no scheme, port or path)"
                    .to_string(),
            ));
        }
        let origins: Vec<String> = match get(vars, slot!("WEBAUTHN_ORIGINS")) {
            None if production => {
                return Err(ConfigError(
                    "WEBAUTHN_ORIGINS is required in production".to_string(),
                ))
            }
            None => vec!["http://localhost:3001".to_string()],
            Some(v) => v
                .split(',')
                .map(|o| o.trim().trim_end_matches('/').to_string())
                .filter(|o| !o.is_empty())
                .collect(),
        };
        if origins.is_empty() {
            return Err(ConfigError(
                "WEBAUTHN_ORIGINS must name at least one origin".to_string(),
            ));
        }
        for origin in &origins {
            let rest = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            let host = rest.map(|r| match r.rsplit_once(':') {
                Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                    h
                }
                _ => r,
            });
            let on_rp = host.is_some_and(|h| {
                host_ok(h)
                    && (h == rp_id
                        || h.strip_suffix(rp_id.as_str())
                            .is_some_and(|p| p.ends_with('.')))
            });
            if !on_rp {
                return Err(ConfigError(format!(
                    "WEBAUTHN_ORIGINS: {origin:?} must be http(s)://host[:port] with the host {rp_id} or a subdomain of it"
                )));
            }
            if production && origin.starts_with("http://") && rp_id != "localhost" {
                warnings.push(format!(
                    "WEBAUTHN_ORIGINS: {origin} is not https; browsers refuse WebAuthn there"
                ));
            }
        }
        Ok((rp_id, origins))
    }

    fn email_from(vars: &Settings) -> Result<Option<EmailConfig>, ConfigError> {
        let preset = match get(vars, slot!("EMAIL_SERVICE")) {
            None => None,
            Some(name) => {
                let lower = name.to_ascii_lowercase();
                match EMAIL_SERVICES.iter().find(|(n, _, _)| *n == lower) {
                    Some((_, host, port)) => Some((host.to_string(), *port)),
                    None => {
                        return Err(ConfigError(format!(
                            "EMAIL_SERVICE {name:?} is not a known provider; set EMAIL_HOST and EMAIL_PORT instead"
                        )))
                    }
                }
            }
        };
        let host = get(vars, slot!("EMAIL_HOST"))
            .map(str::to_string)
            .or_else(|| preset.as_ref().map(|p| p.0.clone()));
        let Some(host) = host else {
            return Ok(None);
        };
        let default_port = preset.as_ref().map(|p| p.1).unwrap_or(587);
        let port: u16 = parse_num(vars, slot!("EMAIL_PORT"), default_port)?;
        let auth = match (
            get(vars, slot!("EMAIL_USER")),
            get(vars, slot!("EMAIL_PASSWORD")),
        ) {
            (Some(u), p) => Some((u.to_string(), p.unwrap_or("").to_string())),
            (None, _) => None,
        };
        let from = get(vars, slot!("EMAIL_FROM"))
            .map(str::to_string)
            .or_else(|| auth.as_ref().map(|a| a.0.clone()))
            .ok_or_else(|| {
                ConfigError("EMAIL_FROM is required when EMAIL_HOST is set".to_string())
            })?;
        if from.contains(['\r', '\n']) {
            return Err(ConfigError("EMAIL_FROM must be one line".to_string()));
        }
        let extra_ca_pem = get(vars, slot!("EMAIL_TLS_CA_PEM")).map(|pem| pem.replace("\\n", "\n"));
        if extra_ca_pem
            .as_ref()
            .is_some_and(|pem| !pem.contains("-----BEGIN CERTIFICATE-----"))
        {
            return Err(ConfigError(
                "EMAIL_TLS_CA_PEM must hold PEM certificates (-----BEGIN CERTIFICATE-----)"
                    .to_string(),
            ));
        }
        Ok(Some(EmailConfig {
            host,
            port,
            tls: if port == 465 {
                SmtpTls::Implicit
            } else {
                SmtpTls::StartTlsIfOffered
            },
            auth,
            from,
            extra_ca_pem,
        }))
    }

    /// A name → value map from an iterator of pairs (convenience for hosts
    /// and tests). Later pairs win.
    pub fn map_of<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> BTreeMap<String, String> {
        pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect()
    }
}
