//! The crypto provider core installs into `jsonwebtoken`: the HMAC family
//! only (HS256, which every token of this service uses, plus HS384 and
//! HS512), on the RustCrypto `hmac` and `sha2` crates.
//!
//! `jsonwebtoken` parses, validates and dispatches; this provider only
//! computes and checks MACs. Every other algorithm is refused when a signer
//! or verifier is asked for (`InvalidAlgorithm`), which also keeps RSA,
//! elliptic-curve and Edwards code out of every artefact: the Spin component
//! and, above all, the Envoy filter, which is downloaded into every proxy.
//! The API and the filter install the same provider, so they cannot
//! disagree about a token.
//!
//! MAC checks are constant-time (`Mac::verify_slice`).

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, EncodingKey};
use sha2::{Sha256, Sha384, Sha512};

/// The provider [`crate::crypto::tokens`] installs before any signing or checking.
pub static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory,
    verifier_factory,
    key_utils: KeyUtils::new_unimplemented(),
};

/// One keyed MAC of the HMAC family.
enum Keyed {
    S256(Hmac<Sha256>),
    S384(Hmac<Sha384>),
    S512(Hmac<Sha512>),
}

/// A signer or verifier: the algorithm and its keyed MAC.
struct HmacJws {
    alg: Algorithm,
    mac: Keyed,
}

impl HmacJws {
    fn new(alg: Algorithm, family: AlgorithmFamily, key: &[u8]) -> Result<HmacJws> {
        if family != AlgorithmFamily::Hmac {
            return Err(ErrorKind::InvalidKeyFormat.into());
        }
        let bad_key = |_| ErrorKind::InvalidKeyFormat;
        let mac = match alg {
            Algorithm::HS256 => {
                Keyed::S256(<Hmac<Sha256> as KeyInit>::new_from_slice(key).map_err(bad_key)?)
            }
            Algorithm::HS384 => {
                Keyed::S384(<Hmac<Sha384> as KeyInit>::new_from_slice(key).map_err(bad_key)?)
            }
            Algorithm::HS512 => {
                Keyed::S512(<Hmac<Sha512> as KeyInit>::new_from_slice(key).map_err(bad_key)?)
            }
            _ => return Err(ErrorKind::InvalidAlgorithm.into()),
        };
        Ok(HmacJws { alg, mac })
    }

    fn tag(&self, msg: &[u8]) -> Vec<u8> {
        match &self.mac {
            Keyed::S256(m) => m.clone().chain_update(msg).finalize().into_bytes().to_vec(),
            Keyed::S384(m) => m.clone().chain_update(msg).finalize().into_bytes().to_vec(),
            Keyed::S512(m) => m.clone().chain_update(msg).finalize().into_bytes().to_vec(),
        }
    }

    fn check(&self, msg: &[u8], tag: &[u8]) -> bool {
        match &self.mac {
            Keyed::S256(m) => m.clone().chain_update(msg).verify_slice(tag).is_ok(),
            Keyed::S384(m) => m.clone().chain_update(msg).verify_slice(tag).is_ok(),
            Keyed::S512(m) => m.clone().chain_update(msg).verify_slice(tag).is_ok(),
        }
    }
}

impl signature::Signer<Vec<u8>> for HmacJws {
    fn try_sign(&self, msg: &[u8]) -> std::result::Result<Vec<u8>, signature::Error> {
        Ok(self.tag(msg))
    }
}

impl signature::Verifier<Vec<u8>> for HmacJws {
    fn verify(&self, msg: &[u8], tag: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        if self.check(msg, tag) {
            Ok(())
        } else {
            Err(signature::Error::new())
        }
    }
}

impl JwtSigner for HmacJws {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

impl JwtVerifier for HmacJws {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

fn signer_factory(alg: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    Ok(Box::new(HmacJws::new(*alg, key.family(), key.as_bytes())?))
}

fn verifier_factory(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if key.family() != AlgorithmFamily::Hmac {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    Ok(Box::new(HmacJws::new(
        *alg,
        key.family(),
        key.try_get_as_bytes()?,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use signature::{Signer, Verifier};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// RFC 4231 test case 2 ("Jefe"), through the provider's MACs.
    #[test]
    fn rfc4231_case_2() {
        let msg = b"what do ya want for nothing?";
        let cases = [
            (
                Algorithm::HS256,
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                Algorithm::HS384,
                "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649",
            ),
            (
                Algorithm::HS512,
                "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737",
            ),
        ];
        for (alg, want) in cases {
            let s = HmacJws::new(alg, AlgorithmFamily::Hmac, b"Jefe").expect("key");
            let tag = s.try_sign(msg).expect("sign");
            assert_eq!(hex(&tag), want, "{alg:?}");
            assert!(s.verify(msg, &tag).is_ok());
            let mut bad = tag.clone();
            bad[0] ^= 1;
            assert!(s.verify(msg, &bad).is_err());
            assert!(s.verify(msg, &tag[..tag.len() - 1].to_vec()).is_err());
        }
    }

    #[test]
    fn other_algorithms_and_key_kinds_are_refused() {
        for alg in [
            Algorithm::RS256,
            Algorithm::PS256,
            Algorithm::ES256,
            Algorithm::EdDSA,
        ] {
            assert!(HmacJws::new(alg, AlgorithmFamily::Hmac, b"k").is_err());
        }
        assert!(HmacJws::new(Algorithm::HS256, AlgorithmFamily::Rsa, b"k").is_err());
    }
}
