// The official OpenAI Node SDK against `xmix serve` on the embedded model (CPU backend): what
// an adopter of xmix does by changing only the base URL. Run by .ci/run:
//   XMIX_BIN=/path/to/xmix node --test testsuite/openai-sdk/
// XMIX_BIN defaults to `xmix` on the PATH. Each test talks to one server started here.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import OpenAI from "openai";

const ADMIN = "sdk-test-token";
let server;
let baseURL;
let client;

before(async () => {
  const bin = process.env.XMIX_BIN || "xmix";
  server = spawn(bin, ["serve", "--backend", "cpu", "--addr", "127.0.0.1:0", "--admin-token", ADMIN], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  baseURL = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`xmix serve did not start in 120 s:\n${log}`)), 120_000);
    server.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/on (http:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    server.on("exit", (code) => reject(new Error(`xmix serve exited (${code}):\n${log}`)));
  });
  client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300_000 });
});

after(async () => {
  if (!server) return;
  const exited = new Promise((resolve) => server.on("exit", resolve));
  server.kill("SIGTERM");
  await exited;
});

const prompt = "Once upon a time";
const greedy = { model: "tiny", temperature: 0 };

async function metric(name) {
  const text = await (await fetch(baseURL + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line === undefined ? undefined : Number(line.split(" ")[1]);
}

async function waitFor(what, cond) {
  for (let i = 0; i < 2000; i++) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.fail(`timed out waiting for ${what}`);
}

test("models.list names the served model", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ["tiny"]);
  const m = await client.models.retrieve("tiny");
  assert.equal(m.id, "tiny");
  assert.equal(m.max_model_len, 512);
});

async function streamedCompletion(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let finish = null;
  let usage = null;
  const exports = {};
  let chunks = 0;
  let fired = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      chunks++;
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
    for (const [k, v] of Object.entries(chunk.xmix?.exports ?? {})) (exports[k] ??= []).push(...v);
    if (chunk.xmix?.fired) fired = chunk.xmix.fired;
  }
  return { text, finish, usage, exports, chunks, fired };
}

test("a completion, whole and streamed, gives the same text", async () => {
  const params = { ...greedy, prompt, max_tokens: 24 };
  const whole = await client.completions.create(params);
  assert.equal(whole.object, "text_completion");
  assert.equal(whole.choices.length, 1);
  assert.ok(whole.choices[0].text.length > 0);
  assert.ok(["stop", "length"].includes(whole.choices[0].finish_reason));
  assert.equal(whole.usage.completion_tokens, 24);
  const s = await streamedCompletion(params);
  assert.equal(s.text, whole.choices[0].text);
  assert.equal(s.finish, whole.choices[0].finish_reason);
  assert.deepEqual(s.usage, whole.usage);
  assert.equal(s.chunks, whole.usage.completion_tokens);
});

test("a chat completion, whole and streamed, gives the same message", async () => {
  const params = {
    ...greedy,
    max_completion_tokens: 20,
    messages: [
      { role: "system", content: "Tell short stories." },
      { role: "user", content: "Tom had a dog." },
      { role: "assistant", content: "The dog was big." },
      { role: "user", content: "What next?" },
    ],
  };
  const whole = await client.chat.completions.create(params);
  assert.equal(whole.object, "chat.completion");
  assert.equal(whole.choices[0].message.role, "assistant");
  const content = whole.choices[0].message.content;
  assert.ok(content.length > 0);
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = "";
  let role = null;
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, content);
  assert.equal(finish, whole.choices[0].finish_reason);
});

test("the xmix extension steers, and probe scores come per generated token, whole and streamed", async () => {
  const params = { ...greedy, prompt, max_tokens: 24 };
  const plain = await client.completions.create(params);
  const steered = await client.completions.create({ ...params, xmix: { apps: ["tiny-steer"] } });
  assert.notEqual(steered.choices[0].text, plain.choices[0].text, "steering changed nothing");
  assert.deepEqual(steered.xmix.apps, ["tiny-steer"]);
  assert.deepEqual(plain.xmix.exports, {});
  // Proof of firing: the steering op changed this many (token, layer) sites; none without apps.
  assert.ok(steered.xmix.fired["tiny-steer.op0"] > 0, JSON.stringify(steered.xmix));
  assert.deepEqual(plain.xmix.fired, {});

  const probed = await client.completions.create({ ...params, xmix: { apps: ["tiny-probe"], prompt_exports: true } });
  const scores = probed.xmix.exports["tiny-probe.happy"];
  assert.equal(scores.length, probed.usage.completion_tokens);
  const isScore = (v) => typeof v === "number" && v >= 0 && v <= 1; // null >= 0 holds in JS
  for (const v of scores) assert.ok(isScore(v), `probe score ${v}`);
  // Asked for, the prompt's reads come at every prompt position; not asked for, not at all.
  const promptScores = probed.xmix.prompt_exports["tiny-probe.happy"];
  assert.equal(promptScores.length, probed.usage.prompt_tokens);
  for (const v of promptScores) assert.ok(isScore(v), `prompt probe score ${v}`);
  assert.equal(probed.choices[0].text, plain.choices[0].text, "a probe reads, it must not change the text");

  assert.ok(probed.xmix.fired["tiny-probe.op0"] > 0);
  const unasked = await client.completions.create({ ...params, xmix: { apps: ["tiny-probe"] } });
  assert.equal(unasked.xmix.prompt_exports, undefined);
  assert.deepEqual(unasked.xmix.exports, probed.xmix.exports);
  const s = await streamedCompletion({ ...params, xmix: { apps: ["tiny-probe"] } });
  assert.deepEqual(s.exports["tiny-probe.happy"], scores);
  assert.deepEqual(s.fired, probed.xmix.fired);
  assert.equal(s.text, probed.choices[0].text);
});

