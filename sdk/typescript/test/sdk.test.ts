// The SDK against a real daemon (sdk/run-tests.sh starts one and sets BELLJAR_HOME): sandboxes,
// commands (waited, detached, streamed, killed, stdin, aborted), files, a terminal, snapshots
// and restore, and the API's error codes on bad input.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { after, before, describe, test } from "node:test";

import { BelljarError, Sandbox, Snapshots } from "../src/index.js";

const tag = `ts-${process.pid}`;
let sbx: Sandbox;

async function rejectsWith(p: Promise<unknown>, code: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof BelljarError, `not a BelljarError: ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

before(async () => {
  sbx = await Sandbox.create({ tags: { suite: tag }, env: { GREETING: "hi" }, timeout_ms: 600_000 });
});

after(async () => {
  for (const s of await Sandbox.list({ tag: `suite=${tag}` })) await s.delete();
});

describe("sandboxes", () => {
  test("create, get, list by tag, set tags", async () => {
    assert.equal(sbx.status, "running");
    assert.match(sbx.id, /^sbx_/);
    const again = await Sandbox.get({ sandboxId: sbx.id });
    assert.equal(again.data.env.GREETING, "hi");
    const listed = await Sandbox.list({ tag: `suite=${tag}` });
    assert.deepEqual(listed.map((s) => s.id), [sbx.id]);
    await sbx.setTags({ suite: tag, extra: "1" });
    assert.deepEqual((await sbx.refresh()).data.tags, { suite: tag, extra: "1" });
  });

  test("over 127.0.0.1 with the bearer token, as the CLI's files give them", async () => {
    const home = process.env.BELLJAR_HOME!;
    const baseUrl = `http://127.0.0.1:${readFileSync(join(home, "run", "port"), "utf8").trim()}`;
    const token = readFileSync(join(home, "config", "token"), "utf8").trim();
    const viaTcp = await Sandbox.get({ sandboxId: sbx.id, baseUrl, token });
    assert.equal(viaTcp.transport.socketPath, undefined);
    assert.equal((await viaTcp.runCommand("echo", ["tcp"])).stdout(), "tcp\n");
    const term = await viaTcp.openTerminal();
    assert.match(term.commandId ?? "", /^cmd_/);
    term.write("exit 0\n");
    assert.deepEqual(await term.exited, { exitCode: 0, signal: null });
    await rejectsWith(Sandbox.get({ sandboxId: sbx.id, baseUrl, token: "wrong" }), "unauthorized");
  });

  test("errors carry the API's code", async () => {
    await rejectsWith(Sandbox.get({ sandboxId: "sbx_nosuch" }), "not_found");
    await rejectsWith(Sandbox.create({ memory_mib: 1 }), "bad_request");
    await rejectsWith(sbx.runCommand({ cmd: "" }), "bad_request");
  });
});

describe("commands", () => {
  test("waited: exit code, stdout, stderr, env", async () => {
    const done = await sbx.runCommand("sh", ["-c", "echo $GREETING $X; echo oops >&2; exit 3"]);
    assert.equal(done.exitCode, 3);
    assert.equal(done.stdout(), "hi\n");
    assert.equal(done.stderr(), "oops\n");
    const withEnv = await sbx.runCommand({ cmd: "sh", args: ["-c", "echo $X; pwd"], env: { X: "y" }, cwd: "/tmp" });
    assert.equal(withEnv.stdout(), "y\n/tmp\n");
  });

  test("detached, streamed logs as they arrive, then wait", async () => {
    const cmd = await sbx.runCommand({ cmd: "sh", args: ["-c", "echo one; read _; echo two"], detached: true, stdin: true });
    const seen: string[] = [];
    const logs = cmd.logs({ follow: true })[Symbol.asyncIterator]();
    const first = await logs.next();
    seen.push(first.value.data.toString());
    // "one" arrived while the command still waits on stdin: it is streamed, not buffered.
    assert.deepEqual(seen, ["one\n"]);
    await cmd.writeStdin("go\n", { close: true });
    for (let r = await logs.next(); !r.done; r = await logs.next()) seen.push(r.value.data.toString());
    assert.equal(seen.join(""), "one\ntwo\n");
    const done = await cmd.wait();
    assert.equal(done.exitCode, 0);
  });

  test("output piped into writables", async () => {
    const out = new PassThrough();
    const chunks: Buffer[] = [];
    out.on("data", (c: Buffer) => chunks.push(c));
    const done = await sbx.runCommand({ cmd: "printf", args: ["a\\nb\\n"], stdout: out });
    assert.equal(done.exitCode, 0);
    assert.equal(Buffer.concat(chunks).toString(), "a\nb\n");
  });

  test("kill and abort", async () => {
    const cmd = await sbx.runCommand({ cmd: "sleep", args: ["60"], detached: true });
    await cmd.kill("KILL");
    const done = await cmd.wait();
    assert.equal(done.data.signal, 9);
    // Aborted once its output shows it runs: the wait rejects and the command is killed.
    const ac = new AbortController();
    const out = new PassThrough();
    out.on("data", (c: Buffer) => c.toString().includes("started") && ac.abort());
    await rejectsWith(
      sbx.runCommand({ cmd: "sh", args: ["-c", "echo started; sleep 60"], stdout: out, signal: ac.signal }),
      "aborted",
    );
    const cmds = await sbx.transport.json<{ commands: { id: string; argv: string[] }[] }>("GET", `/v1/sandboxes/${sbx.id}/commands`);
    const aborted = cmds.commands.find((c) => c.argv.includes("echo started; sleep 60"))!;
    const killed = await (await sbx.getCommand(aborted.id)).wait();
    assert.equal(killed.data.signal, 9);
  });
});

