// The desktop app as users get it, under tauri-driver + WebKitWebDriver in Xvfb: run.sh unpacks
// the .deb into a clean prefix (BELLJAR_APP_PREFIX, the package in BELLJAR_APP_DEB), and the
// app is started through its installed desktop entry's `Exec=` line. It starts the packaged
// belljard (its sidecar) on a temporary home, shows the sandbox list (live: a sandbox made
// through the API appears), opens a terminal tab and runs a command; saves a screenshot.
// Run under a display: `xvfb-run -a node app.test.mjs` (run.sh does).

import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, readlinkSync, realpathSync, statSync, writeFileSync, createWriteStream } from "node:fs";
import { join } from "node:path";
import { Steps, apiOn, freshHome, recordingOpener, screenshots, startDaemon, stopPid, until, sleep } from "./harness.mjs";
import { installedApp, unmetDependencies } from "./installed.mjs";
import { startDriver, tauriDriverExe, webDriver } from "./webdriver.mjs";

const DRIVER_PORT = Number(process.env.TAURI_DRIVER_PORT || 4444);
const steps = new Steps("app");
const h = freshHome("belljar-app-");
const api = apiOn(h.socket);
const log = createWriteStream(join(h.home, "app.log"));
const opener = recordingOpener(join(h.home, "opener"));
let driver;
let sandboxId;
const extra = [];
let restarted;
let app;

const { wd, s, exec, find, text, launch, quit } = webDriver(DRIVER_PORT);