test("xmix.stop_when ends a generation when the probe crosses its threshold", async () => {
  const params = { ...greedy, prompt, max_tokens: 40 };
  const free = await client.completions.create({ ...params, xmix: { apps: ["tiny-probe"] } });
  const scores = free.xmix.exports["tiny-probe.happy"];
  const k = scores.findIndex((v) => v > 0.995);
  assert.ok(k >= 0 && k < 39, `no score above 0.995 to stop at: ${scores}`);
  const stopped = await client.completions.create({
    ...params,
    xmix: { apps: ["tiny-probe"], stop_when: { export: "tiny-probe.happy", op: ">", value: 0.995 } },
  });
  assert.equal(stopped.choices[0].finish_reason, "stop_when");
  assert.equal(stopped.usage.completion_tokens, k + 1);
  assert.ok(free.choices[0].text.startsWith(stopped.choices[0].text));
});

test("an unknown app is a 400 naming it", async () => {
  await assert.rejects(
    client.completions.create({ ...greedy, prompt, max_tokens: 4, xmix: { apps: ["nope"] } }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.equal(err.status, 400);
      assert.match(err.message, /app "nope" is not deployed/);
      assert.equal(err.param, "xmix.apps");
      return true;
    },
  );
  await assert.rejects(client.completions.create({ model: "gpt-4", prompt, max_tokens: 4 }), (err) => {
    assert.ok(err instanceof OpenAI.NotFoundError, String(err));
    return true;
  });
});

test("an aborted stream frees its slot: the engine drops it and serves the next request", async () => {
  const slots = 8; // the embedded model's max_seqs
  const before = await metric("xmix_requests_aborted_total");
  const controllers = [];
  for (let i = 0; i < slots; i++) {
    const ac = new AbortController();
    controllers.push(ac);
    const stream = await client.completions.create(
      { ...greedy, prompt: `Story ${i}: once`, max_tokens: 480, stream: true },
      { signal: ac.signal },
    );
    const it = stream[Symbol.asyncIterator]();
    await it.next(); // the request runs
  }
  assert.equal(await metric("xmix_requests_running"), slots);
  for (const ac of controllers) ac.abort();
  await waitFor("the aborted requests to leave", async () => (await metric("xmix_requests_aborted_total")) === before + slots);
  await waitFor("the engine to be idle", async () => (await metric("xmix_requests_running")) === 0 && (await metric("xmix_kv_cache_usage_ratio")) === 0);
  const next = await client.completions.create({ ...greedy, prompt, max_tokens: 4 });
  assert.equal(next.usage.completion_tokens, 4);
});

test("the control plane replaces a vector and the next request's output changes", async () => {
  const params = { ...greedy, prompt, max_tokens: 24, xmix: { apps: ["tiny-steer"] } };
  const patch = (body, token = ADMIN) =>
    fetch(baseURL + "/v1/apps/tiny-steer", {
      method: "PATCH",
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  const apps = await (await fetch(baseURL + "/v1/apps")).json();
  const steer = apps.apps.find((a) => a.name === "tiny-steer");
  const width = steer.vectors[0].width;
  const beforeText = (await client.completions.create(params)).choices[0].text;
  assert.equal((await patch({ on_by_default: true }, "wrong")).status, 401);
  const flipped = Array.from({ length: width }, (_, i) => Math.cos(i)); // another direction
  const res = await patch({ vectors: { happy: flipped } });
  assert.equal(res.status, 200, await res.text());
  const afterText = (await client.completions.create(params)).choices[0].text;
  assert.notEqual(afterText, beforeText, "the replaced vector changed nothing");
  const bad = await patch({ vectors: { happy: [1, 2, 3] } });
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).error.message, /3 values; the param has 256/);
  assert.equal((await client.completions.create(params)).choices[0].text, afterText, "a refused change changed something");
});