describe("files", () => {
  test("write, read, stat, list, move, remove", async () => {
    const entry = await sbx.files.write("/workspace/d/a.txt", "héllo\n", { mode: 0o600 });
    assert.equal(entry.size, Buffer.byteLength("héllo\n"));
    assert.equal(entry.mode, 0o600);
    await sbx.files.write("/workspace/d/b.bin", new Uint8Array([0, 255, 1]));
    assert.equal((await sbx.files.read("/workspace/d/a.txt")).toString(), "héllo\n");
    assert.deepEqual([...(await sbx.files.read("/workspace/d/b.bin"))], [0, 255, 1]);
    assert.deepEqual((await sbx.files.list("/workspace/d")).map((e) => e.name), ["a.txt", "b.bin"]);
    await sbx.files.mkdir("/workspace/d/sub/deeper");
    await sbx.files.move("/workspace/d/a.txt", "/workspace/d/sub/a.txt");
    assert.equal((await sbx.files.stat("/workspace/d/sub/a.txt")).kind, "file");
    assert.equal(await sbx.files.readOrNull("/workspace/d/a.txt"), null);
    await sbx.files.remove("/workspace/d", { recursive: true });
    assert.equal(await sbx.files.statOrNull("/workspace/d"), null);
    await rejectsWith(sbx.files.read("/workspace"), "is_a_directory");
  });
});

describe("terminal", () => {
  test("a shell echoes, resizes and exits", async () => {
    const term = await sbx.openTerminal({ rows: 24, cols: 80 });
    assert.match(term.commandId ?? "", /^cmd_/);
    let out = "";
    const saw = (needle: string) =>
      new Promise<void>((resolve) => {
        const check = () => out.includes(needle) && (term.off("data", on), resolve());
        const on = (d: Buffer) => ((out += d.toString()), check());
        term.on("data", on);
        check();
      });
    term.resize(30, 100);
    term.write("stty size; echo mark-$((6*7))\n");
    await saw("mark-42");
    assert.match(out, /30 100/);
    term.write("exit 5\n");
    assert.deepEqual(await term.exited, { exitCode: 5, signal: null });
    term.close();
  });
});

describe("snapshots", () => {
  test("snapshot a running sandbox and restore it", async () => {
    await sbx.files.write("/workspace/keep.txt", "kept");
    const snap = await sbx.snapshot({ keep_running: true });
    assert.equal(snap.source_sandbox_id, sbx.id);
    assert.equal(sbx.status, "running");
    assert.ok((await Snapshots.list({ sandbox_id: sbx.id })).some((s) => s.id === snap.id));
    const restored = await Sandbox.create({ source: { type: "snapshot", snapshot_id: snap.id }, tags: { suite: tag } });
    assert.equal((await restored.files.read("/workspace/keep.txt")).toString(), "kept");
    await restored.stop();
    assert.equal(restored.status, "stopped");
    await rejectsWith(restored.runCommand("true"), "sandbox_not_running");
    await rejectsWith(Snapshots.get({ snapshotId: "snap_nosuch" }), "not_found");
  });

  test("mount a directory snapshot into a running sandbox and unmount it", async () => {
    await sbx.runCommand("mkdir", ["-p", "/workspace/proj"]);
    await sbx.files.write("/workspace/proj/a.txt", "shared");
    const snap = await sbx.snapshot({ path: "/workspace/proj" });
    const other = await Sandbox.create({ tags: { suite: tag } });
    const m = await other.mountSnapshot(snap.id, "/mnt/proj");
    assert.deepEqual(m, { snapshot_id: snap.id, path: "/mnt/proj" });
    assert.equal((await other.files.read("/mnt/proj/a.txt")).toString(), "shared");
    assert.deepEqual(await other.mounts(), [m]);
    await rejectsWith(other.mountSnapshot(snap.id, "/etc/passwd"), "not_a_directory");
    await other.unmountSnapshot("/mnt/proj");
    assert.deepEqual(await other.mounts(), []);
    await rejectsWith(other.unmountSnapshot("/mnt/proj"), "not_found");
    await other.delete();
  });
});
