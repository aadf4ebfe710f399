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

// Tauri sets TAURI_ENV_PLATFORM for its before-build command, and TAURI_ENV_DEBUG=true only for
// a debug build; a release app (the .deb) bundles a release belljard, building it if needed. Run
// on its own (`npm run sidecar`, before the debug crate's clippy and tests) it is a debug build.
const release = Boolean(process.env.TAURI_ENV_PLATFORM) && process.env.TAURI_ENV_DEBUG !== "true";
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

// A release build is what the .deb packages (tauri.conf.json's `bundle.linux.deb.files`): the
// CLI and the VMM beside the app in /usr/bin, and the static guest agent with the image recipes
// in /usr/lib/belljar, so an installed app builds its images without the source tree. They are
// staged in src-tauri/binaries/deb, each built here when missing (the agent the way
// guest-images/build-all.sh builds it).
if (release) {
  const staged = join(repo, "src-tauri/binaries/deb");
  mkdirSync(staged, { recursive: true });
  const agentTriple = "x86_64-unknown-linux-gnu";
  const parts = [
    { name: "belljar", path: join(target, "release/belljar"), build: ["-p", "belljar-cli", "--bin", "belljar"] },
    { name: "belljar-vmm", path: join(target, "release/belljar-vmm"), build: ["-p", "belljar-vmm", "--bin", "belljar-vmm"] },
    {
      name: "belljar-agent",
      path: join(target, agentTriple, "release/belljar-agent"),
      build: ["-p", "belljar-agent", "--target", agentTriple],
      env: { RUSTFLAGS: "-C target-feature=+crt-static" },
    },
  ];
  for (const part of parts) {
    const from = process.env[`BELLJAR_DEB_${part.name.replace(/-/g, "_").toUpperCase()}`] || part.path;
    if (!existsSync(from)) {
      console.error(`copy-sidecar: building ${part.name}`);
      execFileSync("cargo", ["build", "--release", ...part.build], {
        cwd: repo,
        stdio: "inherit",
        env: { ...process.env, ...(part.env || {}) },
      });
    }
    const to = join(staged, part.name);
    if (!same(from, to)) {
      copyFileSync(from, to);
      chmodSync(to, 0o755);
      console.error(`copy-sidecar: ${from} -> ${to}`);
    }
  }
}
