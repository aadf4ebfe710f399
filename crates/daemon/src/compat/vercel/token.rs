//! The credential Vercel's SDK carries: a JWT (`VERCEL_OIDC_TOKEN`) that it decodes for its
//! `owner_id` and `project_id` claims and sends as `Authorization: Bearer`.
//!
//! The daemon mints one signed with HS256 under its own bearer token, so the JWT stands for
//! that token: whoever can read the token can get one, nobody else can forge one, and a new
//! token (a new daemon home) invalidates the old ones. [`accept`] swaps a valid JWT for the
//! token before the daemon's usual credential check, which stays the only check.
//!
//! A JWT lives [`LIFETIME_SECS`], so one that leaks (a child's environment, a log) is worth
//! little for long; `exp` is required and `nbf`, when present, is honoured, each with
//! [`SKEW_SECS`] of slack. A program run by `belljar vercel --` may run for days: its preload
//! trades the JWT it holds for a new one while it is still valid (`/belljar/credentials`
//! takes a JWT like any route here) and puts the new one where the SDK reads it.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::auth::Auth;

/// The team and project the SDK believes it works in; they name nothing here.
pub const TEAM: &str = "team_belljar";
pub const PROJECT: &str = "prj_belljar";

/// How long a minted JWT is valid. The SDK treats a JWT near its `exp` as expired and asks
/// Vercel's CLI (absent here) for another, so the preload renews it three quarters before
/// then; an hour leaves that renewal 45 minutes to succeed.
pub const LIFETIME_SECS: i64 = 3600;

/// The slack allowed on `exp` and `nbf`. The SDK that holds the JWT runs on this machine, on
/// the daemon's own clock, so the slack covers whole-second rounding and a request in flight
/// at the moment of expiry, not clocks of other machines.
const SKEW_SECS: i64 = 5;

/// Why a JWT that names itself as the daemon's is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a JWT the daemon could have signed: not three base64 parts, not HS256, no `exp`.
    #[error("The credential is not a JWT that Belljar issued")]
    Malformed,
    /// The signature is not the daemon's (another home's token, or a changed payload).
    #[error("The credential's signature is not Belljar's")]
    BadSignature,
    /// Its `exp` has passed.
    #[error("The credential has expired; run `belljar vercel` again for a new one")]
    Expired,
    /// Its `nbf` is still to come.
    #[error("The credential is not valid yet")]
    NotYetValid,
}

impl TokenError {
    /// The stable code of the answer.
    pub fn code(self) -> &'static str {
        match self {
            Self::Malformed | Self::BadSignature => "unauthorized",
            Self::Expired => "token_expired",
            Self::NotYetValid => "token_not_yet_valid",
        }
    }
}

/// The claims [`verify`] reads; the others are the SDK's.
#[derive(Deserialize)]
struct Times {
    exp: i64,
    nbf: Option<i64>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

/// The time now in Unix seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// A JWT for the SDK, signed under `token`, issued at `now` (Unix seconds) and valid for
/// `lifetime` seconds ([`LIFETIME_SECS`] but in tests).
pub fn mint(token: &str, now: i64, lifetime: i64) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "iss": "belljar",
        "sub": "belljar-vercel-compat",
        "owner_id": TEAM,
        "project_id": PROJECT,
        "iat": now,
        "nbf": now,
        // Two JWTs minted in the same second differ, so a renewed one is always new.
        "jti": crate::http::auth::random_token(),
        "exp": now.saturating_add(lifetime),
    });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let mac = hmac_sha256(token.as_bytes(), signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(mac))
}

/// Checks that `jwt` carries the daemon's signature under `token` and is valid at `now`
/// (Unix seconds). The signature is checked first, so that the claims of a forgery are
/// never read.
pub fn verify(token: &str, jwt: &str, now: i64) -> Result<(), TokenError> {
    let (signing_input, sig) = jwt.rsplit_once('.').ok_or(TokenError::Malformed)?;
    let (header, payload) = signing_input.split_once('.').ok_or(TokenError::Malformed)?;
    if payload.contains('.') {
        return Err(TokenError::Malformed);
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| TokenError::Malformed)?;
    let mac = hmac_sha256(token.as_bytes(), signing_input.as_bytes());
    if !bool::from(sig.as_slice().ct_eq(&mac)) {
        return Err(TokenError::BadSignature);
    }
    let json = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| TokenError::Malformed)
    };
    let header: Header =
        serde_json::from_slice(&json(header)?).map_err(|_| TokenError::Malformed)?;
    if header.alg != "HS256" {
        return Err(TokenError::Malformed);
    }
    let times: Times =
        serde_json::from_slice(&json(payload)?).map_err(|_| TokenError::Malformed)?;
    if now > times.exp.saturating_add(SKEW_SECS) {
        return Err(TokenError::Expired);
    }
    if times
        .nbf
        .is_some_and(|nbf| now < nbf.saturating_sub(SKEW_SECS))
    {
        return Err(TokenError::NotYetValid);
    }
    Ok(())
}

