// Generated from crates/api by `BELLJAR_WRITE_TS=1 cargo test -p belljar-api`. Do not edit.

export type ErrorBody = { error: ErrorDetail, };

export type ErrorDetail = { code: ErrorCode, message: string, };

export type ErrorCode = "bad_request" | "unauthorized" | "forbidden" | "not_found" | "sandbox_not_running" | "conflict" | "payload_too_large" | "insufficient_resources" | "image_not_available" | "backend_unavailable" | "agent_unavailable" | "agent_error" | "internal" | "not_an_image" | "build_failed" | "command_not_found" | "invalid_path" | "is_a_directory" | "not_a_directory" | "not_a_regular_file" | "exec_failed" | "unknown_user" | "exists" | "not_empty" | "command_finished" | "busy" | "permission_denied" | "file_too_large" | "no_space" | "try_again" | "snapshot_not_usable" | "not_supported" | "image_not_found" | "image_invalid" | "image_too_large" | "registry_denied" | "registry_unavailable" | "dockerfile_invalid" | "mount_denied" | "volume_not_found" | "volume_in_use" | "template_not_found";

export type SandboxStatus = "pending" | "running" | "paused" | "stopping" | "stopped" | "failed";

export type Backend = "microvm" | "namespace";

export type BackendChoice = "auto" | "microvm" | "namespace";

export type Source = { "type": "path", path: string, } | { "type": "git", url: string, revision?: string, } | { "type": "snapshot", snapshot_id: string, };

export type CreateSandbox = { 
/**
 * A template (`/v1/templates`) whose defaults apply to every field this request leaves
 * out; a sandbox its pool holds ready serves the create when the request asks for
 * nothing a pooled sandbox cannot take at claim.
 */
template?: string, 
/**
 * `base` (default), `python3.13`, `node24` or `node22`.
 */
image?: string, backend?: BackendChoice, 
/**
 * Default 2; at most 32.
 */
vcpus?: number, 
/**
 * Default 1024; 64 to 262144.
 */
memory_mib?: number, 
/**
 * Size of the writable layer. Default 4096; 64 to 1048576 (1 TiB).
 */
disk_mib?: number, 
/**
 * Milliseconds until the sandbox stops by itself. Default 5 minutes; at most the daemon's
 * maximum (24 hours by default).
 */
timeout_ms?: number, 
/**
 * Environment of every command, overridden per command: at most 256 names matching
 * `[A-Za-z_][A-Za-z0-9_]*`, values up to 32 KiB, 256 KiB in all.
 */
env?: { [key in string]: string }, 
/**
 * At most 50; keys 1 to 64 bytes without `=`, values up to 256 bytes.
 */
tags?: { [key in string]: string }, name?: string, source?: Source, 
/**
 * Default expiration of this sandbox's snapshots, ms after their last use; `0` never.
 */
snapshot_expiration_ms?: number, 
/**
 * How many of this sandbox's snapshots are kept.
 */
keep_last_snapshots?: KeepLastSnapshots, 
/**
 * The sandbox's firewall; `allow-all` when absent.
 */
network_policy?: NetworkPolicy, 
/**
 * Directory snapshots mounted at paths of the sandbox (namespace backend), at most 16.
 */
mounts?: Array<SnapshotMount>, 
/**
 * Host folders and named volumes mounted at paths of the sandbox, two-way and live
 * (namespace backend), at most 16. A host folder must be one the caller may read (and
 * write, unless `read_only`); over TCP, one under a root the daemon allows
 * (`belljard --allow-mount-root`).
 */
volumes?: Array<VolumeMount>, 
/**
 * Sandbox TCP ports exposed on 127.0.0.1 (each on a free host port).
 */
ports?: Array<number>, 
/**
 * Stopping (or timing out) snapshots the sandbox, and `start` resumes it from its latest
 * snapshot with the same id, name, tags and configuration. Default `false`.
 */
persistent?: boolean, 
/**
 * Pause after this many ms with no API use and no running command (Modal's
 * `idle_timeout`, Sandbox0's soft `ttl`).
 */
idle_timeout_ms?: number, 
/**
 * Delete the sandbox (and its own snapshots' hold) this many ms after it was created,
 * whatever its state (Sandbox0's `hard_ttl`).
 */
hard_ttl_ms?: number, 
/**
 * Any API use of the paused sandbox resumes it. Default `true`.
 */
auto_resume?: boolean, };

