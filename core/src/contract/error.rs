//! The one error type at the API boundary.
//!
//! Each variant maps to exactly one status and one message in
//! [`ApiError::status_and_message`], a single `match` with no catch-all arm.
//! What the client is told is fixed per variant; details for operators travel
//! separately as log effects and never reach the response.

use crate::contract::ports::StoreError;

/// Rate-limit figures for the `X-RateLimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateInfo {
    /// The limit of the window.
    pub limit: u32,
    /// Requests left in the window.
    pub remaining: u32,
    /// Unix time (seconds) at which the window resets.
    pub reset_secs: u64,
    /// Seconds until then (for `Retry-After`).
    pub retry_after_secs: u64,
}

/// Every way a request can fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 400 `Validation error: <detail>`; the detail names the field.
    Validation(String),
    /// 401 `Invalid email or password`.
    InvalidCredentials,
    /// 401 `Invalid or expired token`.
    InvalidToken,
    /// 401 `Invalid refresh token`.
    InvalidRefreshToken,
    /// 409 `Email already registered`.
    EmailTaken,
    /// 409 `Username already taken`.
    UsernameTaken,
    /// 400 `Invalid verification code`.
    InvalidCode,
    /// 400 `Invalid temp token`.
    InvalidTempToken,
    /// 400 `This backup code has already been used`.
    BackupCodeUsed,
    /// 400 `2FA setup not initiated`.
    SetupNotInitiated,
    /// 400 `No 2FA method available`.
    NoMethod,
    /// 400 `Cannot remove the last 2FA method while 2FA is enabled`.
    LastMethod,
    /// 400 `Invalid webhook signature`.
    InvalidSignature,
    /// 403 `Insufficient permissions. Required scope: <scope>`.
    InsufficientScope(&'static str),
    /// 403 `Invalid CSRF origin`.
    CsrfOrigin,
    /// 404 `Resource not found`.
    NotFound,
    /// 405 `Method not allowed`, with `Allow`.
    MethodNotAllowed(Vec<&'static str>),
    /// 413 `Request body too large`.
    BodyTooLarge,
    /// 429 `Too many requests. Please try again later.`
    RateLimited(RateInfo),
    /// 500 `Internal server error`.
    Internal,
    /// 503 `Service unavailable`.
    Unavailable,
    /// 503 `SMS service not configured`.
    SmsNotConfigured,
    /// 503 `Email service not configured`.
    EmailNotConfigured,
    /// 503 `Failed to send verification code` (the gateway refused or failed).
    DeliveryFailed,
    /// A passkey verification named a challenge that is unknown, expired,
    /// already used, or issued for another ceremony or user.
    PasskeyChallenge,
    /// The credential ID is registered already (by this or another user).
    PasskeyRegistered,
}

/// Messages other front-ends answer with when they mean the same thing (the
/// edge filter's 401 and 503).
pub mod messages {
    /// [`super::ApiError::InvalidToken`]'s message.
    pub const INVALID_TOKEN: &str = "Invalid or expired token";
    /// [`super::ApiError::Unavailable`]'s message.
    pub const UNAVAILABLE: &str = "Service unavailable";
}

impl ApiError {
    /// The status code and the exact message the client sees.
    pub fn status_and_message(&self) -> (u16, String) {
        match self {
            ApiError::Validation(detail) => (400, format!("Validation error: {detail}")),
            ApiError::InvalidCredentials => (401, "Invalid email or password".into()),
            ApiError::InvalidToken => (401, messages::INVALID_TOKEN.into()),
            ApiError::InvalidRefreshToken => (401, "Invalid refresh token".into()),
            ApiError::EmailTaken => (409, "Email already registered".into()),
            ApiError::UsernameTaken => (409, "Username already taken".into()),
            ApiError::InvalidCode => (400, "Invalid verification code".into()),
            ApiError::InvalidTempToken => (400, "Invalid temp token".into()),
            ApiError::BackupCodeUsed => (400, "This backup code has already been used".into()),
            ApiError::SetupNotInitiated => (400, "2FA setup not initiated".into()),
            ApiError::NoMethod => (400, "No 2FA method available".into()),
            ApiError::LastMethod => (
                400,
                "Cannot remove the last 2FA method while 2FA is enabled".into(),
            ),
            ApiError::InvalidSignature => (400, "Invalid webhook signature".into()),
            ApiError::InsufficientScope(scope) => (
                403,
                format!("Insufficient permissions. Required scope: {scope}"),
            ),
            ApiError::CsrfOrigin => (403, "Invalid CSRF origin".into()),
            ApiError::NotFound => (404, "Resource not found".into()),
            ApiError::MethodNotAllowed(_) => (405, "Method not allowed".into()),
            ApiError::BodyTooLarge => (413, "Request body too large".into()),
            ApiError::RateLimited(_) => (429, "Too many requests. Please try again later.".into()),
            ApiError::Internal => (500, "Internal server error".into()),
            ApiError::Unavailable => (503, messages::UNAVAILABLE.into()),
            ApiError::SmsNotConfigured => (503, "SMS service not configured".into()),
            ApiError::EmailNotConfigured => (503, "Email service not configured".into()),
            ApiError::DeliveryFailed => (503, "Failed to send verification code".into()),
            ApiError::PasskeyChallenge => (400, "Invalid or expired passkey challenge".into()),
            ApiError::PasskeyRegistered => (409, "Passkey already registered".into()),
        }
    }

    /// Shorthand for a validation error.
    pub fn validation(detail: impl Into<String>) -> Self {
        ApiError::Validation(detail.into())
    }
}

impl From<StoreError> for ApiError {
    fn from(_: StoreError) -> Self {
        ApiError::Unavailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_specified_ones() {
        let cases: &[(ApiError, u16, &str)] = &[
            (
                ApiError::InvalidCredentials,
                401,
                "Invalid email or password",
            ),
            (ApiError::InvalidToken, 401, "Invalid or expired token"),
            (ApiError::InvalidRefreshToken, 401, "Invalid refresh token"),
            (ApiError::EmailTaken, 409, "Email already registered"),
            (ApiError::UsernameTaken, 409, "Username already taken"),
            (ApiError::InvalidCode, 400, "Invalid verification code"),
            (ApiError::InvalidTempToken, 400, "Invalid temp token"),
            (
                ApiError::BackupCodeUsed,
                400,
                "This backup code has already been used",
            ),
            (ApiError::SetupNotInitiated, 400, "2FA setup not initiated"),
            (ApiError::NoMethod, 400, "No 2FA method available"),
            (ApiError::InvalidSignature, 400, "Invalid webhook signature"),
            (
                ApiError::InsufficientScope("2fa:write"),
                403,
                "Insufficient permissions. Required scope: 2fa:write",
            ),
            (ApiError::NotFound, 404, "Resource not found"),
            (ApiError::Internal, 500, "Internal server error"),
            (ApiError::Unavailable, 503, "Service unavailable"),
            (ApiError::BodyTooLarge, 413, "Request body too large"),
        ];
        for (e, status, msg) in cases {
            assert_eq!(e.status_and_message(), (*status, msg.to_string()), "{e:?}");
        }
        assert_eq!(
            ApiError::validation("email must be a valid e-mail address").status_and_message(),
            (
                400,
                "Validation error: email must be a valid e-mail address".into()
            )
        );
        assert_eq!(
            ApiError::from(StoreError("down".into())),
            ApiError::Unavailable
        );
    }
}
