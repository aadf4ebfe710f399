//! The one error type of the agent's API: every failure a route can meet, each with the stable
//! code from `belljar_agent_proto::codes` and an HTTP status, so handlers stay thin.

use std::io;

use belljar_agent_proto::codes;
use http::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request is malformed.
    #[error("Bad request: {0}")]
    BadRequest(String),
    /// The path does not exist.
    #[error("Not found: {0}")]
    NotFound(String),
    /// A path component is not a directory.
    #[error("Not a directory: {0}")]
    NotADirectory(String),
    /// The path is a directory where a file is needed.
    #[error("Is a directory: {0}")]
    IsADirectory(String),
    /// The user may not do this.
    #[error("Permission denied: {0}")]
    PermissionDenied(String),
    /// The path already exists.
    #[error("Already exists: {0}")]
    Exists(String),
    /// The directory is not empty.
    #[error("Directory not empty: {0}")]
    NotEmpty(String),
    /// The filesystem is full.
    #[error("No space left: {0}")]
    NoSpace(String),
    /// The path is not absolute or not valid.
    #[error("Invalid path: {0}")]
    InvalidPath(String),
    /// No command has this id.
    #[error("No such command: {0}")]
    CommandNotFound(String),
    /// The command has already exited.
    #[error("Command already finished: {0}")]
    CommandFinished(String),
    /// The program could not be started.
    #[error("Cannot execute {program}: {reason}")]
    ExecFailed { program: String, reason: String },
    /// A start from another daemon than the last listing's (see `StartCommand::epoch`).
    #[error("Start refused: epoch {epoch} is not the fenced {fence}")]
    StaleStart { epoch: u64, fence: u64 },
    /// No such user in /etc/passwd.
    #[error("Unknown user: {0}")]
    UnknownUser(String),
    /// A FIFO, socket or device where a regular file is needed.
    #[error("Not a regular file: {0}")]
    NotARegularFile(String),
    /// The file or mount is in use.
    #[error("Busy: {0}")]
    Busy(String),
    /// The file would grow past the filesystem's largest file.
    #[error("File too large: {0}")]
    FileTooLarge(String),
    /// Out of file descriptors or memory for now.
    #[error("Out of resources, try again: {0}")]
    TryAgain(String),
    /// Anything else; the message is for logs and humans.
    #[error("Internal error: {0}")]
    Internal(String),
}