export type LimitsReport = { memory: LimitState, cpu: LimitState, pids: LimitState, 
/**
 * The sandbox's writable disk (`disk_mib`).
 */
disk: LimitState, };

export type LimitState = { enforced: boolean, 
/**
 * How it is enforced (`cgroup v2`, `cgroup v1`, `hypervisor`) or why it is not.
 */
detail: string, };

export type SandboxLifecycle = { 
/**
 * Stopping snapshots it, and `start` resumes it from its latest snapshot.
 */
persistent: boolean, 
/**
 * It pauses after this many ms with no API use and no running command.
 */
idle_timeout_ms?: number, 
/**
 * It is deleted this many ms after its creation.
 */
hard_ttl_ms?: number, 
/**
 * When the hard TTL deletes it.
 */
deletes_at?: number, 
/**
 * Any API use while it is paused resumes it.
 */
auto_resume: boolean, };

export type Sandbox = { 
/**
 * `sbx_` followed by lowercase letters and digits.
 */
id: string, name?: string, status: SandboxStatus, 
/**
 * Why the sandbox failed or stopped (`timeout`, `stopped by user`, an error message).
 */
status_reason?: string, image: string, 
/**
 * The id (`sha256:…`) of the user's image the sandbox stands on, fixed at create: the
 * name, pulled, imported or built again, may come to name another image; the sandbox
 * keeps this one. Absent for Belljar's own images.
 */
image_id?: string, 
/**
 * The template (`/v1/templates`) the sandbox was made from, when its create named one.
 */
template?: string, backend: Backend, 
/**
 * Why this backend was chosen, e.g. "KVM is software-based (PVM) here".
 */
backend_reason: string, vcpus: number, memory_mib: number, disk_mib: number, env: { [key in string]: string }, tags: { [key in string]: string }, source?: Source, created_at: number, started_at?: number, stopped_at?: number, 
/**
 * The sandbox's total allowed run time, extended by `extend`.
 */
timeout_ms: number, 
/**
 * When the sandbox will stop by itself, while it runs.
 */
expires_at?: number, limits: LimitsReport, 
/**
 * The sandbox's firewall (brokered header values redacted).
 */
network_policy?: NetworkPolicy, 
/**
 * The directory snapshots it mounts, in the order they were mounted (absent when none).
 */
mounts?: Array<SnapshotMount>, 
/**
 * The host folders and volumes it mounts (absent when none).
 */
volumes?: Array<VolumeMount>, 
/**
 * Stopping snapshots it, and `start` resumes it from its latest snapshot.
 */
persistent: boolean, 
/**
 * It pauses after this many ms with no API use and no running command.
 */
idle_timeout_ms?: number, 
/**
 * It is deleted this many ms after its creation.
 */
hard_ttl_ms?: number, 
/**
 * When the hard TTL deletes it.
 */
deletes_at?: number, 
/**
 * Any API use while it is paused resumes it.
 */
auto_resume: boolean, };

export type SandboxUsage = { 
/**
 * Memory in use, bytes: the sandbox's memory cgroup (its processes, their page cache and
 * its tmpfs files such as `/dev/shm`), or a microVM's resident memory on the host (the
 * guest RAM it has touched, and the VMM's own).
 */
memory_bytes: number | null, 
/**
 * The most memory in use at any time since the sandbox started, bytes (same measure).
 */
memory_peak_bytes: number | null, 
/**
 * The most memory the sandbox may use, bytes: its memory cgroup's limit, or a microVM's
 * guest RAM (the VMM's own few MiB come on top); `null` when nothing limits it.
 */
memory_limit_bytes: number | null, 
/**
 * CPU time used since the sandbox started, all CPUs together, microseconds.
 */
cpu_usec: number | null, 
/**
 * Processes (threads included) in the sandbox now; `null` on a microVM.
 */
pids: number | null, 
/**
 * Processes the kernel's OOM killer ended for want of the sandbox's memory; `null` on a
 * microVM, whose guest kernel kills on its own.
 */
oom_kills: number | null, 
/**
 * Forks refused because the sandbox was at its process limit; `null` on a microVM.
 */
pids_denied: number | null, 
/**
 * When these figures were read, Unix milliseconds.
 */
measured_at: number, };

