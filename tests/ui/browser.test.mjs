// The web UI in Debian's Chromium (playwright-core, no downloaded browser) against a real
// belljard on the namespace backend: create a sandbox from the dialog, `echo hi` in a terminal,
// drop a file onto the tree and read it back through the API, open a file, see the command
// history, pause and resume, walk the snapshot timeline (snapshot, create from it, diff), edit
// the network policy, see a denied flow and open a forwarded port, stop and delete the sandbox;
// the host check shows the daemon's doctor findings; on the Images page, build an image from a
// Dockerfile typed in the page (and again, cached), create a sandbox from it, be refused its
// removal while the sandbox stands on it, remove it, prune, and see a pull's error code.
// Saves screenshots to docs/screenshots/.

import { mkdtempSync, rmSync, createWriteStream } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { Steps, apiOn, freshHome, screenshots, startDaemon, until } from "./harness.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const steps = new Steps("browser");
const h = freshHome();
const logFile = join(h.home, "belljard.log");
const log = createWriteStream(logFile);
const api = apiOn(h.socket);
const profile = mkdtempSync(join(tmpdir(), "belljar-chromium-"));
let daemon;
let context;
let page;
let sandboxId;
let imageSandboxId;
const IMAGE = "localhost/ui-hi:1";
const NAME = "ui-test";
const DROPPED = "hello from a dropped file\n";
const PY = 'def greet(name: str) -> str:\n    """Say hello."""\n    return f"hello {name}"\n\nprint(greet("belljar"))  # 42\n';

/** The Images table's row that lists `name` (an image with several names has one row). */
const imageRow = (name) =>
  page.getByRole("table", { name: "Images" }).locator("tr", { has: page.getByText(name, { exact: true }) });
const shot = (name) => page.screenshot({ path: join(screenshots, name) });
const terminalText = () =>
  page.evaluate(() => {
    const panel = document.querySelector('.page:not([hidden]) [role="tabpanel"]:not([hidden]) .xterm-rows');
    return panel ? Array.from(panel.children, (r) => r.textContent ?? "") : [];
  });

/** Drops files onto an element the way a desktop drag would (DataTransfer with File objects). */
async function dropFiles(selector, files) {
  await page.evaluate(
    ({ selector, files }) => {
      const target = document.querySelector(selector);
      if (!target) throw new Error(`no ${selector}`);
      const dt = new DataTransfer();
      for (const f of files) dt.items.add(new File([f.text], f.name, { type: "text/plain" }));
      const r = target.getBoundingClientRect();
      const at = { clientX: r.left + 20, clientY: r.top + 10, bubbles: true, cancelable: true, dataTransfer: dt };
      target.dispatchEvent(new DragEvent("dragenter", at));
      target.dispatchEvent(new DragEvent("dragover", at));
      target.dispatchEvent(new DragEvent("drop", at));
    },
    { selector, files },
  );
}