impl AgentError {
    /// The stable code sent to the daemon.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::BadRequest(_) => codes::BAD_REQUEST,
            AgentError::NotFound(_) => codes::NOT_FOUND,
            AgentError::NotADirectory(_) => codes::NOT_A_DIRECTORY,
            AgentError::IsADirectory(_) => codes::IS_A_DIRECTORY,
            AgentError::PermissionDenied(_) => codes::PERMISSION_DENIED,
            AgentError::Exists(_) => codes::EXISTS,
            AgentError::NotEmpty(_) => codes::NOT_EMPTY,
            AgentError::NoSpace(_) => codes::NO_SPACE,
            AgentError::InvalidPath(_) => codes::INVALID_PATH,
            AgentError::CommandNotFound(_) => codes::COMMAND_NOT_FOUND,
            AgentError::CommandFinished(_) => codes::COMMAND_FINISHED,
            AgentError::ExecFailed { .. } => codes::EXEC_FAILED,
            AgentError::UnknownUser(_) => codes::UNKNOWN_USER,
            AgentError::StaleStart { .. } => codes::STALE_START,
            AgentError::NotARegularFile(_) => codes::NOT_A_REGULAR_FILE,
            AgentError::Busy(_) => codes::BUSY,
            AgentError::FileTooLarge(_) => codes::FILE_TOO_LARGE,
            AgentError::TryAgain(_) => codes::TRY_AGAIN,
            AgentError::Internal(_) => codes::INTERNAL,
        }
    }

    /// The HTTP status that goes with the code.
    pub fn status(&self) -> StatusCode {
        match self {
            AgentError::BadRequest(_)
            | AgentError::InvalidPath(_)
            | AgentError::ExecFailed { .. }
            | AgentError::UnknownUser(_)
            | AgentError::NotADirectory(_)
            | AgentError::IsADirectory(_)
            | AgentError::NotARegularFile(_) => StatusCode::BAD_REQUEST,
            AgentError::NotFound(_) | AgentError::CommandNotFound(_) => StatusCode::NOT_FOUND,
            AgentError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            AgentError::Exists(_)
            | AgentError::NotEmpty(_)
            | AgentError::CommandFinished(_)
            | AgentError::StaleStart { .. }
            | AgentError::Busy(_) => StatusCode::CONFLICT,
            AgentError::FileTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            AgentError::TryAgain(_) => StatusCode::SERVICE_UNAVAILABLE,
            AgentError::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            AgentError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Maps an I/O error on `path` to the code a client can act on.
    pub fn io(err: io::Error, path: &str) -> Self {
        let what = path.to_owned();
        match err.raw_os_error() {
            Some(libc::ENOENT) => return AgentError::NotFound(what),
            Some(libc::ENOTDIR) => return AgentError::NotADirectory(what),
            Some(libc::EISDIR) => return AgentError::IsADirectory(what),
            Some(libc::EACCES | libc::EPERM | libc::EROFS) => {
                return AgentError::PermissionDenied(what);
            }
            Some(libc::EEXIST) => return AgentError::Exists(what),
            Some(libc::ENOTEMPTY) => return AgentError::NotEmpty(what),
            Some(libc::ENOSPC | libc::EDQUOT) => return AgentError::NoSpace(what),
            // EINVAL from the calls files.rs makes is a path problem: renaming a directory into
            // itself, or a name the filesystem does not accept.
            Some(libc::ENAMETOOLONG | libc::ELOOP | libc::EINVAL) => {
                return AgentError::InvalidPath(what);
            }
            Some(libc::EBUSY | libc::ETXTBSY) => return AgentError::Busy(what),
            Some(libc::EMLINK) => return AgentError::NoSpace(what),
            Some(libc::EFBIG) => return AgentError::FileTooLarge(what),
            Some(libc::ENXIO | libc::ENODEV) => return AgentError::NotARegularFile(what),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN) => {
                return AgentError::TryAgain(what);
            }
            _ => {}
        }
        match err.kind() {
            io::ErrorKind::NotFound => AgentError::NotFound(what),
            io::ErrorKind::PermissionDenied => AgentError::PermissionDenied(what),
            io::ErrorKind::AlreadyExists => AgentError::Exists(what),
            _ => AgentError::Internal(format!("{path}: {err}")),
        }
    }
}

impl From<crate::users::UsersError> for AgentError {
    fn from(err: crate::users::UsersError) -> Self {
        match err {
            crate::users::UsersError::Unknown(name) => AgentError::UnknownUser(name),
            other => AgentError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_stable_codes() {
        let cases = [
            (libc::ENOENT, codes::NOT_FOUND),
            (libc::ENOTDIR, codes::NOT_A_DIRECTORY),
            (libc::EISDIR, codes::IS_A_DIRECTORY),
            (libc::EACCES, codes::PERMISSION_DENIED),
            (libc::EEXIST, codes::EXISTS),
            (libc::ENOTEMPTY, codes::NOT_EMPTY),
            (libc::ENOSPC, codes::NO_SPACE),
            (libc::EBUSY, codes::BUSY),
            (libc::ETXTBSY, codes::BUSY),
            (libc::EINVAL, codes::INVALID_PATH),
            (libc::EFBIG, codes::FILE_TOO_LARGE),
            (libc::ENXIO, codes::NOT_A_REGULAR_FILE),
            (libc::EMFILE, codes::TRY_AGAIN),
            (libc::EIO, codes::INTERNAL),
        ];
        for (errno, code) in cases {
            let err = AgentError::io(io::Error::from_raw_os_error(errno), "/x");
            assert_eq!(err.code(), code, "errno {errno}");
        }
        assert_eq!(
            AgentError::NotFound("/x".into()).status(),
            StatusCode::NOT_FOUND
        );
    }
}
