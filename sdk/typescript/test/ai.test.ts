// The AI SDK adapter through the AI SDK itself, against a real daemon: `generateText` with the
// AI SDK's mock language model calling a tool that runs a command through
// `experimental_sandbox`, the model reading the command's output back; then the rest of the
// session interface (spawn with stdin, files, stat, listing, delete, abort) on the same
// sandbox.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";

import { BelljarError, Sandbox, toSandboxSession } from "../src/index.js";

let sbx: Sandbox;

before(async () => {
  sbx = await Sandbox.create({ tags: { suite: `ai-${process.pid}` }, timeout_ms: 600_000 });
});

after(async () => {
  await sbx.delete();
});

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

test("generateText runs a tool's command in the sandbox through experimental_sandbox", async () => {
  const shell = tool({
    description: "Run a shell command",
    inputSchema: jsonSchema<{ command: string; workingDirectory?: string }>({
      type: "object",
      properties: { command: { type: "string" }, workingDirectory: { type: "string" } },
      required: ["command"],
    }),
    execute: async ({ command, workingDirectory }, { abortSignal, experimental_sandbox }) => {
      if (!experimental_sandbox) throw new Error("no experimental sandbox");
      return experimental_sandbox.run({ command, workingDirectory, abortSignal, env: { WHO: "model" } });
    },
  });
  // First turn: call the tool. Second turn: answer with what the tool returned.
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const result = prompt.flatMap((m) => (m.role === "tool" ? m.content : [])).find((p) => p.type === "tool-result");
      if (!result) {
        return {
          content: [
            {
              type: "tool-call",
              toolCallId: "call-1",
              toolName: "shell",
              input: JSON.stringify({ command: "echo hello $WHO from $(pwd); uname -s; echo err >&2; exit 4", workingDirectory: "/tmp" }),
            },
          ],
          finishReason: { unified: "tool-calls", raw: "tool_calls" },
          usage,
          warnings: [],
        };
      }
      const output = result.output as { type: string; value: unknown };
      return {
        content: [{ type: "text", text: `tool said ${JSON.stringify(output.value)}` }],
        finishReason: { unified: "stop", raw: "stop" },
        usage,
        warnings: [],
      };
    },
  });

  const session = toSandboxSession(sbx);
  assert.match(session.description, new RegExp(`${sbx.id}.*image base`));
  assert.match(session.description, /working directory is \/workspace/);
  assert.match(session.description, /Network policy: "allow-all"/);

  const result = await generateText({
    model,
    tools: { shell },
    experimental_sandbox: session,
    stopWhen: stepCountIs(2),
    prompt: "Say hello from the sandbox.",
  });

  const toolResults = result.steps.flatMap((s) => s.toolResults);
  assert.equal(toolResults.length, 1);
  assert.deepEqual(toolResults[0]!.output, {
    exitCode: 4,
    stdout: "hello model from /tmp\nLinux\n",
    stderr: "err\n",
  });
  assert.equal(result.text, `tool said ${JSON.stringify({ exitCode: 4, stdout: "hello model from /tmp\nLinux\n", stderr: "err\n" })}`);
});

test("the rest of the session: spawn with stdin, files, stat, listing, delete, abort", async () => {
  const session = toSandboxSession(sbx, { workingDirectory: "/workspace" });

  const proc = await session.spawn({ command: "read line; echo got:$line; echo warn >&2", stdin: true });
  const writer = proc.stdin.getWriter();
  await writer.write(new TextEncoder().encode("ping\n"));
  await writer.close();
  const [out, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()]);
  assert.equal(out, "got:ping\n");
  assert.equal(err, "warn\n");
  assert.deepEqual(await proc.wait(), { exitCode: 0 });

  await session.writeTextFile({ path: "notes/a.txt", content: "one\ntwo\nthree\n" });
  await session.writeBinaryFile({ path: "/workspace/notes/b.bin", content: new Uint8Array([1, 2, 3]) });
  assert.equal(await session.readTextFile({ path: "/workspace/notes/a.txt", startLine: 2, endLine: 3 }), "two\nthree");
  assert.deepEqual([...(await session.readBinaryFile({ path: "notes/b.bin" }))!], [1, 2, 3]);
  assert.equal(await session.readTextFile({ path: "notes/missing" }), null);
  const stream = await session.readFile({ path: "notes/a.txt" });
  assert.equal(await new Response(stream).text(), "one\ntwo\nthree\n");
  await session.run({ command: "ln -s notes/a.txt link" });
  assert.deepEqual(await session.stat({ path: "link" }), { type: "file", size: 14 });
  assert.deepEqual(await session.stat({ path: "notes" }), { type: "directory", size: (await sbx.files.stat("/workspace/notes")).size });
  assert.equal(await session.stat({ path: "nothing" }), null);
  const entries = (await session.listDirectory({ path: "." }))!.map((e) => `${e.name}:${e.type}`).sort();
  assert.deepEqual(entries, ["link:symlink", "notes:directory"]);
  assert.equal(await session.listDirectory({ path: "nowhere" }), null);
  assert.equal(await session.deleteFile({ path: "notes/b.bin" }), true);
  assert.equal(await session.deleteFile({ path: "notes/b.bin" }), false);
  await assert.rejects(Promise.resolve(session.deleteFile({ path: "notes" })), (e: unknown) => e instanceof BelljarError && e.code === "is_a_directory");

  // An abort kills the command: once its first output arrives, abort; `wait` rejects and
  // the sandbox's record shows SIGKILL.
  const ac = new AbortController();
  const long = await session.spawn({ command: "echo begun; sleep 60", abortSignal: ac.signal });
  const first = await long.stdout.getReader().read();
  assert.equal(new TextDecoder().decode(first.value), "begun\n");
  ac.abort();
  await assert.rejects(Promise.resolve(long.wait()));
  const cmds = await sbx.transport.json<{ commands: { id: string; argv: string[] }[] }>("GET", `/v1/sandboxes/${sbx.id}/commands`);
  const aborted = cmds.commands.find((c) => c.argv.some((a) => a.includes("echo begun; sleep 60")))!;
  const killed = await (await sbx.getCommand(aborted.id)).wait();
  assert.equal(killed.data.signal, 9);
});