export type ListSandboxesQuery = { 
/**
 * Only sandboxes in this status.
 */
status: SandboxStatus | null, 
/**
 * `key=value`; only sandboxes carrying this tag.
 */
tag: string | null, 
/**
 * Created at or after this time (Unix ms).
 */
since: number | null, 
/**
 * Created before this time (Unix ms).
 */
until: number | null, 
/**
 * Page size, 1..=200, default 50.
 */
limit: number | null, 
/**
 * `next_cursor` of the previous page.
 */
cursor: string | null, };

export type SandboxList = { sandboxes: Array<Sandbox>, next_cursor?: string, };

export type UpdateSandbox = { 
/**
 * Replaces all tags (the bounds of `CreateSandbox.tags`).
 */
tags?: { [key in string]: string }, name?: string, 
/**
 * Replaces the firewall whole, not merged into the old one (the same as `PUT
 * /v1/sandboxes/{id}/network/policy`); open flows it denies are cut at once.
 */
network_policy?: NetworkPolicy, };

export type ExtendSandbox = { 
/**
 * Milliseconds added to the timeout; must be positive.
 */
duration_ms: number, };

export type SnapshotStatus = "created" | "deleted" | "failed";

export type SnapshotMount = { 
/**
 * A created directory snapshot (one taken with `path`).
 */
snapshot_id: string, 
/**
 * Absolute path in the sandbox; not `/`, without `.` or `..`.
 */
path: string, };

export type SandboxMounts = { mounts: Array<SnapshotMount>, };

export type UnmountQuery = { 
/**
 * The exact path a snapshot was mounted at. The sandbox's writes under it are
 * discarded and what the path held before shows again.
 */
path: string, };

export type VolumeMount = { 
/**
 * An absolute host path (a host folder) or a volume's name (`[a-z0-9][a-z0-9_.-]*`).
 */
source: string, 
/**
 * Absolute path in the sandbox; not `/`, without `.` or `..`.
 */
path: string, 
/**
 * Mounted read-only (the kernel's read-only mount flag). Default `false`.
 */
read_only?: boolean, };

export type CreateVolume = { 
/**
 * 1 to 64 characters of `[a-z0-9_.-]`, starting with a letter or a digit.
 */
name: string, 
/**
 * A cap on what the volume holds, enforced by the kernel (writes past it fail with
 * ENOSPC); none when absent. 16 to 1048576 (1 TiB).
 */
size_mib?: number, };

export type Volume = { name: string, 
/**
 * Its cap, when it has one.
 */
size_mib?: number, created_at: number, 
/**
 * The sandboxes (ids) that mount it.
 */
used_by: Array<string>, };

export type VolumeList = { volumes: Array<Volume>, };

export type CreateTemplate = { 
/**
 * 1 to 64 characters of `[a-z0-9_.-]`, starting with a letter or a digit.
 */
name: string, 
/**
 * Any image the daemon has: Belljar's own, pulled, imported or built.
 */
image: string, backend?: BackendChoice, 
/**
 * 1 to 32; the daemon's default when absent.
 */
vcpus?: number, 
/**
 * 64 to 262144; the daemon's default when absent.
 */
memory_mib?: number, 
/**
 * 64 to 1048576; the daemon's default when absent.
 */
disk_mib?: number, 
/**
 * Milliseconds until a sandbox of the template stops by itself.
 */
timeout_ms?: number, 
/**
 * Environment of every command; a create's `env` adds to it and wins per name.
 */
env?: { [key in string]: string }, 
/**
 * The firewall of its sandboxes; a create's own policy replaces it.
 */
network_policy?: NetworkPolicy, 
/**
 * Sandboxes kept started ahead of demand, refilled in the background; 0 (the default)
 * keeps none. At most 64.
 */
pool?: number, };

