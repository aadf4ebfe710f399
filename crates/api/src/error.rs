//! The one error shape every client sees: `{"error":{"code","message"}}`, and the closed list
//! of codes it may carry.
//!
//! The codes are a closed enum so that clients can match on them and the generated TypeScript
//! (`ErrorCode`, a union of string literals) names every one. The sandbox's agent has codes of
//! its own; [`ErrorCode::from_agent`] maps them into this list, so a guest cannot define (or
//! pick) the codes the daemon's clients see.

use belljar_agent_proto::codes as agent;
use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A stable machine-readable `code` and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code,
                message: message.into(),
            },
        }
    }
}

/// Every error code the daemon answers, serialized as its `snake_case` name (`bad_request`).
/// Each has its HTTP status ([`ErrorCode::status`]); the exception is a request axum refuses
/// before any handler runs (a wrong method: 405, a wrong media type: 415), answered as
/// `bad_request` with axum's own status.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    TS,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed; the message names the field.
    BadRequest,
    /// 401: no or wrong bearer token.
    Unauthorized,
    /// 403: a foreign `Origin` or a non-loopback `Host`; an image build asked of a daemon that
    /// is not root.
    Forbidden,
    /// 404: no such sandbox, command, image or file.
    NotFound,
    /// 409: the sandbox is not in a state that allows this (e.g. exec on a stopped one).
    SandboxNotRunning,
    /// 409: the operation conflicts with the current state.
    Conflict,
    /// 413: a JSON request body larger than `limits::MAX_JSON_BODY`.
    PayloadTooLarge,
    /// 507: not enough free host memory (or disk) for the sandbox.
    InsufficientResources,
    /// 400: the image is unknown or not built yet.
    ImageNotAvailable,
    /// 503: the requested backend cannot run on this host.
    BackendUnavailable,
    /// 502: the sandbox's agent did not answer.
    AgentUnavailable,
    /// 502: the sandbox's agent failed in a way it has no code for (or sent one we do not know).
    AgentError,
    /// 500: a bug or an unexpected host failure; details are in the daemon's log.
    Internal,
    /// 400: a thumbnail was asked of a file that is not an image the daemon can decode.
    NotAnImage,
    /// 500: an image build failed (only in the build's NDJSON stream).
    BuildFailed,
    /// 404: the sandbox has no such command (the agent's `command_not_found`).
    CommandNotFound,
    /// 400: a path the sandbox refuses (relative, empty, or with a NUL).
    InvalidPath,
    /// 400: a directory where a file is needed.
    IsADirectory,
    /// 400: a file where a directory is needed.
    NotADirectory,
    /// 400: a FIFO, socket or device where a regular file is needed.
    NotARegularFile,
    /// 400: the program could not be started (not found, not executable).
    ExecFailed,
    /// 400: no such user in the sandbox.
    UnknownUser,
    /// 409: the path already exists.
    Exists,
    /// 409: the directory is not empty.
    NotEmpty,
    /// 409: the command already finished.
    CommandFinished,
    /// 409: the file or mount is in use.
    Busy,
    /// 403: the sandbox's filesystem refused the operation.
    PermissionDenied,
    /// 413: the file would exceed the filesystem's largest file.
    FileTooLarge,
    /// 507: the sandbox's disk is full.
    NoSpace,
    /// 503: the sandbox is out of file descriptors or memory for now.
    TryAgain,
    /// 409: the snapshot is deleted or failed; nothing can start from it.
    SnapshotNotUsable,
    /// 501: the sandbox's backend cannot do this yet (e.g. snapshots of microVM sandboxes).
    NotSupported,
    /// 404: the registry or archive has no such image, tag or platform (the message holds the
    /// registry's answer).
    ImageNotFound,
    /// 400: an image that breaks the rules: a digest or size that does not match, a layer
    /// entry out of its root, a document over size or of a kind Belljar cannot read.
    ImageInvalid,
    /// 413: the image would hold more than the image store's cap.
    ImageTooLarge,
    /// 403: the registry refused access (no or wrong credentials: `belljar login`).
    RegistryDenied,
    /// 502: the registry cannot be reached, stalled, or broke the distribution API.
    RegistryUnavailable,
    /// 400: a Dockerfile that cannot be built as written (the message names the line).
    DockerfileInvalid,
    /// 403: the caller may not mount that host folder (it cannot read it, or write it for a
    /// read-write mount; over TCP it is under no `--allow-mount-root`), or the folder is one
    /// no sandbox may mount (`/`, `/proc`, the daemon's own directories).
    MountDenied,
    /// 404: no such volume.
    VolumeNotFound,
    /// 409: a sandbox mounts the volume.
    VolumeInUse,
    /// 404: no such template.
    TemplateNotFound,
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub fn status(self) -> u16 {
        use ErrorCode::*;
        match self {
            BadRequest | ImageNotAvailable | NotAnImage | InvalidPath | IsADirectory
            | NotADirectory | NotARegularFile | ExecFailed | UnknownUser | ImageInvalid
            | DockerfileInvalid => 400,
            Unauthorized => 401,
            Forbidden | PermissionDenied | RegistryDenied | MountDenied => 403,
            NotFound | CommandNotFound | ImageNotFound | VolumeNotFound | TemplateNotFound => 404,
            SandboxNotRunning | Conflict | Exists | NotEmpty | CommandFinished | Busy
            | SnapshotNotUsable | VolumeInUse => 409,
            PayloadTooLarge | FileTooLarge | ImageTooLarge => 413,
            Internal | BuildFailed => 500,
            NotSupported => 501,
            AgentUnavailable | AgentError | RegistryUnavailable => 502,
            BackendUnavailable | TryAgain => 503,
            InsufficientResources | NoSpace => 507,
        }
    }

    /// The code for an error code the sandbox's agent sent. The agent's file and command codes
    /// keep their names; anything else, including the agent's own `internal`, is
    /// [`ErrorCode::AgentError`], so a guest cannot answer with the daemon's codes
    /// (`unauthorized`, `sandbox_not_running`, ...).
    pub fn from_agent(code: &str) -> Self {
        use ErrorCode::*;
        let known = [
            (agent::NOT_FOUND, NotFound),
            (agent::COMMAND_NOT_FOUND, CommandNotFound),
            (agent::BAD_REQUEST, BadRequest),
            (agent::INVALID_PATH, InvalidPath),
            (agent::IS_A_DIRECTORY, IsADirectory),
            (agent::NOT_A_DIRECTORY, NotADirectory),
            (agent::NOT_A_REGULAR_FILE, NotARegularFile),
            (agent::EXEC_FAILED, ExecFailed),
            (agent::UNKNOWN_USER, UnknownUser),
            (agent::EXISTS, Exists),
            (agent::NOT_EMPTY, NotEmpty),
            (agent::COMMAND_FINISHED, CommandFinished),
            (agent::BUSY, Busy),
            (agent::PERMISSION_DENIED, PermissionDenied),
            (agent::FILE_TOO_LARGE, FileTooLarge),
            (agent::NO_SPACE, NoSpace),
            (agent::TRY_AGAIN, TryAgain),
        ];
        known
            .into_iter()
            .find(|(known, _)| *known == code)
            .map_or(AgentError, |(_, ours)| ours)
    }

    /// The code's wire name, as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    /// The wire names are a contract with every client: each code keeps the string the daemon
    /// answered before the enum existed, and serde, strum and `as_str` agree on it.
    #[test]
    fn codes_keep_their_wire_names() {
        let names = [
            "bad_request",
            "unauthorized",
            "forbidden",
            "not_found",
            "sandbox_not_running",
            "conflict",
            "payload_too_large",
            "insufficient_resources",
            "image_not_available",
            "backend_unavailable",
            "agent_unavailable",
            "agent_error",
            "internal",
            "not_an_image",
            "build_failed",
            "command_not_found",
            "invalid_path",
            "is_a_directory",
            "not_a_directory",
            "not_a_regular_file",
            "exec_failed",
            "unknown_user",
            "exists",
            "not_empty",
            "command_finished",
            "busy",
            "permission_denied",
            "file_too_large",
            "no_space",
            "try_again",
            "snapshot_not_usable",
            "not_supported",
            "image_not_found",
            "image_invalid",
            "image_too_large",
            "registry_denied",
            "registry_unavailable",
            "dockerfile_invalid",
            "mount_denied",
            "volume_not_found",
            "volume_in_use",
            "template_not_found",
        ];
        assert_eq!(ErrorCode::VARIANTS.len(), names.len());
        for (code, name) in ErrorCode::VARIANTS.iter().zip(names) {
            assert_eq!(code.as_str(), name);
            assert_eq!(code.to_string(), name);
            assert_eq!(serde_json::to_value(code).unwrap(), name);
            assert_eq!(
                serde_json::from_value::<ErrorCode>(name.into()).unwrap(),
                *code
            );
            assert_eq!(name.parse::<ErrorCode>().unwrap(), *code);
        }
        let body = ErrorBody::new(ErrorCode::NotFound, "no sandbox sbx_a");
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"error":{"code":"not_found","message":"no sandbox sbx_a"}}"#
        );
        // The list is closed: a code nobody defined does not decode.
        assert!(serde_json::from_str::<ErrorCode>(r#""teapot""#).is_err());
    }

    #[test]
    fn agent_codes_map_into_the_list() {
        assert_eq!(
            ErrorCode::from_agent("is_a_directory"),
            ErrorCode::IsADirectory
        );
        assert_eq!(ErrorCode::from_agent("try_again"), ErrorCode::TryAgain);
        assert_eq!(ErrorCode::from_agent("internal"), ErrorCode::AgentError);
        // A guest cannot pick the daemon's codes, nor invent one.
        assert_eq!(ErrorCode::from_agent("unauthorized"), ErrorCode::AgentError);
        assert_eq!(
            ErrorCode::from_agent("sandbox_not_running"),
            ErrorCode::AgentError
        );
        assert_eq!(ErrorCode::from_agent("made_up"), ErrorCode::AgentError);
        // Every agent code the agent defines is known here (the agent's `internal` on purpose
        // as `agent_error`).
        for code in [
            agent::NOT_FOUND,
            agent::EXISTS,
            agent::NO_SPACE,
            agent::BUSY,
        ] {
            assert_eq!(ErrorCode::from_agent(code).as_str(), code);
        }
    }
}
