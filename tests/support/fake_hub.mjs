// A local HTTP server that speaks the Hugging Face Hub's API from fixture
// files, for `kettle get`: GET /api/models/{org}/{name}/revision/{rev}?blobs=true
// (the commit and the file list: size, git blob id, LFS sha256) and
// GET /{org}/{name}/resolve/{rev}/{path} (the bytes, with Range support), a
// private repo answering 401 without its token, 404 for the unknown — and
// faults on demand: a transfer cut at a fraction of the file, a file served
// with a flipped byte (once, or always). Every request is logged.
import { createHash } from 'node:crypto';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const gitBlobId = (data) => createHash('sha1').update(`blob ${data.length}\0`).update(data).digest('hex');

export async function startFakeHub() {
  const repos = new Map();
  const hub = {
    log: [],
    faults: { cut: new Map(), corruptOnce: new Set(), corruptAlways: new Set() },
    // files: { name: { path?, data?, lfs: bool } }
    addRepo(id, files, { token = null } = {}) {
      const entries = Object.entries(files).map(([name, f]) => {
        const data = f.data ?? readFileSync(f.path);
        return { name, data, lfs: !!f.lfs, sha256: createHash('sha256').update(data).digest('hex'), blob: gitBlobId(data) };
      });
      const sha = createHash('sha1').update(id + entries.map((e) => e.blob).join()).digest('hex');
      repos.set(id, { sha, entries, token });
      return { sha, entries };
    },
  };
  const server = createServer((req, res) => {
    const url = new URL(req.url, 'http://hub');
    hub.log.push({ method: req.method, path: url.pathname, range: req.headers.range ?? null, auth: req.headers.authorization ?? null });
    const send = (status, body, headers = {}) => { res.writeHead(status, headers); res.end(body); };
    const api = url.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/);
    const resolve = url.pathname.match(/^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/);
    const id = api?.[1] ?? resolve?.[1];
    const repo = id && repos.get(id);
    if (!repo) return send(404, JSON.stringify({ error: 'Repository not found' }));
    if (repo.token && req.headers.authorization !== `Bearer ${repo.token}`)
      return send(401, JSON.stringify({ error: 'Invalid credentials in Authorization header' }));
    const rev = decodeURIComponent((api ?? resolve)[2]);
    if (rev !== 'main' && rev !== repo.sha) return send(404, JSON.stringify({ error: `Invalid rev id: ${rev}` }));
    if (api) {
      const siblings = repo.entries.map((e) => ({
        rfilename: e.name, size: e.data.length, blobId: e.blob,
        ...(e.lfs ? { lfs: { sha256: e.sha256, size: e.data.length, pointerSize: 134 } } : {}),
      }));
      return send(200, JSON.stringify({ id, sha: repo.sha, siblings }), { 'content-type': 'application/json' });
    }
    const name = decodeURIComponent(resolve[3]);
    const entry = repo.entries.find((e) => e.name === name);
    if (!entry) return send(404, JSON.stringify({ error: 'Entry not found' }));
    let data = entry.data;
    if (hub.faults.corruptAlways.has(name) || hub.faults.corruptOnce.delete(name)) {
      data = Buffer.from(data);
      data[data.length >> 1] ^= 0x40;
    }
    const range = req.headers.range?.match(/^bytes=(\d+)-$/);
    const from = range ? Number(range[1]) : 0;
    if (from >= data.length && range) return send(416, '', { 'content-range': `bytes */${data.length}` });
    const headers = { 'content-length': data.length - from, 'accept-ranges': 'bytes', etag: `"${entry.lfs ? entry.sha256 : entry.blob}"` };
    if (range) headers['content-range'] = `bytes ${from}-${data.length - 1}/${data.length}`;
    res.writeHead(range ? 206 : 200, headers);
    const cut = hub.faults.cut.get(name);
    if (cut !== undefined) {  // send up to the cut, then drop the connection (once)
      hub.faults.cut.delete(name);
      const stop = Math.floor(data.length * cut);
      res.write(data.subarray(from, Math.max(from, stop)), () => setTimeout(() => req.socket.destroy(), 50));
      return;
    }
    res.end(data.subarray(from));
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  hub.endpoint = `http://127.0.0.1:${server.address().port}`;
  hub.close = () => new Promise((r) => server.close(r));
  return hub;
}

export const fixtureFiles = (dir, names, lfs = []) =>
  Object.fromEntries(names.map((n) => [n, { path: join(dir, n), lfs: lfs.includes(n) }]));