export type Template = { name: string, image: string, backend?: BackendChoice, vcpus?: number, memory_mib?: number, disk_mib?: number, timeout_ms?: number, env: { [key in string]: string }, network_policy?: NetworkPolicy, 
/**
 * How many sandboxes its pool keeps ready (0: no pool).
 */
pool: number, 
/**
 * Pooled sandboxes ready to be claimed now.
 */
pool_ready: number, 
/**
 * Pooled sandboxes starting now (refills).
 */
pool_starting: number, created_at: number, };

export type TemplateList = { templates: Array<Template>, };

export type Snapshot = { 
/**
 * `snap_` followed by lowercase letters and digits.
 */
id: string, status: SnapshotStatus, 
/**
 * Why it failed, for a failed snapshot.
 */
status_reason?: string, 
/**
 * The sandbox it was taken of.
 */
source_sandbox_id: string, 
/**
 * The snapshot that sandbox was created from, if any: the previous point on the timeline.
 */
parent?: string, 
/**
 * The image below its layers.
 */
image: string, 
/**
 * The id (`sha256:…`) of that image when it is a user's: the one below the layers,
 * whatever the name has come to name since.
 */
image_id?: string, 
/**
 * Bytes of file content its own layer added (the layers below it are shared).
 */
size_bytes: number, 
/**
 * Layers a sandbox made from it stacks on the image, this snapshot's own included.
 */
depth: number, created_at: number, 
/**
 * When it expires (30 days after its last use by default); absent when it never does.
 */
expires_at?: number, 
/**
 * For a live snapshot (`keep_running`), how long the sandbox's processes were frozen, ms.
 */
frozen_ms?: number, 
/**
 * For a directory snapshot (Modal's `snapshot_directory`): the directory of the source
 * sandbox it holds. It is mounted into sandboxes (`mounts`), not started from.
 */
path?: string, };

export type CreateSnapshot = { 
/**
 * Keep the sandbox running: its processes are frozen while the layer is captured.
 * Default `false`: the sandbox stops and its writable layer becomes the snapshot.
 */
keep_running?: boolean, 
/**
 * Milliseconds the snapshot lives after its last use; `0` never expires. Default: the
 * sandbox's `snapshot_expiration_ms`, else 30 days.
 */
expiration_ms?: number, 
/**
 * Snapshot only this directory of the sandbox, as it looks now (Modal's
 * `snapshot_directory`); the sandbox keeps running. The snapshot holds the directory's
 * whole tree (not a change set) and is mounted into other sandboxes with `mounts`.
 */
path?: string, };

export type UpdateSnapshot = { 
/**
 * Milliseconds the snapshot lives from now (and after each later use); `0` never
 * expires.
 */
expiration_ms: number, };

export type KeepLastSnapshots = { 
/**
 * Keep the newest `count` (1 to 10) snapshots of the sandbox.
 */
count: number, 
/**
 * Expiration of the kept snapshots, ms; `0` never. Default: each keeps its own.
 */
expiration_ms?: number, 
/**
 * Delete the older ones at once (default `true`); else they stay, no longer counted,
 * with the expiration they would have without this rule: their own, or where
 * `expiration_ms` had replaced it, the sandbox's `snapshot_expiration_ms` (else 30 days)
 * from their eviction.
 */
delete_evicted?: boolean, };

export type ForkSandbox = { name?: string, 
/**
 * Replaces the source's tags.
 */
tags?: { [key in string]: string }, 
/**
 * Replaces the source's environment.
 */
env?: { [key in string]: string }, 
/**
 * Default: the source's timeout.
 */
timeout_ms?: number, };