try {
  await steps.step("the installed package: a desktop entry whose program, icon and dependencies are there", async () => {
    const prefix = process.env.BELLJAR_APP_PREFIX;
    const deb = process.env.BELLJAR_APP_DEB;
    if (!prefix || !deb) throw new Error("BELLJAR_APP_PREFIX and BELLJAR_APP_DEB are unset: run this through tests/ui/run.sh");
    app = installedApp(realpathSync(prefix));
    const unmet = unmetDependencies(deb);
    if (unmet.length) throw new Error(`the .deb depends on what is not installed: ${unmet.join(", ")}`);
    // The Open links of forwarded ports go to the user's browser through xdg-open.
    const recommends = spawnSync("dpkg-deb", ["-f", deb, "Recommends"], { encoding: "utf8" }).stdout;
    if (!/\bxdg-utils\b/.test(recommends)) throw new Error(`the .deb does not recommend xdg-utils: ${JSON.stringify(recommends)}`);
    console.log(`      ${app.desktopFile}: Exec=${app.entry.get("Exec")} -> ${app.exe}`);
  });

  await steps.step("the package carries the CLI, the VMM, the web UI, the image recipes and the guest agent", async () => {
    const prefix = realpathSync(process.env.BELLJAR_APP_PREFIX);
    for (const [path, exec] of [
      ["usr/bin/belljar", true],
      ["usr/bin/belljar-vmm", true],
      ["usr/lib/belljar/ui/index.html", false],
      ["usr/lib/belljar/guest-images/build-image.sh", true],
      ["usr/lib/belljar/guest-images/belljar-agent", true],
      ["usr/lib/belljar/guest-images/lib/rootfs.sh", false],
      ["usr/lib/belljar/guest-images/recipes/base/recipe.sh", false],
      ["usr/lib/belljar/guest-images/kernel/build.sh", true],
    ]) {
      const full = join(prefix, path);
      if (!existsSync(full)) throw new Error(`the package has no ${path}`);
      if (exec && !(statSync(full).mode & 0o111)) throw new Error(`${path} is not executable`);
    }
    const version = spawnSync(join(prefix, "usr/bin/belljar"), ["--version"], { encoding: "utf8" });
    if (version.status !== 0 || !/^belljar \d/.test(version.stdout)) {
      throw new Error(`the packaged CLI: ${version.status} ${version.stdout}${version.stderr}`);
    }
    // The installed build script finds the agent beside it, with no build tree to fall back on:
    // as an unprivileged user it gets past the agent lookup and stops at the root check. (The
    // prefix is mktemp's 0700 directory; an installed /usr is world-readable.)
    chmodSync(prefix, 0o755);
    const script = spawnSync("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups",
      join(prefix, "usr/lib/belljar/guest-images/build-image.sh"), "base"], {
      encoding: "utf8",
      cwd: "/",
      env: { PATH: process.env.PATH, HOME: "/nonexistent", BELLJAR_CACHE: "/nonexistent/belljar" },
    });
    if (!/needs root/.test(script.stderr)) throw new Error(`the packaged build-image.sh: ${script.stderr}`);
    // Markers only the package's copies hold: the sidecar must serve these, not the build tree's.
    writeFileSync(join(prefix, "usr/lib/belljar/ui/package-marker.txt"), `marker ${process.pid}\n`);
    mkdirSync(join(prefix, "usr/lib/belljar/guest-images/recipes/package-marker"), { recursive: true });
    writeFileSync(join(prefix, "usr/lib/belljar/guest-images/recipes/package-marker/recipe.sh"), "# test marker\n");
    console.log(`      ${version.stdout.trim()}; build-image.sh found its agent`);
  });

  await steps.step("start tauri-driver", async () => {
    const env = {
      ...process.env,
      BELLJAR_HOME: h.home,
      BELLJAR_PORT: "0",
      PATH: `${opener.dir}:${process.env.PATH}`,
      // WebKitGTK's sandbox needs user namespaces the test machine may not give it.
      WEBKIT_DISABLE_SANDBOX_THIS_IS_DANGEROUS: "1",
      WEBKIT_DISABLE_COMPOSITING_MODE: "1",
      LIBGL_ALWAYS_SOFTWARE: "1",
    };
    driver = await startDriver([tauriDriverExe(), "--port", String(DRIVER_PORT)], env, DRIVER_PORT, log);
  });

  await steps.step("launch the app from its desktop entry; it starts the packaged belljard", async () => {
    await launch(app.exe, app.args);
    await until("the app's daemon to write its port", () => existsSync(h.portFile), 30_000);
    // The daemon is the package's own sidecar, next to the app, not a belljard from elsewhere.
    const daemonExe = readlinkSync(`/proc/${readFileSync(h.pidFile, "utf8").trim()}/exe`);
    const sidecar = join(app.exe, "../belljard");
    if (daemonExe !== sidecar) throw new Error(`the app's daemon runs ${daemonExe}, not its sidecar ${sidecar}`);
    // It serves the package's web UI and lists the package's image recipes.
    const port = readFileSync(h.portFile, "utf8").trim();
    const marker = await (await fetch(`http://127.0.0.1:${port}/package-marker.txt`)).text();
    if (marker !== `marker ${process.pid}\n`) throw new Error(`the sidecar's web UI is not the package's: ${marker.slice(0, 80)}`);
    const images = await api.json("GET", "/v1/images");
    const names = (images.images ?? images).map((i) => i.name);
    if (!names.includes("package-marker")) throw new Error(`the sidecar's recipes are not the package's: ${names.join(", ")}`);
    await until("the sandbox list", async () => (await text()).includes("Sandboxes"), 30_000);
    await until("a connection to belljard", async () => /belljard \d/.test(await text()), 30_000);
    const where = await exec("return [location.origin, !!window.__TAURI_INTERNALS__]");
    console.log(`      the UI runs at ${where[0]} (app bridge: ${where[1] ? "yes" : "no"})`);
  });

  await steps.step("a sandbox made through the API appears in the list, live", async () => {
    const sbx = await api.json("POST", "/v1/sandboxes", { name: "app-test", tags: { suite: "app" }, timeout_ms: 600_000 });
    sandboxId = sbx.id;
    await until("the new sandbox in the list", async () => (await exec(
      "return !!document.querySelector(`tr[data-sandbox='${arguments[0]}']`)", [sandboxId])), 30_000);
    const png = await wd("GET", s("/screenshot"));
    writeFileSync(join(screenshots, "app-list.png"), Buffer.from(png, "base64"));
  });

  await steps.step("open the sandbox and a terminal tab; run a command", async () => {
    await wd("POST", s(`/element/${await find(`a[href='#/sandbox/${sandboxId}']`)}/click`), {});
    await until("terminal 1 to open", async () => (await exec(
      "return document.querySelector('[aria-label=\"Terminal 1\"]')?.dataset.state")) === "open", 60_000);
    await wd("POST", s(`/element/${await find("button[aria-label='New terminal tab']")}/click`), {});
    await until("terminal 2 to open", async () => (await exec(
      "return document.querySelector('[aria-label=\"Terminal 2\"]')?.dataset.state")) === "open", 60_000);
    const input = await find("[role=tabpanel]:not([hidden]) textarea.xterm-helper-textarea");
    await wd("POST", s(`/element/${input}/value`), { text: "echo app-says-$((6*7))\n" });
    await until("the command's output", async () => (await exec(
      "return Array.from(document.querySelectorAll('[role=tabpanel]:not([hidden]) .xterm-rows > div'), r => r.textContent.trim())"))
      .includes("app-says-42"), 20_000);
    await sleep(300);
    const png = await wd("GET", s("/screenshot"));
    writeFileSync(join(screenshots, "app-terminal.png"), Buffer.from(png, "base64"));
  });

  await steps.step("the Network tab's Open link hands the forwarded port to the user's browser", async () => {
    // The webview follows no target=_blank link; the app passes the address to xdg-open. The
    // xdg-open on the app's PATH here (opener below) records what it was given instead of
    // starting a browser, and the test asks that address: the sandbox's server answers.
    await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["perl", "-MIO::Socket::INET", "-e",
        '$s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die; while($c=$s->accept){while(<$c>){last if /^\\r?$/} print $c "HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nhello from the sandbox\\n"; close $c}'],
      detached: true,
    });
    const mapped = await api.json("POST", `/v1/sandboxes/${sandboxId}/ports`, { port: 8000 });
    await exec("Array.from(document.querySelectorAll('button')).find((b) => b.textContent.trim() === 'Network').click()");
    const href = await until("the Open link of port 8000", async () => exec(
      "return document.querySelector(\"a[aria-label='Open port 8000']\")?.getAttribute('href') ?? null"), 30_000);
    if (href !== mapped.url) throw new Error(`the app links ${href}, the daemon maps ${mapped.url}`);
    const page = await exec("return location.href");
    await wd("POST", s(`/element/${await find("a[aria-label='Open port 8000']")}/click`), {});
    const opened = await until("xdg-open to be called", () => existsSync(opener.record) && readFileSync(opener.record, "utf8"), 20_000);
    if (opened !== `${mapped.url}\n`) throw new Error(`xdg-open was given ${JSON.stringify(opened)}, not ${mapped.url}`);
    if ((await exec("return location.href")) !== page) throw new Error("the app's window followed the link itself");
    await until("the sandbox's server behind the opened address", async () =>
      (await fetch(opened.trim()).then((r) => r.text(), () => "")).includes("hello from the sandbox"), 20_000);
    await api.call("DELETE", `/v1/sandboxes/${sandboxId}/ports/8000`);
    // The terminals again, as the steps below expect.
    await wd("POST", s(`/element/${await find("button[aria-label='Close Network']")}/click`), {});
  });

  await steps.step("a terminal window opens on the sandbox (what the tray's Terminal does)", async () => {
    // WebKitWebDriver drives only the window it launched; the new window is seen through the
    // app's window list and through the shell it starts in the sandbox.
    const shells = async () => (await api.json("GET", `/v1/sandboxes/${sandboxId}/commands`)).commands
      .filter((c) => c.pty && c.status === "running").length;
    const before = await shells();
    await wd("POST", s(`/element/${await find("button[title='Open a terminal in a new window']")}/click`), {});
    await until("a terminal-* window", async () => {
      const labels = await wd("POST", s("/execute/async"), {
        script: "const done = arguments[arguments.length - 1];" +
          "window.__TAURI_INTERNALS__.invoke('plugin:window|get_all_windows').then(done, (e) => done(['error: ' + e]));",
        args: [],
      });
      return labels.some((l) => l.startsWith("terminal-"));
    }, 20_000).catch(async (e) => {
      const notes = await exec("return document.querySelector('.notes')?.innerText ?? ''");
      throw new Error(`${e.message}; page says: ${JSON.stringify(notes)}`);
    });
    await until("the window's shell to start in the sandbox", async () => (await shells()) > before, 60_000);
  });

  await steps.step("the tray's quick-launch creates a sandbox and opens a terminal window on it", async () => {
    // The tray's "New sandbox ▸ base" sends this event to the main window; WebDriver cannot
    // click a tray, so the test sends the same event.
    const before = (await api.json("GET", "/v1/sandboxes")).sandboxes.map((x) => x.id);
    await wd("POST", s("/execute/async"), {
      script: "const done = arguments[arguments.length - 1];" +
        "window.__TAURI_INTERNALS__.invoke('plugin:event|emit_to', { target: { kind: 'AnyLabel', label: 'main' }," +
        " event: 'belljar://quick-launch', payload: { image: 'base' } }).then(() => done(true), (e) => done(String(e)));",
      args: [],
    });
    const created = await until("a new sandbox", async () =>
      (await api.json("GET", "/v1/sandboxes")).sandboxes.find((x) => !before.includes(x.id)), 60_000);
    extra.push(created.id);
    await until("its terminal window's shell", async () => (await api.json("GET", `/v1/sandboxes/${created.id}/commands`))
      .commands.some((c) => c.pty && c.status === "running"), 60_000);
  });

  await steps.step("after a daemon restart the app signs in again and the terminal reconnects", async () => {
    // The embedded page keeps its origin and reconnects to the daemon's new port; a page that
    // the daemon served (the fallback for a daemon without CORS) moves to the new origin.
    await stopPid(Number(readFileSync(h.pidFile, "utf8").trim()));
    restarted = await startDaemon(h, (d) => log.write(d));
    await until("the UI back on the new daemon", async () => /belljard \d/.test(await text()), 60_000);
    await exec("location.hash = '#/'");
    await until("the sandbox in the list", async () => (await exec(
      "return !!document.querySelector(`tr[data-sandbox='${arguments[0]}']`)", [sandboxId])), 30_000);
    await wd("POST", s(`/element/${await find(`a[href='#/sandbox/${sandboxId}']`)}/click`), {});
    await until("terminal 1 to open again", async () => (await exec(
      "return document.querySelector('[aria-label=\"Terminal 1\"]')?.dataset.state")) === "open", 60_000);
  });

} finally {
  for (const id of [sandboxId, ...extra].filter(Boolean)) await api.call("DELETE", `/v1/sandboxes/${id}`).catch(() => {});
  await quit();
  if (driver) await stopPid(driver.pid);
  // The app's daemon outlives the app by design; this test started it, so it stops it.
  if (existsSync(h.pidFile)) await stopPid(Number(readFileSync(h.pidFile, "utf8").trim()));
  await restarted?.stop();
  log.end();
  if (steps.failed) console.log(`      app and driver log: ${join(h.home, "app.log")}`);
  else h.remove();
}
process.exit(steps.report());
