//! The Vercel layer's JWTs end: the daemon refuses one past its `exp`, and the preload of
//! `belljar vercel --` renews the one a long-running program holds, in its environment and in
//! the requests of clients made with an older one. Real `node`, the real preload, the real
//! daemon with JWTs that live a second.

mod common;

use std::process::Command;

use common::Daemon;

const PRELOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../cli/src/vercel/preload.mjs");

/// What the program reports: whether its environment's JWT was renewed, the status of a
/// request that carried the first JWT through the preload after it expired, and the answer to
/// the same request sent around the preload.
const PROGRAM: &str = r#"
import http from "node:http";
const first = process.env.VERCEL_OIDC_TOKEN;
const { exp } = JSON.parse(Buffer.from(first.split(".")[1], "base64url").toString());
const tick = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const deadline = Date.now() + 20_000;
while (process.env.VERCEL_OIDC_TOKEN === first && Date.now() < deadline) await tick(20);
const renewed = process.env.VERCEL_OIDC_TOKEN !== first;
// Until the first JWT is past its end and the daemon's slack (5 s).
while (Date.now() / 1000 <= exp + 6) await tick(100);
const via = await fetch("https://vercel.com/api/belljar/credentials", {
  headers: { authorization: `Bearer ${first}` },
});
const direct = await new Promise((resolve, reject) => {
  const url = `${process.env.BELLJAR_VERCEL_URL}/belljar/credentials`;
  http.get(url, { headers: { authorization: `Bearer ${first}` } }, (res) => {
    let body = "";
    res.on("data", (c) => (body += c));
    res.on("end", () => resolve({ status: res.statusCode, body: JSON.parse(body) }));
  }).on("error", reject);
});
console.log(JSON.stringify({ renewed, via: via.status, direct }));
"#;

#[test]
fn an_expired_jwt_is_refused_and_a_running_program_keeps_a_fresh_one() {
    let d = Daemon::start_with(&["--port", "0", "--testing-vercel-token-lifetime", "1s"]);
    let creds = d.tcp_authed("GET", "/compat/vercel/belljar/credentials", "");
    assert_eq!(creds.status, 200, "{}", creds.body);
    let jwt = creds.json()["token"].as_str().unwrap().to_owned();
    let out = Command::new("node")
        .args(["--input-type=module", "-e", PROGRAM])
        .env("NODE_OPTIONS", format!("--import={PRELOAD}"))
        .env(
            "BELLJAR_VERCEL_URL",
            format!("http://127.0.0.1:{}/compat/vercel", d.port),
        )
        .env("VERCEL_OIDC_TOKEN", &jwt)
        .output()
        .expect("node runs (scripts/setup.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["renewed"], true, "{report}");
    assert_eq!(report["via"], 200, "{report}");
    assert_eq!(report["direct"]["status"], 401, "{report}");
    assert_eq!(report["direct"]["body"]["error"]["code"], "token_expired");
    // The plain token is not a JWT and has no end.
    assert_eq!(d.tcp_authed("GET", "/v1/info", "").status, 200);
}
