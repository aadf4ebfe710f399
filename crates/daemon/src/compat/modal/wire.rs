//! The messages of Modal's control-plane service (`modal.client.ModalClient`) that the layer
//! serves, written for Belljar: only the fields it reads or answers, with the field numbers and
//! types of the client's wire format. A field the client sends and this file leaves out is
//! skipped by the decoder, as protobuf skips any unknown field.
//!
//! Enumerations travel as their numbers (`int32`), which is how protobuf encodes them; the
//! values the layer uses are the constants below.

use std::collections::HashMap;

/// `google.protobuf.Empty`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientHelloResponse {
    #[prost(string, tag = "1")]
    pub warning: String,
    #[prost(string, tag = "2")]
    pub image_builder_version: String,
}

/// `GenericResult.GenericStatus`.
pub mod status {
    pub const SUCCESS: i32 = 1;
    pub const FAILURE: i32 = 2;
    pub const TERMINATED: i32 = 3;
    pub const TIMEOUT: i32 = 4;
}

/// How an object, a build or a sandbox ended.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenericResult {
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(string, tag = "2")]
    pub exception: String,
    #[prost(int32, tag = "3")]
    pub exitcode: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub app_name: String,
    #[prost(string, tag = "2")]
    pub environment_name: String,
    #[prost(int32, tag = "3")]
    pub object_creation_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub app_id: String,
    #[prost(message, optional, tag = "2")]
    pub handle_metadata: Option<AppHandleMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppHandleMetadata {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub app_id: String,
    #[prost(string, tag = "3")]
    pub environment_name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EnvironmentGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub deployment_name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EnvironmentGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub environment_id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<EnvironmentMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EnvironmentMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub settings: Option<EnvironmentSettings>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EnvironmentSettings {
    #[prost(string, tag = "1")]
    pub image_builder_version: String,
    #[prost(string, tag = "2")]
    pub webhook_suffix: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub deployment_name: String,
    #[prost(string, tag = "3")]
    pub environment_name: String,
    #[prost(int32, tag = "4")]
    pub object_creation_type: i32,
    #[prost(map = "string, string", tag = "5")]
    pub env_dict: HashMap<String, String>,
    /// Keys a named secret must have.
    #[prost(string, repeated, tag = "7")]
    pub required_keys: Vec<String>,
}

/// `ObjectCreationType`: how a get-or-create request treats a name.
pub mod creation {
    /// Look the name up only.
    pub const LOOKUP: i32 = 0;
    pub const CREATE_IF_MISSING: i32 = 1;
    pub const CREATE_FAIL_IF_EXISTS: i32 = 2;
    pub const CREATE_OVERWRITE_IF_EXISTS: i32 = 3;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretDeleteRequest {
    #[prost(string, tag = "1")]
    pub secret_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub secret_id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SecretMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "3")]
    pub keys: Vec<String>,
}

