//! Password hashing with Argon2id (the `argon2` crate), and the registration rules.
//!
//! What it does:
//! - [`hash_password`] turns a password, a 16-byte salt and [`Argon2Params`] into a PHC
//!   string (`$argon2id$v=19$m=..,t=..,p=..$<salt>$<hash>`).
//! - [`verify_password`] checks a password against such a string, with the parameters
//!   stored in the string, so changing the settings never breaks older hashes.
//! - [`dummy_verify`] does the same Argon2 work as a verification and throws the result
//!   away, so that a login for an unknown user costs as much as one for a known user.
//! - [`check_rules`] applies the password rules of registration.
//! - [`argon2_invocations`] counts the Argon2 computations done here, for tests.
//!
//! What it does not do: it never draws salts (the caller passes random bytes in), never
//! reads the clock, stores nothing, and does no rate limiting. Passwords longer than
//! [`MAX_PASSWORD_CHARS`] characters are refused before any hashing, so a huge password
//! cannot be used to make the server spend time.

use std::sync::atomic::{AtomicU64, Ordering};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

/// Cost parameters of Argon2id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Params {
    /// Memory cost in KiB (at least 8 × `parallelism`).
    pub memory_kib: u32,
    /// Number of passes over the memory (at least 1).
    pub iterations: u32,
    /// Degree of parallelism (lanes; at least 1). The computation itself runs on one thread.
    pub parallelism: u32,
}

impl Default for Argon2Params {
    /// The OWASP minimum for Argon2id: 19 MiB (19456 KiB), 2 iterations, parallelism 1.
    fn default() -> Self {
        Self {
            memory_kib: 19_456,
            iterations: 2,
            parallelism: 1,
        }
    }
}

/// The longest password accepted, counted in characters (Unicode scalar values), not bytes.
pub const MAX_PASSWORD_CHARS: usize = 128;

/// The shortest password that [`check_rules`] accepts, in characters.
const MIN_PASSWORD_CHARS: usize = 8;

/// The fixed salt of [`dummy_verify`]. Its value does not matter: only the cost does.
const DUMMY_SALT: [u8; 16] = *b"tfa-dummy-salt!!";

/// Why [`hash_password`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordError {
    /// The password has more than [`MAX_PASSWORD_CHARS`] characters; nothing was hashed.
    TooLong,
    /// The [`Argon2Params`] are outside what Argon2 allows (e.g. zero iterations).
    InvalidParams,
    /// The Argon2 computation itself failed.
    Hash,
}

/// Process-wide number of Argon2 computations started by this module.
static ARGON2_INVOCATIONS: AtomicU64 = AtomicU64::new(0);

fn count_invocation() {
    ARGON2_INVOCATIONS.fetch_add(1, Ordering::Relaxed);
}

fn too_long(password: &str) -> bool {
    // Stop counting as soon as the limit is passed: the length of the input does not
    // decide how long this takes beyond the first 129 characters.
    password.chars().nth(MAX_PASSWORD_CHARS).is_some()
}

fn argon2id(params: &Argon2Params) -> Result<Argon2<'static>, PasswordError> {
    let params = Params::new(
        params.memory_kib,
        params.iterations,
        params.parallelism,
        None,
    )
    .map_err(|_| PasswordError::InvalidParams)?;
    Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, params))
}

/// Hashes `password` with Argon2id (version 0x13, 32-byte output) and returns the PHC
/// string `$argon2id$v=19$m=..,t=..,p=..$<salt>$<hash>` (salt and hash in unpadded
/// base64).
///
/// The salt must be 16 random bytes drawn by the caller. A password of more than
/// [`MAX_PASSWORD_CHARS`] characters is refused with [`PasswordError::TooLong`] before
/// any hashing.
///
/// # Errors
/// [`PasswordError::TooLong`] for an overlong password, [`PasswordError::InvalidParams`]
/// for parameters Argon2 does not allow, [`PasswordError::Hash`] if the computation fails.
pub fn hash_password(
    password: &str,
    salt: &[u8; 16],
    params: &Argon2Params,
) -> Result<String, PasswordError> {
    if too_long(password) {
        return Err(PasswordError::TooLong);
    }
    let argon2 = argon2id(params)?;
    let salt = SaltString::encode_b64(salt).map_err(|_| PasswordError::Hash)?;
    count_invocation();
    argon2
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|_| PasswordError::Hash)
}

