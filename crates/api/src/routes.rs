//! The route table of the daemon's HTTP API, in one place for clients and docs.
//!
//! All routes live under `/v1`. Over TCP (127.0.0.1) every request needs
//! `Authorization: Bearer <token>` (or the session cookie that `GET /ui?token=<one-time>` sets);
//! over the Unix socket none. Long outputs stream as NDJSON (`application/x-ndjson`); a route
//! marked WS also accepts a WebSocket upgrade.
//!
//! | method | path | body / query | answer |
//! |---|---|---|---|
//! | GET | `/v1/info` | | `Info` |
//! | GET | `/v1/openapi.json` | | the OpenAPI document |
//! | POST | `/v1/session/token` | | `SessionToken` (one-time, for `GET /ui?token=`) |
//! | GET | `/v1/events` (WS) | `?since=seq` | NDJSON of `Event` |
//! | GET | `/v1/images` | | `Vec<Image>` |
//! | POST | `/v1/images/{name}/build` | | NDJSON of `ImageBuildEvent` |
//! | POST | `/v1/sandboxes` | `CreateSandbox` | 201 `Sandbox` (running) |
//! | GET | `/v1/sandboxes` | `ListSandboxesQuery` | `SandboxList` |
//! | GET | `/v1/sandboxes/{id}` | | `Sandbox` |
//! | PATCH | `/v1/sandboxes/{id}` | `UpdateSandbox` | `Sandbox` |
//! | POST | `/v1/sandboxes/{id}/extend` | `ExtendSandbox` | `Sandbox` |
//! | POST | `/v1/sandboxes/{id}/stop` | | `Sandbox` (stopped) |
//! | DELETE | `/v1/sandboxes/{id}` | | 204 (stops it first) |
//! | POST | `/v1/sandboxes/{id}/commands` | `RunCommand` | `Command` (exited unless `detached`) |
//! | GET | `/v1/sandboxes/{id}/commands` | | `CommandList` |
//! | GET | `/v1/sandboxes/{id}/commands/{cid}` | `?wait=true` | `Command` |
//! | GET | `/v1/sandboxes/{id}/commands/{cid}/logs` | `?follow=true` | NDJSON of `LogLine` |
//! | POST | `/v1/sandboxes/{id}/commands/{cid}/kill` | `KillCommand` | `Command` |
//! | POST | `/v1/sandboxes/{id}/commands/{cid}/stdin` | raw bytes; `?close=true` | 204 |
//! | POST | `/v1/sandboxes/{id}/commands/{cid}/resize` | `PtySize` | 204 |
//! | GET | `/v1/sandboxes/{id}/files` | `?path=` | raw bytes |
//! | PUT | `/v1/sandboxes/{id}/files` | `?path=&mode=644` raw bytes (parents created) | `FileEntry` |
//! | DELETE | `/v1/sandboxes/{id}/files` | `?path=&recursive=true` | 204 |
//! | GET | `/v1/sandboxes/{id}/files/list` | `?path=` | `FileList` |
//! | GET | `/v1/sandboxes/{id}/files/stat` | `?path=` | `FileEntry` |
//! | POST | `/v1/sandboxes/{id}/files/mkdir` | `MkdirRequest` | `FileEntry` |
//! | POST | `/v1/sandboxes/{id}/files/move` | `MoveRequest` | `FileEntry` |
//! | GET | `/v1/sandboxes/{id}/files/tar` | `?path=` | `application/x-tar` |
//! | PUT | `/v1/sandboxes/{id}/files/tar` | `?path=` tar body | 204 |
//! | GET | `/v1/sandboxes/{id}/files/watch` (WS) | `?path=&recursive=true` | NDJSON of `WatchEvent` |
//! | GET | `/v1/sandboxes/{id}/files/thumbnail` | `?path=&size=128` | `image/png` |
//! | GET | `/v1/sandboxes/{id}/terminal` (WS only) | `?rows=&cols=&cwd=&sudo=` | binary PTY bytes + `TerminalMessage` text frames |
//!
//! Outside `/v1`: `GET /ui?token=<one-time>` sets the `belljar_session` cookie (HttpOnly,
//! SameSite=Strict) and redirects to `/`, where the web UI is served.
//!
//! Errors are `ErrorBody` with a fitting status: 400 `bad_request` (naming the field), 401,
//! 403, 404 `not_found`, 409 `sandbox_not_running`, 507 `insufficient_resources`, 502
//! `agent_unavailable`, 500 `internal`. Agent codes pass through unchanged: `not_found`,
//! `command_not_found` 404; `invalid_path`, `is_a_directory`, `not_a_directory`,
//! `exec_failed`, `unknown_user` 400; `exists`, `not_empty`, `command_finished` 409;
//! `permission_denied` 403; `no_space` 507; other agent failures 502.

/// The API's path prefix.
pub const PREFIX: &str = "/v1";

/// The default TCP port of the daemon on 127.0.0.1.
pub const DEFAULT_PORT: u16 = 7423;

/// The NDJSON media type of streaming answers.
pub const NDJSON: &str = "application/x-ndjson";
