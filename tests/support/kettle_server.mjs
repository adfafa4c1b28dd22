// Test support: start the real `kettle serve` on a free loopback port (the
// bundled demo model unless args name another) and wait until /health answers.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

// Benches record into the eval history: a test's go to a file of its own, not the user's.
process.env.KETTLE_EVALS_DB ??= `${process.env.TMPDIR ?? '/tmp'}/kettle-test-evals-${process.pid}.sqlite`;

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

// Returns { proc, port, base, stderr, exited, exit } once /health is ok (10 s at most).
export async function startServer(args = []) {
  const port = await freePort();
  const proc = spawn(kettle, ['serve', '--port', String(port), '--threads', '2', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const server = { proc, port, stderr: '', exited: null, base: `http://127.0.0.1:${port}` };
  proc.stderr.on('data', (d) => { server.stderr += d; });
  server.exit = new Promise((r) => proc.on('exit', (code, signal) => { server.exited = { code, signal }; r(server.exited); }));
  for (let i = 0; i < 100 && !server.exited; i++) {
    try { if ((await fetch(`${server.base}/health`)).ok) return server; } catch { /* not up yet */ }
    await sleep(100);
  }
  throw new Error(`kettle serve did not come up: ${server.stderr}`);
}

export function stopServer(server) {
  if (server && !server.exited) server.proc.kill('SIGKILL');
}

// The JSON payloads of a server-sent-events response, as they arrive ([DONE] and comments skipped).
export async function* sseJson(res) {
  const decoder = new TextDecoder();
  let pending = '';
  for await (const bytes of res.body) {
    pending += decoder.decode(bytes, { stream: true });
    const events = pending.split('\n\n');
    pending = events.pop();
    for (const e of events) if (e.startsWith('data: {')) yield JSON.parse(e.slice(6));
  }
}