/// Checks `password` against a PHC string made by [`hash_password`] (or by any Argon2id
/// implementation), using the memory, iterations, parallelism, salt and output length
/// stored in the string, so hashes made under older settings keep working.
///
/// Returns `false`, without hashing, for a password of more than [`MAX_PASSWORD_CHARS`]
/// characters or a string that is not a well-formed Argon2id (v=19) PHC string; `false`
/// also when the password does not match. The final comparison is constant-time (done
/// by the `argon2` crate).
#[must_use]
pub fn verify_password(password: &str, phc: &str) -> bool {
    if too_long(password) {
        return false;
    }
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    if parsed.algorithm != Algorithm::Argon2id.ident()
        || parsed.version != Some(Version::V0x13.into())
        || parsed.salt.is_none()
        || parsed.hash.is_none()
        || Params::try_from(&parsed).is_err()
    {
        return false;
    }
    count_invocation();
    // The verifier takes algorithm, version and parameters from `parsed`.
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}

/// Does the Argon2 work of a [`verify_password`] against a hash made with `params`, and
/// discards the result. Call it when the user is unknown, so that the login costs the
/// same and its timing does not tell whether the account exists.
///
/// Like [`verify_password`], it does nothing for a password of more than
/// [`MAX_PASSWORD_CHARS`] characters. It also does nothing if `params` are invalid
/// (then no real hash could have been made with them either).
pub fn dummy_verify(password: &str, params: &Argon2Params) {
    if too_long(password) {
        return;
    }
    let Ok(argon2) = argon2id(params) else {
        return;
    };
    let Ok(salt) = SaltString::encode_b64(&DUMMY_SALT) else {
        return;
    };
    count_invocation();
    let result = argon2.hash_password(password.as_bytes(), &salt);
    // Keep the optimiser from treating the work as dead.
    std::hint::black_box(result.is_ok());
}

/// Checks the password rules of registration: at least 8 and at most 128 characters,
/// and at least one uppercase letter, one lowercase letter, one digit (0-9) and one
/// special character (anything that is not a letter or a digit, e.g. `!` or a space).
/// Letters are recognised in any script (`É` is uppercase).
///
/// # Errors
/// The first rule broken, as the detail that follows `"Validation error: "`, one of:
/// `"password must be at least 8 characters"`, `"password must be at most 128 characters"`,
/// `"password must contain an uppercase letter"`, `"password must contain a lowercase letter"`,
/// `"password must contain a digit"`, `"password must contain a special character"`.
pub fn check_rules(password: &str) -> Result<(), String> {
    if password.chars().nth(MIN_PASSWORD_CHARS - 1).is_none() {
        return Err(format!(
            "password must be at least {MIN_PASSWORD_CHARS} characters"
        ));
    }
    if too_long(password) {
        return Err(format!(
            "password must be at most {MAX_PASSWORD_CHARS} characters"
        ));
    }
    if !password.chars().any(char::is_uppercase) {
        return Err("password must contain an uppercase letter".to_owned());
    }
    if !password.chars().any(char::is_lowercase) {
        return Err("password must contain a lowercase letter".to_owned());
    }
    if !password.chars().any(|c| c.is_ascii_digit()) {
        return Err("password must contain a digit".to_owned());
    }
    if !password.chars().any(|c| !c.is_alphanumeric()) {
        return Err("password must contain a special character".to_owned());
    }
    Ok(())
}