/// One layer of an image: Dockerfile commands over the images it names.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(message, repeated, tag = "5")]
    pub base_images: Vec<BaseImage>,
    #[prost(string, repeated, tag = "6")]
    pub dockerfile_commands: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub context_files: Vec<ImageContextFile>,
    #[prost(string, repeated, tag = "12")]
    pub secret_ids: Vec<String>,
    #[prost(string, tag = "14")]
    pub build_function_def: String,
    #[prost(string, tag = "15")]
    pub context_mount_id: String,
    /// `Image.run_function`'s function; only whether there is one is read.
    #[prost(message, optional, tag = "21")]
    pub build_function: Option<Empty>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BaseImage {
    #[prost(string, tag = "1")]
    pub image_id: String,
    #[prost(string, tag = "2")]
    pub docker_tag: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageContextFile {
    #[prost(string, tag = "1")]
    pub filename: String,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageGetOrCreateRequest {
    #[prost(message, optional, tag = "2")]
    pub image: Option<Image>,
    #[prost(string, tag = "4")]
    pub app_id: String,
    #[prost(bool, tag = "7")]
    pub force_build: bool,
    #[prost(string, tag = "9")]
    pub builder_version: String,
    #[prost(bool, tag = "11")]
    pub ignore_cache: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub image_id: String,
    #[prost(message, optional, tag = "2")]
    pub result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageJoinStreamingRequest {
    #[prost(string, tag = "1")]
    pub image_id: String,
    /// Seconds to hold the stream open for.
    #[prost(float, tag = "2")]
    pub timeout: f32,
    /// Where the previous answer stopped: the layer's entry ids are log line indexes.
    #[prost(string, tag = "3")]
    pub last_entry_id: String,
}

/// Build log lines, and the result in the last message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageJoinStreamingResponse {
    #[prost(message, optional, tag = "1")]
    pub result: Option<GenericResult>,
    #[prost(message, repeated, tag = "2")]
    pub task_logs: Vec<TaskLogs>,
    #[prost(string, tag = "3")]
    pub entry_id: String,
    #[prost(bool, tag = "4")]
    pub eof: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFromIdRequest {
    #[prost(string, tag = "1")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFromIdResponse {
    #[prost(string, tag = "1")]
    pub image_id: String,
}

/// `NetworkAccess.NetworkAccessType`.
pub mod network_access {
    pub const BLOCKED: i32 = 2;
    pub const ALLOWLIST: i32 = 3;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NetworkAccess {
    #[prost(int32, tag = "1")]
    pub network_access_type: i32,
    #[prost(string, repeated, tag = "2")]
    pub allowed_cidrs: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub allowed_domains: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Resources {
    #[prost(uint32, tag = "2")]
    pub memory_mb: u32,
    #[prost(uint32, tag = "3")]
    pub milli_cpu: u32,
}

/// What a sandbox runs and with what: the definition `Sandbox.create` sends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxDefinition {
    #[prost(string, repeated, tag = "1")]
    pub entrypoint_args: Vec<String>,
    #[prost(string, tag = "3")]
    pub image_id: String,
    #[prost(string, repeated, tag = "4")]
    pub secret_ids: Vec<String>,
    #[prost(message, optional, tag = "5")]
    pub resources: Option<Resources>,
    #[prost(uint32, tag = "7")]
    pub timeout_secs: u32,
    #[prost(string, optional, tag = "8")]
    pub workdir: Option<String>,
    #[prost(bool, tag = "11")]
    pub block_network: bool,
    #[prost(message, repeated, tag = "13")]
    pub volume_mounts: Vec<VolumeMount>,
    #[prost(message, optional, tag = "22")]
    pub network_access: Option<NetworkAccess>,
    #[prost(string, optional, tag = "30")]
    pub name: Option<String>,
}

/// A volume a sandbox mounts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeMount {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub mount_path: String,
    #[prost(bool, tag = "4")]
    pub read_only: bool,
    #[prost(string, tag = "5")]
    pub sub_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub deployment_name: String,
    #[prost(string, tag = "3")]
    pub environment_name: String,
    #[prost(int32, tag = "4")]
    pub object_creation_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// `VolumeFsVersion`.
    #[prost(int32, tag = "2")]
    pub version: i32,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<VolumeMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeMetadata {
    #[prost(int32, tag = "1")]
    pub version: i32,
    #[prost(string, tag = "2")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTag {
    #[prost(string, tag = "1")]
    pub tag_name: String,
    #[prost(string, tag = "2")]
    pub tag_value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTagsSetRequest {
    #[prost(string, tag = "2")]
    pub sandbox_id: String,
    #[prost(message, repeated, tag = "3")]
    pub tags: Vec<SandboxTag>,
}

/// The request of `SandboxTagsGet`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTagsGetRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTagsGetResponse {
    #[prost(message, repeated, tag = "1")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetFromNameRequest {
    #[prost(string, tag = "1")]
    pub sandbox_name: String,
    #[prost(string, tag = "2")]
    pub environment_name: String,
    #[prost(string, tag = "3")]
    pub app_name: String,
    #[prost(bool, tag = "4")]
    pub include_terminated: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetFromNameResponse {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SandboxHandleMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxListRequest {
    #[prost(string, tag = "1")]
    pub app_id: String,
    /// Seconds since the epoch; only sandboxes created before it (the next page).
    #[prost(double, tag = "2")]
    pub before_timestamp: f64,
    #[prost(bool, tag = "4")]
    pub include_finished: bool,
    #[prost(message, repeated, tag = "5")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxListResponse {
    #[prost(message, repeated, tag = "1")]
    pub sandboxes: Vec<SandboxInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    /// Seconds since the epoch.
    #[prost(double, tag = "3")]
    pub created_at: f64,
    #[prost(message, optional, tag = "4")]
    pub task_info: Option<TaskInfo>,
    #[prost(string, tag = "5")]
    pub app_id: String,
    #[prost(message, repeated, tag = "6")]
    pub tags: Vec<SandboxTag>,
    #[prost(message, optional, tag = "16")]
    pub metadata: Option<SandboxHandleMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "4")]
    pub result: Option<GenericResult>,
    #[prost(string, tag = "7")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxCreateRequest {
    #[prost(string, tag = "1")]
    pub app_id: String,
    #[prost(message, optional, tag = "2")]
    pub definition: Option<SandboxDefinition>,
    #[prost(message, repeated, tag = "4")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxHandleMetadata {
    #[prost(message, optional, tag = "1")]
    pub result: Option<GenericResult>,
    #[prost(string, tag = "2")]
    pub app_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxCreateResponse {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SandboxHandleMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetTaskIdRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetTaskIdResponse {
    #[prost(string, optional, tag = "1")]
    pub task_id: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub task_result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxWaitRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    /// Seconds to wait for the end; `0` answers at once.
    #[prost(float, tag = "2")]
    pub timeout: f32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxWaitResponse {
    #[prost(message, optional, tag = "1")]
    pub result: Option<GenericResult>,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SandboxHandleMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTerminateRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTerminateResponse {
    #[prost(message, optional, tag = "1")]
    pub existing_result: Option<GenericResult>,
}

/// `FileDescriptor`.
pub mod fd {
    pub const STDOUT: i32 = 1;
    pub const STDERR: i32 = 2;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetLogsRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(int32, tag = "2")]
    pub file_descriptor: i32,
    #[prost(float, tag = "3")]
    pub timeout: f32,
    /// Where the previous answer stopped: the layer's entry ids are byte offsets.
    #[prost(string, tag = "4")]
    pub last_entry_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskLogs {
    #[prost(string, tag = "1")]
    pub data: String,
    #[prost(int32, tag = "8")]
    pub file_descriptor: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskLogsBatch {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<TaskLogs>,
    #[prost(string, tag = "5")]
    pub entry_id: String,
    #[prost(bool, tag = "14")]
    pub eof: bool,
    #[prost(string, tag = "18")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxStdinWriteRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(bytes = "vec", tag = "2")]
    pub input: Vec<u8>,
    /// 1 for the first write, one more for each next: a repeated index is a retry.
    #[prost(uint32, tag = "3")]
    pub index: u32,
    #[prost(bool, tag = "4")]
    pub eof: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskGetCommandRouterAccessRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskGetCommandRouterAccessResponse {
    #[prost(string, tag = "1")]
    pub jwt: String,
    #[prost(string, tag = "2")]
    pub url: String,
}

/// Where an exec's environment comes from: a secret by id, or the variables themselves.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretSource {
    #[prost(string, optional, tag = "1")]
    pub secret_id: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub env: Option<StringMap>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StringMap {
    #[prost(map = "string, string", tag = "1")]
    pub contents: HashMap<String, String>,
}

// The task command router (`modal.task_command_router.TaskCommandRouter`), through which the
// client runs commands in a sandbox's container.

/// `TaskExecStdioFileDescriptor`.
pub mod exec_fd {
    pub const STDERR: i32 = 1;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStartRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    /// The client's own id for the command (a UUID), also its idempotency key.
    #[prost(string, tag = "2")]
    pub exec_id: String,
    #[prost(string, repeated, tag = "3")]
    pub command_args: Vec<String>,
    #[prost(uint32, optional, tag = "6")]
    pub timeout_secs: Option<u32>,
    #[prost(string, optional, tag = "7")]
    pub workdir: Option<String>,
    #[prost(string, repeated, tag = "8")]
    pub secret_ids: Vec<String>,
    /// Present when the command wants a PTY.
    #[prost(message, optional, tag = "9")]
    pub pty_info: Option<Empty>,
    #[prost(map = "string, string", tag = "12")]
    pub env: HashMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub secret_sources: Vec<SecretSource>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdioReadRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
    /// Bytes of this stream the client already has.
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(int32, tag = "4")]
    pub file_descriptor: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdioReadResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdinWriteRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
    /// Where `data` starts in the command's stdin: a retried write repeats an offset.
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
    #[prost(bool, tag = "5")]
    pub eof: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskReloadVolumesRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
}

/// The request of `TaskExecPoll` and `TaskExecWait`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
}

/// The answer of `TaskExecPoll` and `TaskExecWait`: the exit code or the signal (a oneof on
/// the wire: at most one is set), neither while the command runs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecExit {
    #[prost(int32, optional, tag = "1")]
    pub code: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub signal: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn fields_are_on_the_clients_numbers() {
        // SandboxWaitRequest{sandbox_id: "sb", timeout: 1.0}: tag 1 length-delimited, tag 2
        // fixed32.
        let bytes = SandboxWaitRequest {
            sandbox_id: "sb".into(),
            timeout: 1.0,
        }
        .encode_to_vec();
        assert_eq!(bytes, [0x0a, 2, b's', b'b', 0x15, 0, 0, 0x80, 0x3f]);
        // An unknown field (tag 99) is skipped.
        let mut more = bytes.clone();
        more.extend_from_slice(&[0x98, 0x06, 1]);
        assert_eq!(
            SandboxWaitRequest::decode(more.as_slice())
                .unwrap()
                .sandbox_id,
            "sb"
        );
    }
}