/// Replaces a bearer JWT the daemon signed and that is valid now with the daemon's token. A
/// bearer that is no JWT, or a JWT with a foreign signature, is left for the usual check to
/// refuse; a JWT of the daemon's that has expired (or is not valid yet) is refused here, with a
/// code that tells the caller to get a new one.
pub fn accept(auth: &Auth, headers: &mut HeaderMap, now: i64) -> Result<(), TokenError> {
    let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return Ok(());
    };
    if bearer.matches('.').count() != 2 {
        return Ok(());
    }
    match verify(auth.token(), bearer, now) {
        Ok(()) => {
            if let Ok(value) = HeaderValue::from_str(&format!("Bearer {}", auth.token())) {
                headers.insert(header::AUTHORIZATION, value);
            }
            Ok(())
        }
        Err(TokenError::Malformed | TokenError::BadSignature) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000;

    /// A JWT with these claims, signed under `token` as [`mint`] signs.
    fn signed(token: &str, claims: serde_json::Value) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
        let mac = hmac_sha256(token.as_bytes(), input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    fn bearer(jwt: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {jwt}").parse().unwrap(),
        );
        h
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_minted_jwt_verifies_only_under_its_token() {
        let jwt = mint("secret", T0, LIFETIME_SECS);
        assert_eq!(jwt.split('.').count(), 3);
        assert_eq!(verify("secret", &jwt, T0), Ok(()));
        assert_eq!(verify("other", &jwt, T0), Err(TokenError::BadSignature));
        let claims: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(jwt.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["owner_id"], TEAM);
        assert_eq!(claims["project_id"], PROJECT);
        // A changed payload keeps the signature of the old one: refused.
        let (h, rest) = jwt.split_once('.').unwrap();
        let sig = rest.split_once('.').unwrap().1;
        let forged = format!(
            "{h}.{}.{sig}",
            URL_SAFE_NO_PAD.encode(b"{\"owner_id\":\"x\"}")
        );
        assert_eq!(verify("secret", &forged, T0), Err(TokenError::BadSignature));
        assert_eq!(verify("secret", "a.b", T0), Err(TokenError::Malformed));
        assert_eq!(verify("secret", "a.b.!!", T0), Err(TokenError::Malformed));
    }

    /// A minted JWT lasts an hour (the old ones lasted ten years): valid through its
    /// lifetime and the skew, refused after.
    #[test]
    fn a_minted_jwt_is_short_lived() {
        let jwt = mint("secret", T0, LIFETIME_SECS);
        assert_eq!(verify("secret", &jwt, T0 + LIFETIME_SECS), Ok(()));
        assert_eq!(
            verify("secret", &jwt, T0 + LIFETIME_SECS + SKEW_SECS),
            Ok(())
        );
        assert_eq!(
            verify("secret", &jwt, T0 + LIFETIME_SECS + SKEW_SECS + 1),
            Err(TokenError::Expired)
        );
        // A clock a little behind the minter's still takes it.
        assert_eq!(verify("secret", &jwt, T0 - SKEW_SECS), Ok(()));
        assert_eq!(
            verify("secret", &jwt, T0 - SKEW_SECS - 1),
            Err(TokenError::NotYetValid)
        );
    }

    #[test]
    fn expiry_and_not_before_are_checked() {
        let now = T0;
        // Signed with the right key, but its `exp` is in 2001.
        let old = signed("secret", serde_json::json!({"exp": 1_000_000_000}));
        assert_eq!(verify("secret", &old, now), Err(TokenError::Expired));
        let early = signed(
            "secret",
            serde_json::json!({"exp": now + 3600, "nbf": now + 600}),
        );
        assert_eq!(verify("secret", &early, now), Err(TokenError::NotYetValid));
        let fresh = signed("secret", serde_json::json!({"exp": now + 3600, "nbf": now}));
        assert_eq!(verify("secret", &fresh, now), Ok(()));
        // No `exp` is no JWT of the daemon's.
        let endless = signed("secret", serde_json::json!({"owner_id": TEAM}));
        assert_eq!(verify("secret", &endless, now), Err(TokenError::Malformed));
        // Nor is another algorithm's header, even over the right MAC.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        let input = format!(
            "{header}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::json!({"exp": now + 60}).to_string())
        );
        let mac = URL_SAFE_NO_PAD.encode(hmac_sha256(b"secret", input.as_bytes()));
        assert_eq!(
            verify("secret", &format!("{input}.{mac}"), now),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn accept_swaps_only_a_valid_jwt() {
        let auth = Auth::new("secret".into(), vec![]);
        let mut h = bearer(&mint("secret", T0, LIFETIME_SECS));
        assert_eq!(accept(&auth, &mut h, T0 + 10), Ok(()));
        assert_eq!(h[header::AUTHORIZATION], "Bearer secret");
        // A foreign signature is left for the usual check (a 401).
        let forged = mint("guess", T0, LIFETIME_SECS);
        let mut h = bearer(&forged);
        assert_eq!(accept(&auth, &mut h, T0 + 10), Ok(()));
        assert_eq!(
            h[header::AUTHORIZATION],
            format!("Bearer {forged}").as_str()
        );
        // The daemon's own, expired: refused with its own code, and not swapped.
        let expired = mint("secret", T0, LIFETIME_SECS);
        let mut h = bearer(&expired);
        let late = T0 + LIFETIME_SECS + SKEW_SECS + 1;
        assert_eq!(accept(&auth, &mut h, late), Err(TokenError::Expired));
        assert_eq!(TokenError::Expired.code(), "token_expired");
        assert_eq!(
            h[header::AUTHORIZATION],
            format!("Bearer {expired}").as_str()
        );
        // The plain token is no JWT: untouched.
        let mut h = bearer("secret");
        assert_eq!(accept(&auth, &mut h, late), Ok(()));
        assert_eq!(h[header::AUTHORIZATION], "Bearer secret");
    }
}
