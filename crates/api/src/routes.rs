//! The route table of the daemon's HTTP API, in one place for clients and docs.
//!
//! All routes live under `/v1`. Over TCP (127.0.0.1) every request needs
//! `Authorization: Bearer <token>` (or the session cookie that `GET /ui?token=<one-time>` sets);
//! over the Unix socket none. Long outputs stream as NDJSON (`application/x-ndjson`); a route
//! marked WS also accepts a WebSocket upgrade.
//!
//! The routes themselves, with their parameters, bodies, bounds and every status, are the
//! OpenAPI document that the daemon serves at `GET /v1/openapi.json`; it is generated from the
//! handlers (`crates/daemon/src/http`, `utoipa` + `utoipa-axum`), so it cannot drift from them.
//!
//! Outside `/v1`: `GET /ui?token=<one-time>` sets the `belljar_session` cookie (HttpOnly,
//! SameSite=Strict) and redirects to `/`, where the web UI is served.
//!
//! Errors are `ErrorBody` whose `code` is one of the closed list [`crate::ErrorCode`], each
//! with its status ([`crate::ErrorCode::status`]): 400 `bad_request` (naming the field), 401,
//! 403, 404 `not_found`, 409 `sandbox_not_running`, 413 `payload_too_large`, 500 `internal`,
//! 502 `agent_unavailable`, 503 `backend_unavailable`, 507 `insufficient_resources`. The
//! sandbox agent's file and command codes are mapped into the list
//! ([`crate::ErrorCode::from_agent`]): `not_found`, `command_not_found` 404; `invalid_path`,
//! `is_a_directory`, `not_a_directory`, `exec_failed`, `unknown_user` 400; `exists`,
//! `not_empty`, `command_finished` 409; `permission_denied` 403; `no_space` 507; any other
//! agent failure 502 `agent_error`.

/// The API's path prefix.
pub const PREFIX: &str = "/v1";

/// The default TCP port of the daemon on 127.0.0.1.
pub const DEFAULT_PORT: u16 = 7423;

/// The NDJSON media type of streaming answers.
pub const NDJSON: &str = "application/x-ndjson";
