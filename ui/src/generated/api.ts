// The API's wire types are generated once, into the TypeScript SDK
// (sdk/typescript/src/generated/api.ts, from crates/api); the UI uses that same file.
export type * from "../../../sdk/typescript/src/generated/api";
