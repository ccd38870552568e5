// Unit tests for @mesh/sdk, run against the compiled dist/ with `node --test`.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";

import {
  caller,
  checkToolName,
  createServer,
  defineTool,
  facts,
  FactsMissing,
  parseCaller,
  progress,
  result,
  seatVerb,
  ToolNameError,
  z,
} from "../dist/index.js";

test("seatVerb joins a valid seat and verb and refuses the rest", () => {
  assert.equal(seatVerb("memory", "put"), "memory.put");
  assert.equal(seatVerb("hand-off", "take_next"), "hand-off.take_next");
  for (const [seat, verb] of [["Memory", "put"], ["memory", "a.b"], ["memory", ""], ["", "put"], ["memory", "1put"]]) {
    assert.throws(() => seatVerb(seat, verb), ToolNameError, `${seat}.${verb}`);
  }
});

test("checkToolName allows own tools and seat verbs, not two dots", () => {
  assert.equal(checkToolName("greet"), "greet");
  assert.equal(checkToolName("memory.get"), "memory.get");
  assert.throws(() => checkToolName("a.b.c"), /more than one dot/);
  assert.throws(() => checkToolName("has space"), ToolNameError);
  const server = createServer();
  assert.throws(() => defineTool(server, "bad name", {}, () => result("x")), ToolNameError);
});

test("facts names every missing variable and creates the data folder", () => {
  assert.throws(() => facts({ MESH_NODE: "n1" }), (e) => {
    assert.ok(e instanceof FactsMissing);
    assert.deepEqual(e.missing, ["MESH_MODULE", "MESH_BUNDLE", "MESH_BUNDLE_DIR", "MESH_DATA_DIR"]);
    return true;
  });
  const dataDir = join(mkdtempSync(join(tmpdir(), "mesh-sdk-")), "data", "nested");
  const env = { MESH_NODE: "n1", MESH_MODULE: "m", MESH_BUNDLE: "tools", MESH_BUNDLE_DIR: "/b", MESH_DATA_DIR: dataDir };
  assert.deepEqual(facts(env), { node: "n1", module: "m", bundle: "tools", bundleDir: "/b", dataDir });
  assert.ok(statSync(dataDir).isDirectory());
});

test("result builds text, structured content and error results", () => {
  assert.deepEqual(result("hi"), { content: [{ type: "text", text: "hi" }] });
  assert.deepEqual(result("hi", { a: 1 }, { isError: true }), {
    content: [{ type: "text", text: "hi" }],
    structuredContent: { a: 1 },
    isError: true,
  });
});

test("caller reads _meta's mesh/caller, checks every field, and is null otherwise", () => {
  const meta = { "mesh/caller": { account: "ALICE", user: "alice", name: "cli", via: "bus" } };
  assert.deepEqual(caller({ _meta: meta }), { account: "ALICE", user: "alice", name: "cli", via: "bus", person: null, id: "ALICE/alice" });
  assert.deepEqual(caller({ _meta: { "mesh/caller": { account: "BOB", via: "local" } } }),
    { account: "BOB", user: null, name: null, via: "local", person: null, id: "local:BOB" });
  // One id per caller: names escaped; the local caller and a person apart from every bus caller.
  const alice = { iss: "https://idp.example/", sub: "alice", name: "Alice" };
  for (const [given, id] of [
    [{ account: "a", user: "b/c", via: "bus" }, "a/b%2Fc"],
    [{ account: "a/b", user: "c", via: "bus" }, "a%2Fb/c"],
    [{ account: "local:ops", via: "bus" }, "local%3Aops"],
    [{ account: "faces", user: "f", via: "mcp", person: alice }, "person:https%3A%2F%2Fidp.example%2F/alice"],
  ]) {
    assert.equal(caller({ _meta: { "mesh/caller": given } }).id, id, JSON.stringify(given));
  }
  assert.equal(caller({}), null);
  assert.equal(caller({ _meta: { progressToken: 1 } }), null);
  const ok = { account: "A", user: null, name: null, via: "mcp" };
  for (const [bad, why] of [
    [null, /not an object/],
    [{ ...ok, account: 5 }, /account is number/],
    [{ ...ok, user: "" }, /user is empty/],
    [{ ...ok, name: "é".repeat(129) }, /longer than 256 bytes/], // 258 UTF-8 bytes in 129 characters
    [{ ...ok, name: "\ud800x" }, /broken UTF-16/],
    [{ ...ok, via: "bus", person: { iss: "i", sub: "s", name: "n" } }, /a person comes only with via/],
    [{ ...ok, person: { iss: "i", sub: "s" } }, /person.name is undefined/],
    [{ ...ok, via: "BUS" }, /via is not one of/],
  ]) {
    assert.match(parseCaller({ "mesh/caller": bad }), why, JSON.stringify(bad));
  }
});