export type ListSnapshotsQuery = { 
/**
 * Only snapshots taken of this sandbox.
 */
sandbox_id: string | null, 
/**
 * Only snapshots in this status; default: every status.
 */
status: SnapshotStatus | null, 
/**
 * Created at or after this time (Unix ms).
 */
since: number | null, 
/**
 * Created before this time (Unix ms).
 */
until: number | null, 
/**
 * Page size, 1..=200, default 50.
 */
limit: number | null, 
/**
 * `next_cursor` of the previous page.
 */
cursor: string | null, };

export type SnapshotList = { snapshots: Array<Snapshot>, next_cursor?: string, };

export type NetworkMode = "allow-all" | "deny-all";

export type NetworkPolicy = NetworkMode | NetworkRules;

export type NetworkRules = { allow?: DomainAllow, subnets?: Subnets, };

export type DomainAllow = Array<string> | { [key in string]: Array<DomainRule> };

export type DomainRule = { transform: Array<Transform>, };

export type Transform = { headers: { [key in string]: string }, };

export type Subnets = { allow: Array<string>, deny: Array<string>, };

export type Port = { port: number, host_port: number, 
/**
 * `http://127.0.0.1:<host_port>/`
 */
url: string, };

export type AddPort = { 
/**
 * The sandbox's TCP port, 1..=65535.
 */
port: number, 
/**
 * The host port on 127.0.0.1, 1024..=65535; a free one when absent.
 */
host_port?: number, };

export type PortList = { ports: Array<Port>, };

export type FlowProtocol = "tcp" | "udp" | "dns";

export type FlowVerdict = "allowed" | "denied";

export type NetworkFlow = { id: number, started_at: number, ended_at?: number, protocol: FlowProtocol, 
/**
 * The sandbox's end, `addr:port`.
 */
src: string, 
/**
 * The destination, `addr:port`.
 */
dst: string, 
/**
 * TLS SNI, HTTP `Host` or the DNS question.
 */
name?: string, verdict: FlowVerdict, 
/**
 * The rule that decided (`subnets.deny 10.0.0.0/8`).
 */
rule: string, 
/**
 * Bytes from the sandbox.
 */
bytes_out: number, 
/**
 * Bytes to the sandbox.
 */
bytes_in: number, };

export type FlowsQuery = { 
/**
 * Keep the stream open and send flows as they happen.
 */
follow: boolean | null, };

export type NetworkUsage = { 
/**
 * Bytes to the sandbox.
 */
ingress_bytes: number, 
/**
 * Bytes from the sandbox.
 */
egress_bytes: number, };

export type NetworkInfo = { policy: NetworkPolicy, ports: Array<Port>, usage: NetworkUsage, 
/**
 * Whether the sandbox's network is attached now (it is while the sandbox runs).
 */
attached: boolean, };

export type DiffQuery = { 
/**
 * A later snapshot (`snap_...`), or a sandbox (`sbx_...`) whose current files are
 * compared. Without it: what the snapshot changed on top of its parent (or its image).
 */
to: string | null, };

export type ChangeKind = "added" | "modified" | "deleted";

export type EntryKind = "file" | "dir" | "symlink" | "other";

export type DiffEntry = { kind: EntryKind, 
/**
 * Permission bits (`0o644` is 420).
 */
mode: number, uid: number, gid: number, 
/**
 * Bytes, for a file.
 */
size_bytes: number, 
/**
 * Its target, for a symlink.
 */
target?: string, };

export type FileChange = { 
/**
 * Absolute path in the sandbox.
 */
path: string, change: ChangeKind, 
/**
 * Before (absent for an added path).
 */
old?: DiffEntry, 
/**
 * After (absent for a deleted path).
 */
new?: DiffEntry, 
/**
 * For a text file (UTF-8, at most 256 KiB on both sides): its unified diff.
 */
unified_diff?: string, };

export type SnapshotDiff = { 
/**
 * The earlier point: a snapshot, or `image:<name>` for a snapshot without a parent.
 */
from: string, 
/**
 * The later point: a snapshot or a sandbox.
 */
to: string, changes: Array<FileChange>, 
/**
 * More than [`MAX_DIFF_CHANGES`] paths changed; the list stops there.
 */
truncated: boolean, };

