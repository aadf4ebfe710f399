// The installed desktop app run by an ordinary user, as a desktop starts it for the person
// logged in: a `useradd -m` account (which gives it subordinate id ranges, as Debian's adduser
// does), not root and not in `kvm`, with a clean environment of its own and none of the test's
// BELLJAR_* settings. tauri-driver, WebKitWebDriver, the app and the sidecar belljard the app
// starts all run as that account, so the daemon finds its directories from the account's
// home: the data directory ~/.local/share/belljar, the rootless copy of `base` in
// ~/.cache/belljar-rootless. As a login session would, the account has its own
// XDG_RUNTIME_DIR (/run/user/UID, 0700), where the daemon's socket and the tray's icon go. In
// the app the user creates a sandbox (New sandbox), runs a command in its terminal as the
// image's user on the account's subordinate ids, and deletes it. Last, the app is started again
// where its tray icon cannot be written (the way a root-owned /tmp/tray-icon once stopped it):
// it must run without a tray, saying so, rather than die.
//
// Needs root (to make and remove the account) and a display (run.sh gives it Xvfb). The images
// are the build machine's, not rebuilt: as in tests/tests/e2e_ordinary_user.rs, the tauri-driver
// process starts in a private mount namespace where $BELLJAR_CACHE/images is bind-mounted on
// the account's ~/.cache/belljar/images and a tmpfs holds its rootless copy. The account, its
// home, its runtime directory and every process of it are removed at the end, also when a step
// fails or the test is interrupted (and a killed run's are removed by the next run).

import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, chownSync, copyFileSync, createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, realpathSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Steps, apiOn, sleep, stopPid, until } from "./harness.mjs";
import { installedApp } from "./installed.mjs";
import { startDriver, tauriDriverExe, webDriver } from "./webdriver.mjs";

// Beside app.test.mjs's tauri-driver (4444) and its WebKitWebDriver (4445).
const DRIVER_PORT = Number(process.env.TAURI_DRIVER_PORT || 4444) + 2;
/** Accounts of this test are `bjapp<pid of the test>`, so a killed run's is found by the next. */
const PREFIX = "bjapp";
const steps = new Steps("app as a user");
const stage = mkdtempSync(join(tmpdir(), "belljar-app-user-"));
const log = createWriteStream(join(stage, "app.log"));
const { exec, find, click, text, wd, s, launch, quit } = webDriver(DRIVER_PORT);
const NAME = "as-a-user";
let user;
let driver;
let app;
let api;
let sandboxId;
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.once(sig, () => {
    console.log(`      ${sig}: removing the account`);
    cleanUp().finally(() => process.exit(1));
  });
}

const run = (cmd, args) => execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

/** The uids of the live (not zombie) processes of `uid`. */
function processesOf(uid) {
  return readdirSync("/proc").filter((p) => /^\d+$/.test(p)).filter((p) => {
    try {
      const state = readFileSync(`/proc/${p}/stat`, "utf8").split(") ").at(-1)[0];
      return statSync(`/proc/${p}`).uid === uid && state !== "Z";
    } catch {
      return false;
    }
  }).map(Number);
}

/** The account's XDG_RUNTIME_DIR, where logind would make it. */
const runtimeDirOf = (uid) => `/run/user/${uid}`;

/** Ends every process of the account and deletes it with its home, runtime directory and subordinate ids. */
async function removeAccount(name, uid) {
  for (let i = 0; i < 50; i++) {
    const pids = processesOf(uid);
    if (!pids.length) break;
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
    await sleep(100);
  }
  spawnSync("userdel", ["-r", "-f", name], { stdio: "ignore" });
  const runtime = runtimeDirOf(uid);
  if (existsSync(runtime) && statSync(runtime).uid === uid) rmSync(runtime, { recursive: true, force: true });
}

