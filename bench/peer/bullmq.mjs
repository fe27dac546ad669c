// The peer side of `delayq bench`: BullMQ delayed jobs on the same Redis.
//
// Two roles, run as separate processes so each one's CPU is its own:
//   node bullmq.mjs produce --port P --n N --payload B (--due-at MS | --rate R --delay MS)
//   node bullmq.mjs work    --port P --n N [--concurrency C] [--timeout-ms MS]
//
// produce: `--due-at` adds N delayed jobs that all fall due at that epoch ms (a
// burst); `--rate` adds them at a steady rate, each due `--delay` ms after it was
// added (a spread). Prints one JSON line when done.
//
// work: prints "ready" once connected, then takes jobs until it has seen N distinct
// ones (or nothing arrived for --timeout-ms) and prints one JSON line with
// lateness = (time the processor is called) - (job.timestamp + job.delay). All
// times are Date.now() on this machine, whose clock Redis's TIME also reads, so
// they compare with delayq's "stream entry time - due time" (see bench/README.md).

import { Queue, Worker } from 'bullmq';

const QUEUE = 'delayq-bench-peer';

function parseArgs(argv) {
  const role = argv[0];
  const opts = {};
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    opts[key] = argv[i + 1];
  }
  return { role, opts };
}

function num(opts, key, fallback) {
  if (opts[key] === undefined) {
    if (fallback === undefined) throw new Error(`--${key} is required`);
    return fallback;
  }
  const n = Number(opts[key]);
  if (!Number.isFinite(n)) throw new Error(`--${key}: not a number: ${opts[key]}`);
  return n;
}

function connection(opts) {
  return { host: opts.host ?? '127.0.0.1', port: num(opts, 'port'), maxRetriesPerRequest: null };
}

function cpuMicros() {
  const u = process.cpuUsage();
  return u.user + u.system;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Jobs are kept nowhere once done, so the peer holds no more than delayq does
// while pending and less afterwards (delayq keeps a delivery record).
const jobOpts = { removeOnComplete: true, removeOnFail: true };

async function produce(opts) {
  const n = num(opts, 'n');
  const payload = 'x'.repeat(num(opts, 'payload', 100));
  const queue = new Queue(QUEUE, { connection: connection(opts) });
  await queue.waitUntilReady();
  const cpu0 = cpuMicros();
  const started = Date.now();
  const job = (i, timestamp, delay) => ({
    name: 'bench',
    data: { n: i, payload },
    opts: { ...jobOpts, timestamp, delay },
  });
  if (opts['due-at'] !== undefined) {
    const dueAt = num(opts, 'due-at');
    const chunk = 1000;
    for (let i = 0; i < n; i += chunk) {
      const now = Date.now();
      const jobs = [];
      for (let j = i; j < Math.min(n, i + chunk); j++) jobs.push(job(j, now, Math.max(1, dueAt - now)));
      await queue.addBulk(jobs);
    }
  } else {
    const rate = num(opts, 'rate');
    const delay = num(opts, 'delay', 500);
    let sent = 0;
    const inflight = new Set();
    while (sent < n) {
      const target = Math.min(n, Math.floor(((Date.now() - started) / 1000) * rate));
      if (target > sent) {
        const now = Date.now();
        const jobs = [];
        for (; sent < target; sent++) jobs.push(job(sent, now, delay));
        const p = queue.addBulk(jobs).then(() => inflight.delete(p));
        inflight.add(p);
      }
      await sleep(1);
    }
    await Promise.all(inflight);
  }
  const secs = (Date.now() - started) / 1000;
  const cpu = cpuMicros() - cpu0;
  await queue.close();
  console.log(JSON.stringify({ role: 'produce', messages: n, add_rate_per_sec: Math.round(n / secs), cpu_us_per_message: cpu / n }));
}

function quantile(sorted, q) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
  return sorted[Math.max(0, i)];
}

async function work(opts) {
  const n = num(opts, 'n');
  const concurrency = num(opts, 'concurrency', 100);
  const idleTimeout = num(opts, 'timeout-ms', 30000);
  const seen = new Uint8Array(n);
  const lateness = new Float64Array(n);
  let distinct = 0;
  let duplicated = 0;
  let unexpected = 0;
  let first = 0;
  let last = 0;
  let lastPick = Date.now();
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  let cpu0 = 0;
  const worker = new Worker(
    QUEUE,
    async (job) => {
      const at = Date.now();
      lastPick = at;
      const i = job.data.n;
      if (!(i >= 0 && i < n)) { unexpected++; return; }
      if (seen[i]) { duplicated++; return; }
      seen[i] = 1;
      // job.delay reads 0 once a delayed job is promoted; the delay asked for stays in opts.
      lateness[i] = at - (job.timestamp + (job.opts.delay ?? 0));
      distinct++;
      if (first === 0) first = at;
      last = at;
      if (distinct === n) done();
    },
    { connection: connection(opts), concurrency, autorun: false, ...jobOpts },
  );
  await worker.waitUntilReady();
  cpu0 = cpuMicros();
  const started = Date.now();
  worker.run();
  console.log('ready');
  const idle = setInterval(() => { if (Date.now() - lastPick > idleTimeout) done(); }, 100);
  await finished;
  clearInterval(idle);
  const cpu = cpuMicros() - cpu0;
  await worker.close();
  const picked = Array.from(lateness.subarray(0, n)).filter((_, i) => seen[i]).sort((a, b) => a - b);
  console.log(JSON.stringify({
    role: 'work',
    messages: n,
    concurrency,
    delivered: distinct,
    lost: n - distinct,
    duplicated,
    unexpected,
    started_ms: started,
    first_ms: first,
    last_ms: last,
    lateness_ms: picked.length === 0 ? null : {
      p50: quantile(picked, 0.5),
      p99: quantile(picked, 0.99),
      p99_9: quantile(picked, 0.999),
      max: picked[picked.length - 1],
    },
    cpu_us_per_message: cpu / Math.max(1, distinct),
  }));
}

const { role, opts } = parseArgs(process.argv.slice(2));
const main = role === 'produce' ? produce : role === 'work' ? work : null;
if (!main) {
  console.error('usage: bullmq.mjs produce|work --port P --n N ...');
  process.exit(2);
}
main(opts).then(
  () => process.exit(0),
  (e) => { console.error(e); process.exit(1); },
);
