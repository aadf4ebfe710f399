//! The credential Vercel's SDK carries: a JWT (`VERCEL_OIDC_TOKEN`) that it decodes for its
//! `owner_id` and `project_id` claims and sends as `Authorization: Bearer`.
//!
//! The daemon mints one signed with HS256 under its own bearer token, so the JWT stands for
//! that token: whoever can read the token can get one, nobody else can forge one, and a new
//! token (a new daemon home) invalidates the old ones. [`accept`] swaps a valid JWT for the
//! token before the daemon's usual credential check, which stays the only check.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::auth::Auth;

/// The team and project the SDK believes it works in; they name nothing here.
pub const TEAM: &str = "team_belljar";
pub const PROJECT: &str = "prj_belljar";

/// How long a minted JWT is valid. The SDK refreshes tokens that expire within five minutes
/// through Vercel's CLI, which is not there, so the lifetime is long.
const LIFETIME_SECS: i64 = 10 * 365 * 24 * 3600;

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

/// A JWT for the SDK, signed under `token`, issued at `now` (Unix seconds).
pub fn mint(token: &str, now: i64) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "iss": "belljar",
        "sub": "belljar-vercel-compat",
        "owner_id": TEAM,
        "project_id": PROJECT,
        "iat": now,
        "exp": now.saturating_add(LIFETIME_SECS),
    });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let mac = hmac_sha256(token.as_bytes(), signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(mac))
}

/// Whether `jwt` carries a valid signature under `token` (its claims are not checked: the
/// signature alone says the daemon issued it).
pub fn verify(token: &str, jwt: &str) -> bool {
    let Some((signing_input, sig)) = jwt.rsplit_once('.') else {
        return false;
    };
    if signing_input.split('.').count() != 2 {
        return false;
    }
    let Ok(sig) = URL_SAFE_NO_PAD.decode(sig) else {
        return false;
    };
    let mac = hmac_sha256(token.as_bytes(), signing_input.as_bytes());
    bool::from(sig.as_slice().ct_eq(&mac))
}

/// Replaces a bearer JWT the daemon signed with the daemon's token; anything else is left for
/// the usual check to judge.
pub fn accept(auth: &Auth, headers: &mut HeaderMap) {
    let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return;
    };
    if bearer.matches('.').count() == 2
        && verify(auth.token(), bearer.trim())
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {}", auth.token()))
    {
        headers.insert(header::AUTHORIZATION, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let jwt = mint("secret", 1_700_000_000);
        assert_eq!(jwt.split('.').count(), 3);
        assert!(verify("secret", &jwt));
        assert!(!verify("other", &jwt));
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
        assert!(!verify("secret", &forged));
        assert!(!verify("secret", "a.b"));
        assert!(!verify("secret", "a.b.!!"));
    }

    #[test]
    fn accept_swaps_only_a_valid_jwt() {
        let auth = Auth::new("secret".into(), vec![]);
        let mut h = HeaderMap::new();
        let jwt = mint("secret", 0);
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {jwt}").parse().unwrap(),
        );
        accept(&auth, &mut h);
        assert_eq!(h[header::AUTHORIZATION], "Bearer secret");
        let forged = mint("guess", 0);
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {forged}").parse().unwrap(),
        );
        accept(&auth, &mut h);
        assert_eq!(
            h[header::AUTHORIZATION],
            format!("Bearer {forged}").as_str()
        );
    }
}
