// Copies the built belljard into src-tauri/binaries/belljard-<target triple>, where Tauri's
// `externalBin` expects the sidecar, before a `tauri build`. Builds belljard first if it is not
// there. BELLJARD_BIN names a binary to use instead; CARGO_TARGET_DIR is honoured. A copy that
// is already the same bytes is left alone: tauri-build watches the file, and a new modification
// time alone would rebuild the app crate on every run of CI's clippy and test steps.
import { execFileSync } from "node:child_process";
import { copyFileSync, chmodSync, existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const target = process.env.CARGO_TARGET_DIR || join(repo, "target");
const triple = /host: (\S+)/.exec(execFileSync("rustc", ["-vV"], { encoding: "utf8" }))[1];

function newest(paths) {
  const found = paths.filter((p) => existsSync(p));
  return found.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
}

// Tauri tells its before-build command whether this is a debug build; a release app (the .deb)
// bundles a release belljard, building it if needed.
const release = process.env.TAURI_ENV_DEBUG === "false";
let src = process.env.BELLJARD_BIN;
if (!src && release) src = newest([join(target, "release/belljard")]);
if (!src && !release) src = newest([join(target, "debug/belljard")]);
if (!src) {
  const args = ["build", "-p", "belljard", "--bin", "belljard", ...(release ? ["--release"] : [])];
  console.error(`copy-sidecar: building belljard (cargo ${args.join(" ")})`);
  execFileSync("cargo", args, { cwd: repo, stdio: "inherit" });
  src = join(target, release ? "release/belljard" : "debug/belljard");
}
const dest = join(repo, "src-tauri/binaries", `belljard-${triple}`);
function same(a, b) {
  if (!existsSync(b) || statSync(a).size !== statSync(b).size) return false;
  return readFileSync(a).equals(readFileSync(b));
}

mkdirSync(dirname(dest), { recursive: true });
if (same(src, dest)) {
  console.error(`copy-sidecar: ${dest} is already ${src}`);
} else {
  copyFileSync(src, dest);
  chmodSync(dest, 0o755);
  console.error(`copy-sidecar: ${src} -> ${dest}`);
}
