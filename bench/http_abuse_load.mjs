// The HTTP layer under abuse and load at once, on loopback, bounded in count
// and time: IDLE connections opened and left silent (re-opened when the
// server's idle deadline closes them), BURST clients connecting at the same
// moment, and STREAMS streaming generations. /health is timed every 20 ms
// throughout; every stream must complete; the server's RSS is sampled.
//   cd tests && KETTLE_BIN=../build/kettle node ../bench/http_abuse_load.mjs [--idle 2000] [--burst 500]
//        [--streams 64] [--max-tokens 64] [-- extra serve flags...]
import { connect } from 'node:net';
import { readFileSync } from 'node:fs';
import { sleep, startServer, stopServer } from '../tests/support/kettle_server.mjs';

const args = process.argv.slice(2);
const flag = (name, fallback) => { const i = args.indexOf(name); return i >= 0 ? Number(args[i + 1]) : fallback; };
const idleCount = flag('--idle', 2000);
const burstCount = flag('--burst', 500);
const streamCount = flag('--streams', 64);
const maxTokens = flag('--max-tokens', 64);
const extra = args.includes('--') ? args.slice(args.indexOf('--') + 1) : [];

const server = await startServer(['--batch', '16', '--max-queue', String(Math.max(64, streamCount)), ...extra]);
const rss = () => Number(readFileSync(`/proc/${server.proc.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
const rssStart = rss();
let running = true;

// Idle connections, kept at the target count until the run ends.
const idle = new Set();
function openIdle() {
  if (!running) return;
  const s = connect(server.port, '127.0.0.1');
  s.on('data', () => {});
  s.on('error', () => {});
  s.on('close', () => { idle.delete(s); if (running) setTimeout(openIdle, 10); });
  idle.add(s);
}
for (let i = 0; i < idleCount; i++) { openIdle(); if (i % 200 === 199) await sleep(20); }

// /health timed every 20 ms.
const healthMs = [];
let healthFailures = 0;
const prober = (async () => {
  while (running) {
    const t = performance.now();
    try {
      const r = await fetch(`${server.base}/health`, { signal: AbortSignal.timeout(5000) });
      await r.text();
      if (r.status !== 200) healthFailures++;
    } catch { healthFailures++; }
    healthMs.push(performance.now() - t);
    await sleep(20);
  }
})();

const rssPeak = { v: rssStart };
const sampler = setInterval(() => { rssPeak.v = Math.max(rssPeak.v, rss()); }, 100);

// The burst: BURST raw clients connecting at once, each asking /health and closing.
function rawHealth() {
  return new Promise((resolve) => {
    const s = connect(server.port, '127.0.0.1');
    let got = '';
    const timer = setTimeout(() => { s.destroy(); resolve(false); }, 30000);
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n'));
    s.on('data', (d) => { got += d; });
    s.on('close', () => { clearTimeout(timer); resolve(got.startsWith('HTTP/1.1 200')); });
    s.on('error', () => {});
  });
}

async function stream(i) {
  const res = await fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: `Story ${i}: once upon a time`, max_tokens: maxTokens, ignore_eos: true, stream: true }),
  });
  const text = await res.text();
  return res.status === 200 && text.includes('data: [DONE]') && (text.match(/"text"/g) || []).length >= maxTokens;
}

const t0 = performance.now();
const streams = Promise.all(Array.from({ length: streamCount }, (_, i) => stream(i)));
await sleep(200);
const burstStart = performance.now();
const burst = await Promise.all(Array.from({ length: burstCount }, rawHealth));
const burstSeconds = (performance.now() - burstStart) / 1000;
const streamResults = await streams;
const seconds = (performance.now() - t0) / 1000;
running = false;
await prober;
clearInterval(sampler);
const stats = await (await fetch(`${server.base}/stats`)).json();
for (const s of idle) s.destroy();
stopServer(server);

const sorted = [...healthMs].sort((a, b) => a - b);
const pct = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
const result = {
  idle_connections: idleCount, burst: burstCount, streams: streamCount, max_tokens: maxTokens,
  streams_completed: streamResults.filter(Boolean).length,
  burst_answered: burst.filter(Boolean).length, burst_seconds: +burstSeconds.toFixed(2),
  health_probes: healthMs.length, health_failures: healthFailures,
  health_ms_p50: +pct(0.5).toFixed(1), health_ms_p99: +pct(0.99).toFixed(1), health_ms_max: +sorted.at(-1).toFixed(1),
  rss_mb_start: +rssStart.toFixed(0), rss_mb_peak: +rssPeak.v.toFixed(0),
  connections: stats.connections, seconds: +seconds.toFixed(1),
};
console.log(JSON.stringify(result));
console.log(`| idle | burst answered | streams completed | /health p50 / p99 / max ms | RSS start → peak MB |`);
console.log(`| ${idleCount} | ${result.burst_answered}/${burstCount} in ${result.burst_seconds} s | ${result.streams_completed}/${streamCount} | ${result.health_ms_p50} / ${result.health_ms_p99} / ${result.health_ms_max} | ${result.rss_mb_start} → ${result.rss_mb_peak} |`);
process.exit(result.streams_completed === streamCount && result.burst_answered === burstCount && healthFailures === 0 ? 0 : 1);
