//! Passkeys without the `webauthn` feature (builds that link the API but do
//! not serve it, such as the edge filter, which only reads tokens): the
//! routes exist and answer 404, and nothing stored is touched.

use crate::contract::error::ApiError;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::records::WebauthnCredential;

/// Not served in this build.
pub fn register_options(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn register_verify(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn list(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn rename(_: &mut Ctx, _: &str) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn delete(_: &mut Ctx, _: &str) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn login_options(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn verify_login(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn passkey_options(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Not served in this build.
pub fn passkey_verify(_: &mut Ctx) -> Result<Outcome, ApiError> {
    Err(ApiError::NotFound)
}
/// Nothing to release: no passkey is ever stored by this build.
pub fn release_claims(_: &mut Ctx, _: &[WebauthnCredential]) {}