function subordinateStart(file, name) {
  const line = readFileSync(file, "utf8").split("\n").find((l) => l.startsWith(`${name}:`));
  return line ? Number(line.split(":")[1]) : null;
}

try {
  await steps.step("an ordinary account with subordinate ids, and the installed app it can read", async () => {
    if (process.getuid() !== 0) throw new Error("this test makes an account (useradd): run it as root (CI does)");
    const prefix = process.env.BELLJAR_APP_PREFIX;
    if (!prefix) throw new Error("BELLJAR_APP_PREFIX is unset: run this through tests/ui/run.sh");
    for (const line of readFileSync("/etc/passwd", "utf8").split("\n")) {
      const [name, , uid] = line.split(":");
      const pid = name?.startsWith(PREFIX) ? name.slice(PREFIX.length) : "";
      if (/^\d+$/.test(pid) && !existsSync(`/proc/${pid}`)) await removeAccount(name, Number(uid));
    }
    const name = `${PREFIX}${process.pid}`;
    run("useradd", ["-m", "-s", "/bin/sh", name]);
    const [uid, gid] = [Number(run("id", ["-u", name])), Number(run("id", ["-g", name]))];
    const home = run("getent", ["passwd", name]).trim().split(":")[5];
    user = { name, uid, gid, home, data: join(home, ".local/share/belljar"), runtime: runtimeDirOf(uid) };
    user.run = join(user.runtime, "belljar");
    user.subuid = subordinateStart("/etc/subuid", name);
    if (user.subuid === null || subordinateStart("/etc/subgid", name) === null) {
      throw new Error(`useradd gave ${name} no subordinate ids (SUB_UID_* in /etc/login.defs)`);
    }
    // An installed /usr is world-readable; the unpacked prefix is mktemp's 0700 directory.
    chmodSync(prefix, 0o755);
    app = installedApp(realpathSync(prefix));
    // tauri-driver is cargo's, under root's home, which the account cannot enter.
    chmodSync(stage, 0o755);
    copyFileSync(tauriDriverExe(), join(stage, "tauri-driver"));
    chmodSync(join(stage, "tauri-driver"), 0o755);
    for (const dir of [".cache/belljar/images", ".cache/belljar-rootless"]) mkdirSync(join(home, dir), { recursive: true });
    run("chown", ["-R", `${uid}:${gid}`, join(home, ".cache")]);
    // What pam_systemd gives a login: /run/user/UID, the account's own, 0700.
    mkdirSync("/run/user", { recursive: true, mode: 0o755 });
    rmSync(user.runtime, { recursive: true, force: true });
    mkdirSync(user.runtime, { mode: 0o700 });
    chownSync(user.runtime, uid, gid);
    console.log(`      ${name}: uid ${uid}, subordinate uids from ${user.subuid}, home ${home}`);
  });

  await steps.step("start tauri-driver as the account", async () => {
    const images = join(process.env.BELLJAR_CACHE || join(process.env.HOME, ".cache/belljar"), "images");
    if (!existsSync(join(images, "base/current"))) throw new Error(`no base image in ${images}`);
    const script = 'set -e; mount --bind "$1" "$2/.cache/belljar/images"; ' +
      'mount -t tmpfs -o mode=0700,uid="$3",gid="$4" belljar-rootless "$2/.cache/belljar-rootless"; ' +
      'shift 4; exec setpriv --reuid="$0" --regid="$0" --init-groups "$@"';
    const env = [
      `HOME=${user.home}`, `USER=${user.name}`, `LOGNAME=${user.name}`, "SHELL=/bin/sh",
      "PATH=/usr/local/bin:/usr/bin:/bin", `DISPLAY=${process.env.DISPLAY}`, `XDG_RUNTIME_DIR=${user.runtime}`,
      // What app.test.mjs sets for WebKitGTK under Xvfb on a build machine.
      "WEBKIT_DISABLE_SANDBOX_THIS_IS_DANGEROUS=1", "WEBKIT_DISABLE_COMPOSITING_MODE=1", "LIBGL_ALWAYS_SOFTWARE=1",
    ];
    driver = await startDriver(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, user.name,
      images, user.home, String(user.uid), String(user.gid),
      "env", "-i", ...env, join(stage, "tauri-driver"), "--port", String(DRIVER_PORT), "--native-port", String(DRIVER_PORT + 1)], process.env, DRIVER_PORT, log);
    const who = statSync(`/proc/${driver.pid}`).uid;
    if (who !== user.uid) throw new Error(`tauri-driver runs as uid ${who}`);
  });

  await steps.step("the app starts its sidecar belljard as the account, on the account's directories", async () => {
    await launch(app.exe, app.args);
    const pidFile = join(user.run, "belljard.pid");
    await until(`the daemon's pid file ${pidFile}`, () => existsSync(pidFile) && existsSync(join(user.run, "port")), 30_000);
    const pid = readFileSync(pidFile, "utf8").trim();
    const daemon = statSync(`/proc/${pid}`).uid;
    if (daemon !== user.uid) throw new Error(`belljard runs as uid ${daemon}, not ${user.name}'s ${user.uid}`);
    const exe = readlinkSync(`/proc/${pid}/exe`);
    if (exe !== join(app.exe, "../belljard")) throw new Error(`the daemon runs ${exe}, not the app's sidecar`);
    api = apiOn(join(user.run, "belljard.sock"));
    const info = await api.json("GET", "/v1/info");
    console.log(`      belljard ${info.version ?? ""} pid ${pid} as ${user.name}; default backend ${info.default_backend}`);
    await until("a connection to belljard", async () => /belljard \d/.test(await text()), 30_000);
    // The tray's icon image is written to the account's runtime directory, nowhere shared.
    const icons = join(user.run, "tray-icon");
    await until(`the tray's icon in ${icons}`, () => existsSync(icons) && readdirSync(icons).some((f) => f.endsWith(".png")), 10_000);
  });

  await steps.step("New sandbox in the app creates a rootless sandbox that appears in the list", async () => {
    await exec("Array.from(document.querySelectorAll('button')).find((b) => b.textContent.trim() === 'New sandbox').click()");
    const dialog = "dialog[aria-labelledby='create-title']";
    await until("the New sandbox dialog", () => exec("return !!document.querySelector(arguments[0])?.open", [dialog]), 10_000);
    await wd("POST", s(`/element/${await find(`${dialog} input[aria-label='Name']`)}/value`), { text: NAME });
    await click(`${dialog} button[type=submit]`);
    const created = await until("the sandbox in the daemon", async () =>
      (await api.json("GET", "/v1/sandboxes")).sandboxes.find((x) => x.name === NAME), 60_000);
    sandboxId = created.id;
    // The dialog takes the user to the new sandbox's page; the list is one step back.
    await until("the new sandbox's page", async () => (await exec("return location.hash")) === `#/sandbox/${sandboxId}`, 30_000);
    await exec("location.hash = '#/'");
    await until("the sandbox running in the list", async () => (await exec(
      "return document.querySelector(`tr[data-sandbox='${arguments[0]}']`)?.textContent ?? ''", [sandboxId])).includes("running"), 60_000)
      .catch(async (e) => {
        const notes = await exec("return document.querySelector('.notes')?.innerText ?? ''").catch(String);
        const now = await api.json("GET", `/v1/sandboxes/${sandboxId}`).catch(String);
        throw new Error(`${e.message}; page says: ${JSON.stringify(notes)}; daemon says: ${JSON.stringify(now).slice(0, 600)}`);
      });
    // The copy is on the tmpfs of the daemon's mount namespace, seen through its /proc root.
    const pid = readFileSync(join(user.run, "belljard.pid"), "utf8").trim();
    const copies = readdirSync(`/proc/${pid}/root${user.home}/.cache/belljar-rootless`);
    if (!copies.length) throw new Error("no rootless copy of base in the account's ~/.cache/belljar-rootless");
  });

  await steps.step("its terminal runs a command as the image's user on the account's subordinate ids", async () => {
    await click(`a[href='#/sandbox/${sandboxId}']`);
    await until("terminal 1 to open", async () => (await exec(
      "return document.querySelector('[aria-label=\"Terminal 1\"]')?.dataset.state")) === "open", 60_000);
    const input = await find("[role=tabpanel]:not([hidden]) textarea.xterm-helper-textarea");
    await wd("POST", s(`/element/${input}/value`), { text: "echo uid-$(id -u)-map-$(awk 'NR==2{print $2}' /proc/self/uid_map)\n" });
    const want = `uid-1000-map-${user.subuid}`;
    await until(`${want} in the terminal`, async () => (await exec(
      "return Array.from(document.querySelectorAll('[role=tabpanel]:not([hidden]) .xterm-rows > div'), r => r.textContent.trim())"))
      .includes(want), 20_000);
  });

  await steps.step("Delete in the app removes the sandbox", async () => {
    await exec("location.hash = '#/'");
    // The list's own button: the sandbox's page, kept for its terminals, has a hidden one too.
    const del = `tr[data-sandbox='${sandboxId}'] button[aria-label='Delete ${NAME}']`;
    await until("the list's Delete button", () => exec("return !!document.querySelector(arguments[0])", [del]), 10_000);
    await click(del);
    // The app asks first (confirm()); WebDriver answers the prompt as the user would.
    await until("the confirmation", async () => (await wd("GET", s("/alert/text"))).includes(`Delete ${NAME}?`), 10_000);
    await wd("POST", s("/alert/accept"), {});
    await until("the row to go", async () => !(await exec(
      "return !!document.querySelector(`tr[data-sandbox='${arguments[0]}']`)", [sandboxId])), 60_000);
    const left = (await api.json("GET", "/v1/sandboxes")).sandboxes.filter((x) => x.id === sandboxId);
    if (left.length) throw new Error(`the daemon still has ${sandboxId}: ${JSON.stringify(left)}`);
    sandboxId = null;
  });

  await steps.step("where its tray icon cannot be written, the app runs without a tray and says so", async () => {
    // The icon's directory is root's and not writable by the account, as /tmp/tray-icon was.
    await quit();
    const icons = join(user.run, "tray-icon");
    rmSync(icons, { recursive: true, force: true });
    mkdirSync(icons, { mode: 0o755 });
    const logged = () => readFileSync(join(stage, "app.log"), "utf8");
    const before = logged().length;
    await launch(app.exe, app.args);
    await until("the app connected to its daemon", async () => /belljard \d/.test(await text()), 30_000);
    await until("the warning on the app's standard error", () =>
      logged().slice(before).includes("running without a tray icon"), 10_000);
    if (!(await text()).includes("Sandboxes")) throw new Error("the app's window shows no sandbox list");
  });
} finally {
  await cleanUp();
}
process.exit(steps.report());

/** Removes what the test made; runs once, from the end of the test or on SIGINT/SIGTERM. */
async function cleanUp() {
  if (cleanUp.done) return;
  cleanUp.done = true;
  if (sandboxId) await api?.call("DELETE", `/v1/sandboxes/${sandboxId}`).catch(() => {});
  await quit();
  if (driver) await stopPid(driver.pid);
  if (user) await removeAccount(user.name, user.uid);
  await new Promise((r) => log.end(r));
  if (steps.failed) {
    const lines = readFileSync(join(stage, "app.log"), "utf8").trimEnd().split("\n");
    console.log(`      the app's and driver's log, last ${Math.min(lines.length, 40)} lines:`);
    for (const line of lines.slice(-40)) console.log(`      | ${line}`);
  }
  rmSync(stage, { recursive: true, force: true });
}