export type PtySize = { rows: number, cols: number, };

export type RunCommand = { 
/**
 * Program and arguments. Must not be empty; at most 4096 arguments of up to 32 KiB,
 * 256 KiB in all.
 */
argv: Array<string>, 
/**
 * Default `/workspace`.
 */
cwd?: string, 
/**
 * Merged over the sandbox's env (the bounds of `CreateSandbox.env`).
 */
env?: { [key in string]: string }, 
/**
 * Run as root instead of `belljar`.
 */
sudo: boolean, 
/**
 * Return at once with the running command instead of waiting for it to exit.
 */
detached: boolean, 
/**
 * Run on a pseudo-terminal of this size.
 */
pty?: PtySize, 
/**
 * Keep stdin open for `POST .../stdin`.
 */
stdin: boolean, };

export type CommandStatus = "pending" | "running" | "exited" | "lost";

export type Command = { 
/**
 * `cmd_` followed by lowercase letters and digits.
 */
id: string, sandbox_id: string, argv: Array<string>, cwd: string, user: string, pty: boolean, status: CommandStatus, exit_code?: number, 
/**
 * The signal that killed it.
 */
signal?: number, started_at: number, finished_at?: number, 
/**
 * Why a `lost` command is lost, when the daemon knows.
 */
status_reason?: string, 
/**
 * Output bytes the sandbox dropped because the command printed more than it keeps
 * (64 MiB by default); the logs hold the rest. 0 when nothing was dropped.
 */
output_truncated_bytes: number, };

export type CommandList = { commands: Array<Command>, };

export type Stream = "stdout" | "stderr";

export type LogLine = { stream: Stream, data?: string, data_base64?: string, ts: number, };

export type KillCommand = { 
/**
 * A number or a name (`TERM`, `SIGKILL`); default `TERM`.
 */
signal?: string, };

export type TerminalMessage = { "type": "resize", rows: number, cols: number, } | { "type": "started", command_id: string, } | { "type": "exit", exit_code?: number, signal?: number, } | { "type": "error", code: ErrorCode, message: string, };

export type FileKind = "file" | "directory" | "symlink" | "other";

export type FileEntry = { name: string, 
/**
 * Absolute path inside the sandbox.
 */
path: string, kind: FileKind, size: number, 
/**
 * Permission bits, e.g. 420 (0o644).
 */
mode: number, mtime: number, link_target?: string, };

export type FileList = { path: string, entries: Array<FileEntry>, 
/**
 * Opaque; absent on the last page.
 */
next_cursor?: string, };

export type MkdirRequest = { path: string, };

export type MoveRequest = { from: string, to: string, overwrite: boolean, };

export type WatchKind = "create" | "modify" | "remove" | "rename";

export type WatchEvent = { kind: WatchKind, path: string, to?: string, is_dir: boolean, ts: number, };

export type Event = { "type": "sandbox", seq: number, ts: number, sandbox: Sandbox, } | { "type": "sandbox_deleted", seq: number, ts: number, sandbox_id: string, } | { "type": "snapshot", seq: number, ts: number, snapshot: Snapshot, } | { "type": "command", seq: number, ts: number, command: Command, };

export type BackendInfo = { backend: Backend, available: boolean, reason: string, };

export type Info = { version: string, 
/**
 * The backend `auto` resolves to on this host.
 */
default_backend: Backend, 
/**
 * Why, e.g. "KVM is software-based (PVM) here: guest kernels would run emulated".
 */
default_backend_reason: string, backends: Array<BackendInfo>, images: Array<Image>, 
/**
 * Host memory available to new sandboxes, MiB.
 */
free_memory_mib: number, 
/**
 * The warm pool (`belljard --pool`), one entry per configured image; empty when off.
 */
pool: Array<PoolInfo>, };

