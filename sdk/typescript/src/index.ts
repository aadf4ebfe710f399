// @belljar/sdk: local, disposable Linux sandboxes from TypeScript, through belljard's API.
// Wire types are generated from the Rust API crate (src/generated/api.ts).

export { Sandbox, Snapshots } from "./sandbox.js";
export type { CreateOptions, RunOptions, Signalled } from "./sandbox.js";
export { Command, CommandFinished } from "./command.js";
export type { LogChunk } from "./command.js";
export { Client } from "./client.js";
export type { ImageOptions } from "./client.js";
export { Files } from "./files.js";
export { Network } from "./network.js";
export { Terminal } from "./terminal.js";
export type { TerminalExit, TerminalOptions } from "./terminal.js";
export { BelljarError, Transport } from "./transport.js";
export type { ConnectionOptions } from "./transport.js";
export { toSandboxSession } from "./ai.js";
export type { SessionOptions } from "./ai.js";
export type * from "./generated/api.js";