try {
  await steps.step("start belljard on a temporary home", async () => {
    daemon = await startDaemon(h, (d) => log.write(d));
    const info = await api.json("GET", "/v1/info");
    if (info.default_backend !== "namespace") console.log(`      note: default backend is ${info.default_backend}`);
  });

  await steps.step("open the UI with a one-time token (cookie session)", async () => {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1360, height: 820 },
      args: [
        "--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync",
      ],
    });
    page = context.pages()[0] ?? (await context.newPage());
    page.on("dialog", (d) => d.accept());
    page.on("pageerror", (e) => console.log(`      page error: ${e.message}`));
    const token = await api.sessionToken();
    await page.goto(`http://127.0.0.1:${daemon.port}/ui?token=${token}`);
    await page.waitForURL(`http://127.0.0.1:${daemon.port}/**`);
    await page.getByRole("status", { name: "Daemon connection" }).filter({ hasText: "belljard" }).waitFor();
    await page.getByText("No sandboxes yet").waitFor();
    await shot("sandboxes-empty.png");
  });

  await steps.step("open the host check and see the daemon's findings, the same as GET /v1/doctor", async () => {
    await page.getByRole("link", { name: "Host check" }).click();
    await until("the host check's address", async () => /#\/doctor$/.test(page.url()));
    const table = page.getByRole("table", { name: "Host findings" });
    await table.waitFor({ timeout: 60_000 });
    const report = await api.json("GET", "/v1/doctor");
    for (const f of report.findings) {
      const row = table.locator(`tr[data-check="${f.check}"]`);
      await row.locator(`.badge.${f.status}`).waitFor();
      if (f.fix) await row.getByLabel(`Fix for ${f.check}`).filter({ hasText: f.fix }).waitFor();
    }
    const rows = await table.locator("tbody tr").count();
    if (rows !== report.findings.length) throw new Error(`${rows} rows for ${report.findings.length} findings`);
    // This daemon answers, so its own finding is ok; the summary counts what the rows show.
    await table.locator('tr[data-check="daemon"] .badge.ok').waitFor();
    const problems = report.findings.filter((f) => f.status === "problem").length;
    await page.getByRole("status", { name: "Host check summary" }).filter({ hasText: problems === 0 && report.findings.every((f) => f.status === "ok") ? "Everything" : `${problems} problem` }).waitFor();
    await shot("host-check.png");
    await page.getByRole("link", { name: "Sandboxes" }).click();
    await page.getByText("No sandboxes yet").waitFor();
  });

  await steps.step("create a sandbox from the dialog", async () => {
    await page.getByRole("button", { name: "New sandbox" }).click();
    const dialog = page.getByRole("dialog", { name: "New sandbox" });
    await dialog.waitFor();
    await dialog.getByLabel("Name").fill(NAME);
    await dialog.getByLabel("Tags").fill("suite=ui\nowner=playwright");
    await dialog.getByLabel("Environment").fill("GREETING=hi");
    await dialog.getByLabel("Timeout").fill("15m");
    await shot("create-dialog.png");
    await dialog.getByRole("button", { name: "Create sandbox" }).click();
    await until("the sandbox's address", async () => /#\/sandbox\/sbx_/.test(page.url()), 120_000);
    sandboxId = decodeURIComponent(new URL(page.url()).hash.split("/")[2]);
    const s = await api.json("GET", `/v1/sandboxes/${sandboxId}`);
    if (s.status !== "running" || s.name !== NAME || s.tags.suite !== "ui") throw new Error(`unexpected sandbox ${JSON.stringify(s)}`);
  });

  await steps.step("type `echo hi` into a terminal and read `hi` back", async () => {
    const term = page.getByRole("region", { name: "Terminal 1" });
    await until("the terminal to open", async () => (await term.getAttribute("data-state")) === "open", 60_000);
    await term.locator(".xterm").click();
    await page.keyboard.type("echo hi\n");
    await until("a line that is exactly `hi`", async () => (await terminalText()).some((l) => l.trim() === "hi"), 20_000);
    await page.keyboard.type("printf '\\033[1;32m%s\\033[0m\\n' \"colour works\" && uname -sr\n");
    await until("the coloured line", async () => (await terminalText()).some((l) => l.includes("colour works")));
    await shot("terminal.png");
  });

  await steps.step("open a second terminal tab with the keyboard and close it", async () => {
    await page.keyboard.press("Control+Shift+T");
    const term2 = page.getByRole("region", { name: "Terminal 2" });
    await until("terminal 2 to open", async () => (await term2.getAttribute("data-state")) === "open", 30_000);
    await page.keyboard.press("Control+Shift+W");
    await until("terminal 2 to close", async () => (await term2.count()) === 0);
    await page.getByRole("tab", { name: /Terminal 1/ }).click();
  });

  await steps.step("drop files onto the tree, see them appear, read them back through the API", async () => {
    await page.getByRole("tree", { name: "Files in /workspace" }).or(page.getByText("/workspace is empty")).first().waitFor();
    await dropFiles('[data-dir="/workspace"]', [
      { name: "dropped.txt", text: DROPPED },
      { name: "hello.py", text: PY },
    ]);
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "dropped.txt" }).waitFor({ timeout: 20_000 });
    await tree.getByRole("treeitem", { name: "hello.py" }).waitFor({ timeout: 20_000 });
    const back = await api.call("GET", `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent("/workspace/dropped.txt")}`);
    if (back.body.toString("utf8") !== DROPPED) throw new Error(`read back ${JSON.stringify(back.body.toString("utf8"))}`);
    await page.getByRole("progressbar", { name: "Upload dropped.txt" }).waitFor();
  });

  await steps.step("a file made in the shell shows up through the watch", async () => {
    await page.getByRole("region", { name: "Terminal 1" }).locator(".xterm").click();
    await page.keyboard.type("mkdir -p /workspace/src && echo made > /workspace/src/from-shell.txt\n");
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "src" }).waitFor({ timeout: 20_000 });
    await tree.getByRole("treeitem", { name: "src" }).click();
    await tree.getByRole("treeitem", { name: "from-shell.txt" }).waitFor({ timeout: 20_000 });
  });

  await steps.step("a folder of 1500 files shows a page, then the next on Show more", async () => {
    await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["sh", "-c", "mkdir -p /workspace/many && cd /workspace/many && seq -f 'f%04g' 1 1500 | xargs touch"],
    });
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "many" }).click({ timeout: 20_000 });
    await tree.getByRole("treeitem", { name: "f1000" }).waitFor({ timeout: 20_000 });
    if ((await tree.getByRole("treeitem", { name: "f1001" }).count()) !== 0) throw new Error("more than a page at first");
    await tree.getByRole("button", { name: "Show more (1000 shown)" }).click();
    await tree.getByRole("treeitem", { name: "f1500" }).waitFor({ timeout: 20_000 });
    if ((await tree.getByRole("button", { name: /Show more/ }).count()) !== 0) throw new Error("Show more after the last page");
    await tree.getByRole("treeitem", { name: "many" }).click();
    await until("many to fold", async () => (await tree.getByRole("treeitem", { name: "f0001" }).count()) === 0);
  });

  await steps.step("open files: text with syntax colouring", async () => {
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "dropped.txt" }).click();
    await page.getByLabel("Contents of dropped.txt").filter({ hasText: "hello from a dropped file" }).waitFor();
    await tree.getByRole("treeitem", { name: "hello.py" }).click();
    const code = page.getByLabel("Contents of hello.py");
    await code.filter({ hasText: "def greet" }).waitFor();
    if ((await code.locator(".hljs-keyword").count()) === 0) throw new Error("no syntax colouring in hello.py");
    await shot("file-viewer.png");
  });

  await steps.step("an image opens as a preview made by the daemon", async () => {
    await page.evaluate(() => {
      const c = document.createElement("canvas");
      c.width = 320;
      c.height = 200;
      const g = c.getContext("2d");
      const grad = g.createLinearGradient(0, 0, 320, 200);
      grad.addColorStop(0, "#2563eb");
      grad.addColorStop(1, "#5eead4");
      g.fillStyle = grad;
      g.fillRect(0, 0, 320, 200);
      return new Promise((res) => c.toBlob(async (b) => {
        const dt = new DataTransfer();
        dt.items.add(new File([b], "gradient.png", { type: "image/png" }));
        const t = document.querySelector('[data-dir="/workspace"]');
        for (const type of ["dragenter", "dragover", "drop"]) {
          t.dispatchEvent(new DragEvent(type, { bubbles: true, cancelable: true, dataTransfer: dt }));
        }
        res();
      }, "image/png"));
    });
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "gradient.png" }).click({ timeout: 20_000 });
    const img = page.getByRole("img", { name: "Preview of gradient.png" });
    await img.waitFor();
    await until("the preview to load", () => img.evaluate((el) => el.complete && el.naturalWidth > 0));
  });

  await steps.step("new folder, rename and delete from the tree", async () => {
    const tree = page.getByRole("tree", { name: "Files in /workspace" });
    await tree.getByRole("treeitem", { name: "dropped.txt" }).click();
    page.removeAllListeners("dialog");
    page.once("dialog", (d) => d.accept("made-in-ui"));
    await page.getByRole("button", { name: "New folder" }).click();
    await tree.getByRole("treeitem", { name: "made-in-ui" }).waitFor({ timeout: 20_000 });
    await api.call("GET", `/v1/sandboxes/${sandboxId}/files/stat?path=${encodeURIComponent("/workspace/made-in-ui")}`);
    await tree.getByRole("treeitem", { name: "dropped.txt" }).click();
    page.once("dialog", (d) => d.accept("renamed.txt"));
    await page.getByRole("button", { name: "Rename" }).click();
    await tree.getByRole("treeitem", { name: "renamed.txt" }).waitFor({ timeout: 20_000 });
    await tree.getByRole("treeitem", { name: "renamed.txt" }).click();
    page.once("dialog", (d) => d.accept());
    await page.getByRole("button", { name: "Delete", exact: true }).click();
    await until("renamed.txt to go", async () => (await tree.getByRole("treeitem", { name: "renamed.txt" }).count()) === 0);
    const gone = await api.call("GET", `/v1/sandboxes/${sandboxId}/files/stat?path=${encodeURIComponent("/workspace/renamed.txt")}`, undefined, [404]);
    if (gone.status !== 404) throw new Error(`renamed.txt still there: ${gone.status}`);
    page.on("dialog", (d) => d.accept());
  });

  await steps.step("command history shows exit codes and output", async () => {
    await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"],
      sudo: false, detached: false, stdin: false,
    });
    await page.getByRole("button", { name: "History", exact: true }).click();
    const cmd = page.getByRole("button", { name: /Command sh -c echo to-stdout/ });
    await cmd.waitFor({ timeout: 15_000 });
    await cmd.filter({ hasText: "exit 3" }).waitFor();
    await cmd.click();
    await page.getByLabel("Output").filter({ hasText: "to-stderr" }).waitFor();
    await shot("history.png");
  });

  await steps.step("follow a running command's output", async () => {
    const cmd = await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["sh", "-c", "for i in 1 2 3 4; do echo tick$i; sleep 0.7; done"],
      sudo: false, detached: true, stdin: false,
    });
    if (cmd.status !== "running") throw new Error(`detached command is ${cmd.status}`);
    const row = page.getByRole("button", { name: /Command sh -c for i in/ });
    await row.waitFor({ timeout: 10_000 });
    await row.click();
    await page.getByText("following").waitFor({ timeout: 5000 });
    await page.getByLabel("Output").filter({ hasText: "tick4" }).waitFor({ timeout: 15_000 });
    await row.filter({ hasText: "exit 0" }).waitFor({ timeout: 15_000 });
  });

  await steps.step("the list shows the sandbox live, in light and dark", async () => {
    await page.getByRole("link", { name: "Sandboxes" }).click();
    const row = page.locator(`tr[data-sandbox="${sandboxId}"]`);
    await row.getByText("running").waitFor();
    await row.getByText("suite=ui").waitFor();
    await page.getByLabel("Search sandboxes").fill("nomatch-xyz");
    await page.getByText("No sandbox matches").waitFor();
    await page.getByLabel("Search sandboxes").fill("suite=ui");
    await row.waitFor();
    await page.getByLabel("Search sandboxes").fill("");
    await shot("sandboxes.png");
    await page.emulateMedia({ colorScheme: "dark" });
    await page.getByRole("link", { name: `Open sandbox ${NAME}` }).click();
    // The view was kept: its tabs and the shell's scrollback are still there.
    await page.getByRole("tab", { name: /Terminal 1/ }).click();
    await until("the earlier `echo hi`", async () => (await terminalText()).some((l) => l.trim() === "hi"));
    await page.waitForTimeout(500);
    await shot("sandbox-dark.png");
    await page.emulateMedia({ colorScheme: "light" });
  });

  await steps.step("pause and resume from the buttons", async () => {
    await page.getByRole("button", { name: `Pause ${NAME}` }).click();
    await page.getByLabel("State paused").waitFor({ timeout: 30_000 });
    await page.getByRole("button", { name: `Resume ${NAME}` }).click();
    await page.getByLabel("State running").waitFor({ timeout: 30_000 });
  });

  await steps.step("timeline: take a snapshot, see it, create a sandbox from it, open a diff", async () => {
    await page.getByRole("button", { name: "Timeline" }).click();
    const timeline = page.getByRole("region", { name: "Snapshot timeline" });
    await timeline.getByRole("button", { name: "Snapshot now" }).click();
    const point = timeline.locator('li[aria-label^="Snapshot snap_"]');
    await point.first().waitFor({ timeout: 60_000 });
    const snapId = (await point.first().getAttribute("aria-label")).replace("Snapshot ", "");
    const listed = await api.json("GET", `/v1/snapshots?sandbox_id=${sandboxId}`);
    if (!listed.snapshots.some((s) => s.id === snapId && s.status === "created")) {
      throw new Error(`snapshot ${snapId} not listed: ${JSON.stringify(listed)}`);
    }
    // A change after the snapshot, made in the shell, for the diff to show.
    await page.getByRole("tab", { name: /Terminal 1/ }).click();
    await page.getByRole("region", { name: "Terminal 1" }).locator(".xterm").click();
    await page.keyboard.type("echo later > /workspace/later.txt && echo written\n");
    await until("the shell's answer", async () => (await terminalText()).some((l) => l.trim() === "written"));
    await page.getByRole("tab", { name: /Timeline/ }).click();
    await timeline.getByRole("button", { name: `New sandbox from ${snapId}` }).click();
    const branch = point.first().locator(".branch a");
    await branch.waitFor({ timeout: 120_000 });
    const branchId = (await branch.getAttribute("href")).split("/").pop();
    const made = await api.json("GET", `/v1/sandboxes/${branchId}`);
    if (made.source?.snapshot_id !== snapId) throw new Error(`branch ${JSON.stringify(made)}`);
    await timeline.getByLabel(`Select ${snapId}`).check();
    await timeline.getByLabel("Select now").check();
    await timeline.getByRole("button", { name: "Compare selected" }).click();
    const diff = timeline.getByLabel("Diff", { exact: true });
    await diff.getByText("/workspace/later.txt", { exact: true }).waitFor({ timeout: 30_000 });
    await timeline.getByLabel("Diff of /workspace/later.txt").getByText("+later").waitFor();
    await shot("timeline.png");
    await api.call("DELETE", `/v1/sandboxes/${branchId}`);
    // A directory snapshot is mounted, never started from: its point offers that instead.
    const dir = await api.json("POST", `/v1/sandboxes/${sandboxId}/snapshots`, { path: "/workspace" });
    const dirPoint = timeline.getByLabel(`Snapshot ${dir.id}`);
    await dirPoint.getByText("directory /workspace").waitFor({ timeout: 30_000 });
    if (await dirPoint.getByRole("button", { name: `New sandbox from ${dir.id}` }).count()) {
      throw new Error("a directory snapshot offers a new sandbox from it, which the daemon refuses");
    }
    const before = new Set((await api.json("GET", "/v1/sandboxes")).sandboxes.map((s) => s.id));
    await dirPoint.getByRole("button", { name: `Mount ${dir.id} in a new sandbox` }).click();
    let mounted;
    await until("the sandbox that mounts the directory snapshot", async () => {
      mounted = (await api.json("GET", "/v1/sandboxes")).sandboxes.find((s) => !before.has(s.id));
      return mounted !== undefined;
    });
    const mounts = await api.json("GET", `/v1/sandboxes/${mounted.id}/mounts`);
    if (JSON.stringify(mounts.mounts) !== JSON.stringify([{ snapshot_id: dir.id, path: "/workspace" }])) {
      throw new Error(`mounts ${JSON.stringify(mounts)}`);
    }
    // The sandbox that mounts it is a branch of the directory snapshot, with its path.
    await dirPoint.locator(".branch", { hasText: "mounts it at /workspace" }).locator(`a[href="#/sandbox/${mounted.id}"]`).waitFor({ timeout: 30_000 });
    await api.call("DELETE", `/v1/sandboxes/${mounted.id}`);
  });

  await steps.step("network: a refused policy keeps the form, edit the policy, see a denied flow appear, open a forwarded port", async () => {
    await page.getByRole("button", { name: "Network", exact: true }).click();
    const net = page.getByRole("region", { name: "Network" });
    const policy = net.getByRole("form", { name: "Network policy" });
    await policy.getByLabel("Allow all").waitFor();
    if (!(await policy.getByLabel("Allow all").isChecked())) throw new Error("a new sandbox's policy is not allow-all");
    await policy.getByLabel("Rules").check();
    const domains = policy.getByLabel("Allowed domains");
    // As you type: a malformed pattern is named and the policy cannot be saved.
    await domains.fill("*.*.test");
    await policy.getByLabel("Domain mistakes").getByText("more than one wildcard").waitFor();
    if (!(await policy.getByRole("button", { name: "Save policy" }).isDisabled())) throw new Error("saveable with a bad domain");
    // What only the daemon refuses (too many domains): its message, and nothing typed is lost.
    const many = Array.from({ length: 300 }, (_, i) => `d${i}.example.test`).join("\n");
    await domains.fill(many);
    await policy.getByRole("button", { name: "Save policy" }).click();
    await policy.getByRole("alert").filter({ hasText: "network_policy.allow" }).waitFor();
    if ((await domains.inputValue()) !== many) throw new Error("the refused domains were lost");
    // The real edit: a domain allow-list, the gateway (where the daemon is) denied by subnet,
    // and a brokered credential whose value must never come back.
    await domains.fill("*.example.test\napi.example.test");
    await policy.getByLabel("Denied subnets").fill("10.0.2.2/32");
    await policy.getByRole("button", { name: "Add a brokered header" }).click();
    await policy.getByLabel("Brokered domain 1").fill("api.example.test");
    await policy.getByLabel("Header value 1").fill("Bearer ui-secret");
    await policy.getByRole("button", { name: "Save policy" }).click();
    await policy.getByText("Unsaved changes").waitFor({ state: "detached" });
    const s = await api.json("GET", `/v1/sandboxes/${sandboxId}`);
    const shown = JSON.stringify(s.network_policy);
    if (!shown.includes("10.0.2.2/32") || !shown.includes("*.example.test") || shown.includes("ui-secret") || !shown.includes("[redacted]")) {
      throw new Error(`policy after save: ${shown}`);
    }
    if ((await policy.getByLabel("Header value 1").getAttribute("placeholder")) !== "[redacted] (unchanged)") throw new Error("the brokered value is not shown as kept");

    // A denied flow: the sandbox tries the daemon's own port through the gateway (the daemon
    // listens on 127.0.0.1; the stack refuses it before any host socket is opened).
    const tried = await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["sh", "-c", `curl -sS -m 5 http://10.0.2.2:${daemon.port}/`],
    });
    if (tried.exit_code === 0) throw new Error("curl reached the daemon through the gateway");
    const row = net.locator("tr.denied", { hasText: `10.0.2.2:${daemon.port}` });
    await row.first().waitFor({ timeout: 20_000 });
    await row.first().getByText("subnets.deny 10.0.2.2/32").waitFor();
    await net.getByLabel("Denied only").check();
    await row.first().waitFor();

    // A forwarded port: a server in the sandbox, exposed from the tab, opened from its link.
    await api.json("POST", `/v1/sandboxes/${sandboxId}/commands`, {
      argv: ["perl", "-MIO::Socket::INET", "-e",
        '$s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die; while($c=$s->accept){while(<$c>){last if /^\\r?$/} print $c "HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nhello from the sandbox\\n"; close $c}'],
      detached: true,
    });
    const ports = net.getByRole("form", { name: "Expose a port" });
    await ports.getByLabel("Sandbox port").fill("70000");
    await ports.getByRole("button", { name: "Expose" }).click();
    await net.getByRole("alert").filter({ hasText: "port" }).waitFor();
    if ((await ports.getByLabel("Sandbox port").inputValue()) !== "70000") throw new Error("the refused port was lost");
    await ports.getByLabel("Sandbox port").fill("8000");
    await ports.getByRole("button", { name: "Expose" }).click();
    const link = net.getByRole("link", { name: "Open port 8000" });
    await link.waitFor({ timeout: 20_000 });
    const url = await link.getAttribute("href");
    await until("the sandbox's server behind the forwarded port", async () => (await fetch(url).then((r) => r.text())).includes("hello from the sandbox"), 20_000);
    const [tab] = await Promise.all([context.waitForEvent("page"), link.click()]);
    await tab.getByText("hello from the sandbox").waitFor({ timeout: 20_000 });
    await tab.close();
    await net.getByLabel("Denied only").uncheck();
    await shot("network.png");
    await net.getByRole("button", { name: "Remove port 8000" }).click();
    await link.waitFor({ state: "detached" });
    const left = await api.json("GET", `/v1/sandboxes/${sandboxId}/ports`);
    if (left.ports.length !== 0) throw new Error(`ports left: ${JSON.stringify(left)}`);
  });

  await steps.step("stop the sandbox", async () => {
    await page.getByRole("button", { name: `Stop ${NAME}` }).click();
    await page.getByLabel("State stopped").waitFor({ timeout: 60_000 });
    const s = await api.json("GET", `/v1/sandboxes/${sandboxId}`);
    if (s.status !== "stopped") throw new Error(`status ${s.status}`);
  });

  await steps.step("delete the sandbox", async () => {
    await page.getByRole("button", { name: `Delete ${NAME}` }).click();
    await until("the list's address", async () => /#\/$/.test(page.url()));
    await until("the row to go", async () => (await page.locator(`tr[data-sandbox="${sandboxId}"]`).count()) === 0);
    const r = await api.call("GET", `/v1/sandboxes/${sandboxId}`, undefined, [404]);
    if (r.status !== 404) throw new Error(`still there: ${r.status}`);
    sandboxId = null;
  });

  await steps.step("the Images page lists Belljar's images, as GET /v1/images does", async () => {
    await page.getByRole("link", { name: "Images", exact: true }).click();
    await until("the Images page's address", async () => /#\/images$/.test(page.url()));
    const table = page.getByRole("table", { name: "Images" });
    await table.waitFor();
    const listed = await api.json("GET", "/v1/images");
    // The image store is the machine's (shared with other tests and the user's images): every
    // listed name has a row, an unnamed image its id.
    for (const i of listed.filter((i) => i.status === "ready")) {
      const row = i.name.startsWith("sha256:") ? table.locator(`tr:has(td[title="${i.name}"])`) : imageRow(i.name);
      await row.locator(".badge.ready").waitFor();
    }
    await imageRow("base").getByText("Belljar").waitFor();
  });

  await steps.step("build an image from a Dockerfile typed in the page, then again from the step cache", async () => {
    const form = page.getByRole("form", { name: "Build an image" });
    await form.getByLabel("Tag").fill(IMAGE);
    await form.getByLabel("Dockerfile").fill("FROM base\nRUN echo hi > /hi\n");
    await form.getByRole("button", { name: "Build" }).click();
    await form.getByRole("status", { name: "Build status" }).filter({ hasText: `Built ${IMAGE}` }).waitFor({ timeout: 180_000 });
    const log = form.getByLabel("Build log");
    await log.locator('li.step[data-step="2"]').filter({ hasText: "[2/2] RUN echo hi" }).waitFor();
    const built = (await api.json("GET", "/v1/images")).find((i) => i.name === IMAGE);
    if (!built?.size_bytes) throw new Error(`the built image is not listed with a size: ${JSON.stringify(built)}`);
    const row = imageRow(IMAGE);
    await row.getByLabel("Size").filter({ hasText: /\d+(\.\d)? (B|KiB|MiB|GiB)/ }).waitFor();
    await row.locator(".badge.ready").waitFor();
    // The same Dockerfile again: every step comes from the step cache.
    await form.getByRole("button", { name: "Build" }).click();
    await form.getByRole("status", { name: "Build status" }).filter({ hasText: `Built ${IMAGE}` }).waitFor({ timeout: 60_000 });
    await log.locator('li.step[data-step="2"]').filter({ hasText: "CACHED" }).waitFor();
    await shot("images.png");
  });

  await steps.step("the create dialog offers every image; a sandbox from the built one has its /hi", async () => {
    await page.getByRole("button", { name: `New sandbox from ${IMAGE}` }).click();
    const dialog = page.getByRole("dialog", { name: "New sandbox" });
    await dialog.waitFor();
    const select = dialog.getByLabel("Image");
    if ((await select.inputValue()) !== IMAGE) throw new Error(`the dialog starts from ${await select.inputValue()}`);
    const offered = await select.locator("option").evaluateAll((os) => os.map((o) => o.value));
    const listed = (await api.json("GET", "/v1/images")).map((i) => i.name);
    for (const n of listed) if (!offered.includes(n)) throw new Error(`the dialog does not offer ${n}: ${offered}`);
    await dialog.getByLabel("Name").fill("ui-image");
    await dialog.getByRole("button", { name: "Create sandbox" }).click();
    await until("the new sandbox's address", async () => /#\/sandbox\/sbx_/.test(page.url()), 120_000);
    imageSandboxId = decodeURIComponent(new URL(page.url()).hash.split("/")[2]);
    const s = await api.json("GET", `/v1/sandboxes/${imageSandboxId}`);
    if (s.image !== IMAGE) throw new Error(`made from ${s.image}`);
    const hi = await api.call("GET", `/v1/sandboxes/${imageSandboxId}/files?path=${encodeURIComponent("/hi")}`);
    if (hi.body.toString("utf8") !== "hi\n") throw new Error(`/hi holds ${JSON.stringify(hi.body.toString("utf8"))}`);
  });

  await steps.step("removing the image is refused while the sandbox uses it, and goes after", async () => {
    await page.getByRole("link", { name: "Images", exact: true }).click();
    const row = imageRow(IMAGE);
    await row.getByLabel("Used by").getByRole("link", { name: "ui-image" }).waitFor();
    await row.getByRole("button", { name: `Remove ${IMAGE}` }).click();
    await page.getByRole("alert", { name: "Image action error" }).filter({ hasText: "conflict" }).waitFor();
    if ((await api.json("GET", "/v1/images")).every((i) => i.name !== IMAGE)) throw new Error("removed while in use");
    await api.call("DELETE", `/v1/sandboxes/${imageSandboxId}`);
    imageSandboxId = null;
    await row.getByLabel("Used by").getByRole("link", { name: "ui-image" }).waitFor({ state: "detached" });
    await row.getByRole("button", { name: `Remove ${IMAGE}` }).click();
    await row.waitFor({ state: "detached" });
    if ((await api.json("GET", "/v1/images")).some((i) => i.name === IMAGE)) throw new Error("still listed");
  });

  await steps.step("prune, after a confirm, and see what it reclaimed", async () => {
    // A plain prune only: the store is the machine's, and its step cache other builds' to keep.
    await page.getByRole("button", { name: "Prune…" }).click();
    const dialog = page.getByRole("dialog", { name: "Prune images" });
    await dialog.getByRole("button", { name: "Cancel" }).click();
    await dialog.waitFor({ state: "hidden" });
    await page.getByRole("button", { name: "Prune…" }).click();
    await dialog.getByRole("button", { name: "Prune", exact: true }).click();
    await page.getByRole("status", { name: "Prune result" }).filter({ hasText: /Removed \d+ images?, reclaimed|Nothing to prune/ }).waitFor({ timeout: 60_000 });
  });

  await steps.step("a pull from a registry that is not there shows its error code", async () => {
    const form = page.getByRole("form", { name: "Pull an image" });
    await form.getByLabel("Image reference").fill("127.0.0.1:1/none:1");
    await form.getByRole("button", { name: "Pull" }).click();
    await form.getByRole("alert", { name: "Pull error" }).filter({ hasText: "registry_unavailable" }).waitFor({ timeout: 60_000 });
    await form.getByRole("button", { name: "Pull" }).waitFor();
  });
} finally {
  if (steps.failed && page) {
    const at = join(h.home, "failure.png");
    await page.screenshot({ path: at }).catch(() => {});
    console.log(`      page at the failure: ${at} (${page.url()})`);
  }
  if (sandboxId) await api.call("DELETE", `/v1/sandboxes/${sandboxId}`).catch(() => {});
  if (imageSandboxId) await api.call("DELETE", `/v1/sandboxes/${imageSandboxId}`).catch(() => {});
  await context?.close().catch(() => {});
  await daemon?.stop();
  log.end();
  if (steps.failed) console.log(`      daemon log: ${logFile}`);
  else h.remove();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(steps.report());