export type PoolInfo = { image: string, 
/**
 * How many the daemon keeps ready.
 */
configured: number, 
/**
 * How many are ready now.
 */
ready: number, 
/**
 * How many are starting now (refills).
 */
starting: number, };

export type SessionToken = { token: string, };

export type ImageStatus = "ready" | "missing" | "building";

export type Image = { 
/**
 * `base`, `python3.13`, `node24`, `node22`.
 */
name: string, status: ImageStatus, digest?: string, size_bytes?: number, built_at?: number, 
/**
 * What a sandbox of the image runs when `belljar run IMAGE` names no command: a pulled
 * or imported image's `Entrypoint` followed by its `Cmd`.
 */
command?: Array<string>, 
/**
 * Bytes of its files that other images hold too (layers they share, and what a
 * Dockerfile build took from one of Belljar's own images), for a user's image.
 */
shared_bytes?: number, 
/**
 * When a sandbox was last made from it (ms since the epoch), for a user's image.
 */
last_used_at?: number, 
/**
 * Where a user's image came from: `pull REF`, `import FILE` or `build`.
 */
source?: string, 
/**
 * What stands on it, in `GET /v1/images`.
 */
used_by?: ImageUsers, };

export type ImageUsers = { 
/**
 * The sandboxes' ids.
 */
sandboxes: Array<string>, 
/**
 * The usable snapshots' ids.
 */
snapshots: Array<string>, 
/**
 * The templates' names.
 */
templates: Array<string>, };

export type ImageBuildEvent = { "type": "progress", message: string, } | { "type": "step", step: number, steps: number, instruction: string, cached: boolean, } | { "type": "done", image: Image, } | { "type": "error", code: ErrorCode, message: string, };

export type PullImage = { 
/**
 * `[registry/]repository[:tag][@sha256:…]`. A reference without a registry is pulled
 * from the daemon's default registry (`BELLJAR_DEFAULT_REGISTRY`), else refused.
 */
reference: string, 
/**
 * Speak plain HTTP to this registry although it is not on loopback (Docker's
 * `--insecure-registry`).
 */
insecure?: boolean, };

export type PruneImages = { 
/**
 * Also every named image of yours that nothing stands on.
 */
all?: boolean, 
/**
 * Also the Dockerfile step cache (its steps' unnamed images).
 */
build_cache?: boolean, };

export type PrunedImages = { 
/**
 * The removed images' ids (`sha256:…`), with the names they had.
 */
removed: Array<PrunedImage>, 
/**
 * Bytes of file data they held.
 */
reclaimed_bytes: number, };

export type PrunedImage = { id: string, names: Array<string>, 
/**
 * Whether it was a step of the Dockerfile step cache.
 */
build_step: boolean, size_bytes: number, };

export type ImportQuery = { 
/**
 * A name (`[registry/]repository[:tag]`) for the imported image.
 */
tag?: string, };

export type BuildQuery = { 
/**
 * The name the built image gets (`[registry/]repository[:tag]`).
 */
tag: string, 
/**
 * The Dockerfile's path in the context; default `Dockerfile`.
 */
dockerfile?: string, 
/**
 * The build arguments, as a JSON object of strings (`{"VERSION":"1.2"}`), as Docker's
 * `buildargs`.
 */
build_args?: string, 
/**
 * Run every step again instead of taking it from the step cache.
 */
no_cache?: boolean, };

export type DoctorStatus = "ok" | "warning" | "problem";

export type DoctorFinding = { 
/**
 * Stable name of the check: `kvm`, `cgroup`, `subids`, `overlayfs`, `network`, `disk`,
 * `daemon`.
 */
check: string, status: DoctorStatus, 
/**
 * What was found, one sentence for people.
 */
found: string, 
/**
 * The one command that fixes it, when there is one.
 */
fix: string | null, 
/**
 * The same findings as data, for scripts (each check's own fields).
 */
facts: Record<string, unknown>, };

export type DoctorReport = { 
/**
 * No finding is a [`DoctorStatus::Problem`].
 */
ok: boolean, findings: Array<DoctorFinding>, };