/// Process-wide number of Argon2 computations this module has started: one for each
/// [`hash_password`], each [`verify_password`] that got as far as hashing, and each
/// [`dummy_verify`] that hashed. Calls refused before hashing (overlong password,
/// malformed PHC string, invalid parameters) do not count.
///
/// The counter is shared by every thread: a test that compares two readings while other
/// tests hash in parallel can see their computations too.
#[must_use]
pub fn argon2_invocations() -> u64 {
    ARGON2_INVOCATIONS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small parameters, so the tests run fast.
    const FAST: Argon2Params = Argon2Params {
        memory_kib: 1024,
        iterations: 1,
        parallelism: 1,
    };

    const SALT: [u8; 16] = *b"somesaltsomesalt";

    // Known answers, made with the reference implementation's CLI (Debian `argon2`
    // package, 0~20171227), e.g. `echo -n password | argon2 somesaltsomesalt -id -t 2 -m 10 -p 1 -e`.
    const REF_M1024_T2_P1: &str = "$argon2id$v=19$m=1024,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$CKGe5/bX9YnCq2rxjW5yQXKxn31v1GKzhDCrMc6r6vA";
    const REF_DEFAULTS: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$K13EBUiG7JV+9ZxztmHFTdb7J0WQsnj2V8bZaqyPptE";
    // `argon2 somesalt -id -t 2 -m 10 -p 1 -e` (an 8-byte salt, which hash_password cannot make).
    const REF_SHORT_SALT: &str =
        "$argon2id$v=19$m=1024,t=2,p=1$c29tZXNhbHQ$7FfsnA6vUe7qLpL/3Kqc3uR48ZJyFbUVt7jWZlf0Htk";
    // `printf %s 'Correct Horse 1!' | argon2 0123456789abcdef -id -t 2 -m 10 -p 2 -e`
    const REF_P2: &str = "$argon2id$v=19$m=1024,t=2,p=2$MDEyMzQ1Njc4OWFiY2RlZg$qceqrRS+Ef8KfjaFmytfON13M55ueD1Ja/YXXusrNo0";
    // `printf %s 'Pässwörd€1' | argon2 saltsaltsaltsalt -id -t 1 -k 1024 -p 1 -e` (UTF-8 bytes)
    const REF_UNICODE: &str = "$argon2id$v=19$m=1024,t=1,p=1$c2FsdHNhbHRzYWx0c2FsdA$3ga6KMz/2W4RSo8fMcP3mbjDnUbwf+SteXAaKXkgUPo";

    fn params(memory_kib: u32, iterations: u32, parallelism: u32) -> Argon2Params {
        Argon2Params {
            memory_kib,
            iterations,
            parallelism,
        }
    }

    #[test]
    fn default_params_are_the_owasp_minimum() {
        assert_eq!(Argon2Params::default(), params(19_456, 2, 1));
    }

    #[test]
    fn known_answer_from_the_reference_cli() {
        let phc = hash_password("password", &SALT, &params(1024, 2, 1)).unwrap();
        assert_eq!(phc, REF_M1024_T2_P1);
    }

    #[test]
    fn known_answer_parallelism_2() {
        let phc =
            hash_password("Correct Horse 1!", b"0123456789abcdef", &params(1024, 2, 2)).unwrap();
        assert_eq!(phc, REF_P2);
    }

    #[test]
    fn known_answer_unicode_password_is_hashed_as_utf8() {
        let phc = hash_password("Pässwörd€1", b"saltsaltsaltsalt", &params(1024, 1, 1)).unwrap();
        assert_eq!(phc, REF_UNICODE);
        assert!(verify_password("Pässwörd€1", &phc));
        assert!(!verify_password("Passwörd€1", &phc));
    }

    #[test]
    fn known_answer_with_default_params() {
        let phc = hash_password("password", &SALT, &Argon2Params::default()).unwrap();
        assert_eq!(phc, REF_DEFAULTS);
        assert!(verify_password("password", &phc));
    }

    #[test]
    fn verifies_hashes_of_the_reference_cli() {
        assert!(verify_password("password", REF_M1024_T2_P1));
        assert!(verify_password("password", REF_SHORT_SALT));
        assert!(verify_password("Correct Horse 1!", REF_P2));
        assert!(!verify_password("Password", REF_SHORT_SALT));
    }

    #[test]
    fn round_trip_and_wrong_password() {
        let phc = hash_password("S3cret!pass", &[7u8; 16], &FAST).unwrap();
        assert!(phc.starts_with("$argon2id$v=19$m=1024,t=1,p=1$"));
        assert!(verify_password("S3cret!pass", &phc));
        assert!(!verify_password("S3cret!pasS", &phc));
        assert!(!verify_password("S3cret!pass ", &phc));
        assert!(!verify_password("", &phc));
    }

    #[test]
    fn different_salts_give_different_hashes() {
        let a = hash_password("S3cret!pass", &[1u8; 16], &FAST).unwrap();
        let b = hash_password("S3cret!pass", &[2u8; 16], &FAST).unwrap();
        assert_ne!(a, b);
        assert!(verify_password("S3cret!pass", &a));
        assert!(verify_password("S3cret!pass", &b));
    }

    #[test]
    fn parameters_are_kept_in_the_phc_string() {
        // Hashed under old, small settings...
        let old = hash_password("S3cret!pass", &[3u8; 16], &params(256, 1, 1)).unwrap();
        assert!(old.contains("$m=256,t=1,p=1$"));
        // ...then the settings change: new hashes use the new ones, old ones still verify.
        let new = hash_password("S3cret!pass", &[3u8; 16], &params(2048, 2, 2)).unwrap();
        assert!(new.contains("$m=2048,t=2,p=2$"));
        assert!(verify_password("S3cret!pass", &old));
        assert!(verify_password("S3cret!pass", &new));
        assert!(!verify_password("wrong", &old));
    }

    #[test]
    fn too_long_password_is_refused_before_hashing() {
        let max = "a".repeat(MAX_PASSWORD_CHARS);
        let over = "a".repeat(MAX_PASSWORD_CHARS + 1);
        assert!(hash_password(&max, &SALT, &FAST).is_ok());
        assert_eq!(
            hash_password(&over, &SALT, &FAST),
            Err(PasswordError::TooLong)
        );
        // Counted as characters, not bytes: 128 three-byte characters are allowed.
        let wide = "€".repeat(MAX_PASSWORD_CHARS);
        let phc = hash_password(&wide, &SALT, &FAST).unwrap();
        assert!(verify_password(&wide, &phc));
        let wide_over = "€".repeat(MAX_PASSWORD_CHARS + 1);
        assert_eq!(
            hash_password(&wide_over, &SALT, &FAST),
            Err(PasswordError::TooLong)
        );
    }

    #[test]
    fn too_long_password_never_verifies() {
        let over = "a".repeat(MAX_PASSWORD_CHARS + 1);
        // Even against a hash of exactly that string, made by another implementation.
        let argon2 = argon2id(&FAST).unwrap();
        let salt = SaltString::encode_b64(&SALT).unwrap();
        let phc = argon2
            .hash_password(over.as_bytes(), &salt)
            .unwrap()
            .to_string();
        assert!(!verify_password(&over, &phc));
    }

    #[test]
    fn invalid_params_are_refused() {
        for bad in [
            params(1024, 0, 1),
            params(1024, 1, 0),
            params(4, 1, 1),
            params(15, 1, 2),
        ] {
            assert_eq!(
                hash_password("x", &SALT, &bad),
                Err(PasswordError::InvalidParams),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_phc_strings_are_rejected() {
        let good = hash_password("password", &SALT, &FAST).unwrap();
        let argon2i = good.replacen("$argon2id$", "$argon2i$", 1);
        let v16 = good.replacen("$v=19$", "$v=16$", 1);
        let no_version = good.replacen("$v=19", "", 1);
        let no_hash = good.rsplit_once('$').unwrap().0.to_owned();
        let bad_param = good.replacen("t=1", "t=0", 1);
        let unknown_param = good.replacen("p=1", "p=1,x=2", 1);
        for bad in [
            "",
            "password",
            "$argon2id$",
            "$2b$12$abcdefghijklmnopqrstuu",
            argon2i.as_str(),
            v16.as_str(),
            no_version.as_str(),
            no_hash.as_str(),
            bad_param.as_str(),
            unknown_param.as_str(),
        ] {
            assert!(!verify_password("password", bad), "{bad}");
        }
        assert!(verify_password("password", &good));
    }

    /// Runs `f` and returns how many Argon2 computations it added to the process-wide
    /// counter. Other tests may hash at the same time and can only add to a reading, so
    /// the smallest of a few readings is `f`'s own count. (It stops early only at a
    /// reading of 0, which nothing can lower: a reading of 1 may be another test's hash
    /// during a call of `f` that computes none.)
    fn invocations_of(f: impl Fn()) -> u64 {
        let mut least = u64::MAX;
        for _ in 0..20 {
            let before = argon2_invocations();
            f();
            let after = argon2_invocations();
            least = least.min(after - before);
            if least == 0 {
                break;
            }
        }
        least
    }

    #[test]
    fn invocation_counter_is_the_same_for_wrong_password_and_unknown_user() {
        let phc = hash_password("R1ght!pass", &SALT, &FAST).unwrap();
        let wrong = invocations_of(|| assert!(!verify_password("Wr0ng!pass", &phc)));
        let right = invocations_of(|| assert!(verify_password("R1ght!pass", &phc)));
        let unknown = invocations_of(|| dummy_verify("Wr0ng!pass", &FAST));
        assert_eq!(wrong, 1);
        assert_eq!(right, 1);
        assert_eq!(unknown, 1);
        assert_eq!(
            invocations_of(|| assert!(hash_password("x", &SALT, &FAST).is_ok())),
            1
        );
    }

    #[test]
    fn invocation_counter_skips_refused_calls() {
        let over = "a".repeat(MAX_PASSWORD_CHARS + 1);
        let phc = hash_password("password", &SALT, &FAST).unwrap();
        assert_eq!(invocations_of(|| assert!(!verify_password(&over, &phc))), 0);
        assert_eq!(invocations_of(|| dummy_verify(&over, &FAST)), 0);
        assert_eq!(
            invocations_of(|| assert!(!verify_password("x", "$nope$"))),
            0
        );
        assert_eq!(invocations_of(|| dummy_verify("x", &params(1, 1, 1))), 0);
        assert_eq!(
            invocations_of(|| assert!(hash_password(&over, &SALT, &FAST).is_err())),
            0
        );
    }

    #[test]
    fn rules_accept_a_good_password() {
        assert_eq!(check_rules("Passw0rd!"), Ok(()));
        assert_eq!(check_rules("Aa1 aaaa"), Ok(())); // a space is a special character
        assert_eq!(check_rules("Éa1!aaaa"), Ok(())); // non-ASCII uppercase
        let max = format!("Aa1!{}", "x".repeat(MAX_PASSWORD_CHARS - 4));
        assert_eq!(check_rules(&max), Ok(()));
    }

    #[test]
    fn rules_minimum_length() {
        assert_eq!(
            check_rules("Aa1!aaa"),
            Err("password must be at least 8 characters".to_owned())
        );
        assert_eq!(
            check_rules(""),
            Err("password must be at least 8 characters".to_owned())
        );
        // Characters, not bytes: 7 characters of 2 bytes each are still too short.
        assert_eq!(
            check_rules("Éé1!ééé"),
            Err("password must be at least 8 characters".to_owned())
        );
        assert_eq!(check_rules("Éé1!éééé"), Ok(()));
    }

    #[test]
    fn rules_maximum_length() {
        let over = format!("Aa1!{}", "x".repeat(MAX_PASSWORD_CHARS - 3));
        assert_eq!(
            check_rules(&over),
            Err("password must be at most 128 characters".to_owned())
        );
    }

    #[test]
    fn rules_character_classes() {
        assert_eq!(
            check_rules("passw0rd!"),
            Err("password must contain an uppercase letter".to_owned())
        );
        assert_eq!(
            check_rules("PASSW0RD!"),
            Err("password must contain a lowercase letter".to_owned())
        );
        assert_eq!(
            check_rules("Password!"),
            Err("password must contain a digit".to_owned())
        );
        assert_eq!(
            check_rules("Passw0rd1"),
            Err("password must contain a special character".to_owned())
        );
    }
}