test("progress needs a token and finite numbers, and stops once the call is cancelled", async () => {
  const sent = [];
  const signal = new AbortController().signal;
  const extra = (meta, s = signal) => ({ _meta: meta, signal: s, sendNotification: async (n) => void sent.push(n) });
  await progress(extra(undefined), 1);
  await progress(extra({ progressToken: { not: "a token" } }), 1);
  const aborted = new AbortController();
  aborted.abort();
  await progress(extra({ progressToken: "t" }, aborted.signal), 1);
  assert.deepEqual(sent, []);
  await progress(extra({ progressToken: "t" }), 0.5, { total: 1, message: "half" });
  assert.deepEqual(sent, [{ method: "notifications/progress", params: { progressToken: "t", progress: 0.5, total: 1, message: "half" } }]);
  await assert.rejects(progress(extra({ progressToken: "t" }), Number.NaN), RangeError);
});

test("progress reaches a client in order (in process)", async () => {
  const server = createServer({ name: "t", version: "1" });
  defineTool(server, "count", {}, async (extra) => { // no input schema: the handler gets only extra
    for (let i = 1; i <= 3; i++) await progress(extra, i, { total: 3, message: `step ${i}` });
    return result("done");
  });
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  const client = new Client({ name: "test", version: "0" });
  await client.connect(clientSide);
  const seen = [];
  const done = await client.callTool({ name: "count", arguments: {} }, undefined, { onprogress: (p) => seen.push(p) });
  assert.equal(done.content[0].text, "done");
  assert.deepEqual(seen, [1, 2, 3].map((i) => ({ progress: i, total: 3, message: `step ${i}` })));
  await client.close();
});

test("a slow call does not hold up a fast one (in process)", async () => {
  const server = createServer({ name: "t", version: "1" });
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  defineTool(server, "slow", {}, async () => (await gate, result("slow")));
  defineTool(server, "fast", { input: { n: z.number() }, output: { n: z.number() } }, ({ n }) => result("fast", { n }));
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  const client = new Client({ name: "test", version: "0" });
  await client.connect(clientSide);
  const slow = client.callTool({ name: "slow", arguments: {} });
  const fast = await client.callTool({ name: "fast", arguments: { n: 7 } });
  assert.deepEqual(fast.structuredContent, { n: 7 });
  release();
  assert.equal((await slow).content[0].text, "slow");
  await client.close();
});

test("over stdio: calls answered out of order, cancel drops a reply, stdout stays protocol, closing stdin exits", async () => {
  const fixture = fileURLToPath(new URL("../fixtures/stdio-server.mjs", import.meta.url));
  const child = spawn(process.execPath, [fixture], { stdio: ["pipe", "pipe", "pipe"] });
  const lines = createInterface({ input: child.stdout });
  const replies = [];
  const waiters = [];
  lines.on("line", (line) => {
    replies.push(JSON.parse(line)); // a non-JSON line (a stray console.log) fails the test here
    waiters.splice(0).forEach((wake) => wake());
  });
  const send = (msg) => child.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
  const until = async (count) => {
    while (replies.length < count) await new Promise((wake) => waiters.push(wake));
  };
  send({ id: 1, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "t", version: "0" } } });
  await until(1);
  assert.equal(replies[0].result.protocolVersion, "2025-11-25");
  send({ method: "notifications/initialized" });
  send({ id: 2, method: "tools/call", params: { name: "sleep", arguments: { ms: 60000 } } });
  for (let i = 3; i < 13; i++) send({ id: i, method: "tools/call", params: { name: "echo", arguments: { text: `t${i}` } } });
  await until(11);
  assert.deepEqual(replies.slice(1).map((r) => r.id).sort((a, b) => a - b), [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
  assert.equal(replies[1].result.structuredContent.text, `t${replies[1].id}`);
  // A cancelled call gets no reply (the library drops it); the session goes on.
  send({ id: 13, method: "tools/call", params: { name: "sleep", arguments: { ms: 60000 } } });
  send({ method: "notifications/cancelled", params: { requestId: 13, reason: "test" } });
  send({ id: 14, method: "ping" });
  await until(12);
  assert.deepEqual(replies[11], { jsonrpc: "2.0", id: 14, result: {} });
  await new Promise((resolve) => setTimeout(resolve, 200)); // room for a reply to 13 that must not come
  assert.equal(replies.find((r) => r.id === 13), undefined);
  const started = Date.now();
  const exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
  child.stdin.end();
  assert.equal(await exited, 0);
  assert.ok(Date.now() - started < 3000, "exits at once although the 60 s call is still running");
});
