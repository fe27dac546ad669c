// delayq dashboard: plain DOM, no frameworks. Every value reaches the page through
// textContent / attributes, never innerHTML. Nothing here throws past its handler.
(() => {
  'use strict';

  const POLL_MS = 2000;
  const TOKEN_KEY = 'delayq-token';
  const THEME_KEY = 'delayq-theme';
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const state = {
    session: null,  // GET /v1/session answer
    scope: null,    // 'read' | 'write' | 'admin' | null (unknown)
    page: null,     // current page name
    params: new URLSearchParams(),
    gen: 0,         // bumps on every route change; stale answers are dropped
    busy: 0,        // loads in flight (a poll tick is skipped while > 0)
    ticks: 0,
    seen: {},       // last rendered JSON per key, to skip identical redraws
    leading: false, // whether the node serving this page leads (its header badge)
    up: { stream: '', after: null },
    fin: { stream: '', state: '', key: '', after: null, next: null },
    dead: { stream: '', after: null, streams: [] },
    window: 'hour', // the Streams page's lines: the last hour, or the last day
  };

  // --- small helpers

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v == null || v === false) continue;
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
        else if (k.startsWith('on')) e.addEventListener(k.slice(2), safe(v));
        else e.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const c of kids.flat()) {
      if (c == null || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function svg(tag, attrs, ...kids) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) e.setAttribute(k, String(v));
    for (const c of kids) if (c != null) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  // Wraps a handler so that neither a throw nor a rejection escapes it.
  function safe(fn) {
    return (...args) => {
      try {
        const p = fn(...args);
        if (p && typeof p.catch === 'function') p.catch(oops);
      } catch (e) { oops(e); }
    };
  }
  function oops(e) { setStatus('Unexpected problem in the page: ' + ((e && e.message) || e), 'err'); }

  function store(kind, key, value) {
    try {
      const s = kind === 'local' ? window.localStorage : window.sessionStorage;
      if (value === undefined) return s.getItem(key);
      if (value === null) s.removeItem(key); else s.setItem(key, value);
    } catch (e) { /* storage disabled: behave as if empty */ }
    return null;
  }
  const getToken = () => store('session', TOKEN_KEY) || '';

  const canWrite = () => state.scope === 'write' || state.scope === 'admin';
  const isAdmin = () => state.scope === 'admin';
  const enc = encodeURIComponent;

  // --- formatting

  const pad = (n) => String(n).padStart(2, '0');
  const isNum = (n) => typeof n === 'number' && Number.isFinite(n);

  function fmtInt(n) {
    if (!isNum(n)) return '–';
    return Math.abs(n) >= 100000 ? n.toLocaleString('en-US') : String(Math.round(n));
  }
  function fmtRate(n) {
    if (!isNum(n)) return '–';
    if (n >= 100) return String(Math.round(n));
    if (n >= 10) return String(Math.round(n * 10) / 10);
    return String(Math.round(n * 100) / 100);
  }
  function fmtMs(n) { return isNum(n) ? fmtDur(n) : '–'; }

  // 450 ms, 1.2 s, 42 s, 5 min 3 s, 1 h 2 min, 2 d 3 h
  function fmtDur(ms) {
    if (!isNum(ms)) return '–';
    ms = Math.abs(ms);
    if (ms < 1000) return Math.round(ms) + ' ms';
    const s = ms / 1000;
    if (s < 10) return Math.round(s * 10) / 10 + ' s';
    const units = [['d', 86400], ['h', 3600], ['min', 60], ['s', 1]];
    let t = Math.round(s);
    for (let i = 0; i < units.length; i++) {
      const [u, n] = units[i];
      if (t < n && i < units.length - 1) continue;
      const q = Math.floor(t / n);
      const next = units[i + 1];
      const r = next ? Math.floor((t - q * n) / next[1]) : 0;
      return r ? `${q} ${u} ${r} ${next[0]}` : `${q} ${u}`;
    }
    return '–';
  }
  function fmtAge(ms, now) {
    if (!isNum(ms)) return '';
    const d = ms - (isNum(now) ? now : Date.now());
    if (Math.abs(d) < 1000) return 'now';
    const txt = fmtDur(Math.round(Math.abs(d) / 1000) * 1000);
    return d > 0 ? 'in ' + txt : txt + ' ago';
  }
  function fmtTime(ms) {
    if (!isNum(ms) || Math.abs(ms) > 8.64e15) return '–';
    const d = new Date(ms);
    const t = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    if (d.toDateString() === new Date().toDateString()) return t;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${t}`;
  }
  // "14:03:22 · 3 s ago", with the full ISO time as tooltip.
  function when(ms, now) {
    if (!isNum(ms) || Math.abs(ms) > 8.64e15) return el('span', { class: 'muted' }, '–');
    return el('span', { class: 'when', title: new Date(ms).toISOString() },
      fmtTime(ms), el('span', { class: 'muted' }, ' · ' + fmtAge(ms, now)));
  }
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

  // --- API

  // Never throws: a network failure is status 0 with a detail.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    const token = getToken();
    if (token) headers.Authorization = 'Bearer ' + token;
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      return { ok: false, status: 0, body: { error: 'network', detail: 'cannot reach delayq (' + ((e && e.message) || e) + ')' } };
    }
    let text = '';
    try { text = await res.text(); } catch (e) { /* body lost: treated as empty */ }
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = { error: 'bad_response', detail: text.slice(0, 300) }; }
    }
    if (!res.ok) {
      if (!data || typeof data !== 'object') data = {};
      if (!data.detail) data.detail = data.error || `HTTP ${res.status} ${res.statusText || ''}`.trim();
      if (res.status === 401) showAuth(data);
    }
    return { ok: res.ok, status: res.status, body: data };
  }

  function errText(r) {
    const d = (r.body && r.body.detail) || `HTTP ${r.status}`;
    if (r.status === 403) return 'Not allowed: ' + d;
    if (r.status === 503) return 'Redis unavailable: ' + d;
    if (r.status === 0) return 'No answer: ' + d;
    return d;
  }

  // After a page load: show the first failure in the banner, or clear it.
  function loaded(results) {
    const bad = results.find((r) => !r.ok && r.status !== 401);
    const b = $('banner');
    if (!bad) { b.hidden = true; return; }
    let msg = errText(bad);
    if (bad.status === 503 || bad.status === 0) msg = msg.replace(/[.\s]*$/, '.') + ' Still retrying every 2 s.';
    b.textContent = msg;
    b.hidden = false;
  }

  // What happened, for a while: an error stays until the next message, a success
  // clears itself after 10 s so that an old one is not read as news.
  let statusTimer = null;
  function setStatus(msg, kind) {
    const s = $('status');
    if (!s) return;
    s.className = 'status ' + (kind || 'ok');
    s.replaceChildren(el('span', { class: 'status-time' }, fmtTime(Date.now()) + ' '), el('span', null, msg));
    clearTimeout(statusTimer);
    if ((kind || 'ok') === 'ok') statusTimer = setTimeout(() => { s.replaceChildren(); s.className = 'status'; }, 10000);
  }
  const failStatus = (what, r) => setStatus(`${what} failed: ${errText(r)}`, 'err');

  // --- token

  function showAuth(body) {
    const box = $('auth');
    const had = !!getToken();
    $('token-msg').textContent = had
      ? 'Token rejected: ' + ((body && body.detail) || 'invalid token') + '. Enter another one.'
      : 'This daemon needs a bearer token: ' + ((body && body.detail) || 'missing token') + '.';
    if (box.hidden) {
      box.hidden = false;
      $('view').hidden = true;
      $('token-input').focus();
    }
  }

  async function saveToken(ev) {
    ev.preventDefault();
    const v = $('token-input').value.trim();
    if (!v) { $('token-msg').textContent = 'Paste a token first.'; return; }
    store('session', TOKEN_KEY, v);
    $('token-input').value = '';
    $('auth').hidden = true;
    $('view').hidden = false;
    updateTokenLink();
    setStatus('Token saved for this tab; reloading.');
    await loadSession();
    route();
  }

  async function forgetToken() {
    store('session', TOKEN_KEY, null);
    updateTokenLink();
    setStatus('Token forgotten.');
    await loadSession();
    route();
  }
  function updateTokenLink() { $('token-forget').hidden = !getToken(); }

  // --- theme

  function currentTheme() {
    const t = document.documentElement.dataset.theme;
    if (t) return t;
    return window.matchMedia && window.matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
  }
  function applyTheme(t) {
    if (t === 'dark' || t === 'light') document.documentElement.dataset.theme = t;
    const now = currentTheme();
    const btn = $('theme-toggle');
    btn.textContent = now === 'dark' ? 'Light' : 'Dark';
    btn.setAttribute('aria-label', 'switch to ' + (now === 'dark' ? 'light' : 'dark') + ' theme');
  }
  function toggleTheme() {
    const t = currentTheme() === 'dark' ? 'light' : 'dark';
    store('local', THEME_KEY, t);
    applyTheme(t);
  }

  // --- header

  async function loadSession() {
    const r = await api('GET', '/v1/session');
    if (r.ok && r.body) {
      state.session = r.body;
      state.scope = r.body.scope || null;
      $('node-id').textContent = r.body.node_id || '';
      $('version').textContent = `delayq ${r.body.version || ''} · node ${r.body.node_id || '?'}`;
      const sc = $('scope');
      sc.textContent = (state.scope || '?') + ' access';
      sc.hidden = !r.body.tokens_required && !getToken();
    } else {
      state.session = null;
      state.scope = null;
      if (r.status !== 401) setStatus('Could not read the session: ' + errText(r), 'err');
    }
  }

  function setRole(isLeader, nodeId) {
    if (nodeId) $('node-id').textContent = nodeId;
    const b = $('node-role');
    b.textContent = isLeader ? 'leader' : 'standby';
    b.className = 'badge ' + (isLeader ? 'role-leader' : 'role-standby');
    $('standby-note').hidden = !!isLeader;
    state.leading = !!isLeader;
    showResign();
  }

  // Only a leader has leadership to resign: a standby shows why there is no button.
  function showResign() {
    const b = $('resign-go');
    const note = $('resign-note');
    if (b) b.hidden = !state.leading;
    if (note) note.hidden = state.leading;
  }

  // A passing note ("Token saved…") belongs to the page it was said on: leaving the
  // page drops it; an error stays until the next one or a success replaces it.
  function dropPassingStatus() {
    const s = $('status');
    if (s && s.classList.contains('ok')) { clearTimeout(statusTimer); s.replaceChildren(); s.className = 'status'; }
  }

  // Role of this node for pages other than the overview (which has it already).
  async function refreshHeader() {
    const r = await api('GET', '/v1/nodes');
    const me = state.session && state.session.node_id;
    if (!r.ok || !me || !r.body || !Array.isArray(r.body.nodes)) return;
    const n = r.body.nodes.find((x) => x.node_id === me);
    if (n) setRole(n.role === 'leader', me);
  }

  // --- building blocks

  function card(title, body, opts) {
    const o = opts || {};
    return el('section', { class: 'card ' + (o.class || ''), id: o.id },
      title ? el('div', { class: 'card-head' }, el('h2', null, title), o.extra || null) : null,
      body);
  }
  // A number card: #id holds the value, #id-sub the line under it.
  function stat(label, id, sub) {
    return el('div', { class: 'card stat', id: id + '-card' },
      el('div', { class: 'stat-label' }, label),
      el('div', { class: 'stat-value', id }, '–'),
      el('div', { class: 'stat-sub muted', id: id + '-sub' }, sub || ''));
  }
  function table(id, heads, rows, empty) {
    const body = rows.length ? rows
      : [el('tr', { class: 'empty-row' }, el('td', { colspan: heads.length, class: 'empty' }, empty))];
    return el('table', { id, class: 'table' },
      el('thead', null, el('tr', null, heads.map((h) => el('th', null, h)))),
      el('tbody', null, body));
  }
  const td = (...kids) => el('td', null, ...kids);
  const code = (t) => el('code', null, t == null ? '–' : String(t));
  const badge = (t, cls) => el('span', { class: 'badge ' + (cls || '') }, t);
  const setText = (id, t) => { const e = $(id); if (e) e.textContent = t; };
  const button = (label, id, cls, onclick, extra) =>
    el('button', Object.assign({ type: 'button', id, class: cls || '', onclick }, extra || {}), label);

  // Redraw only when the data (and scope) changed since the last time.
  function changed(key, data) {
    const s = JSON.stringify([data, state.scope]);
    if (state.seen[key] === s) return false;
    state.seen[key] = s;
    return true;
  }

  // --- charts

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // delivered/s (area, left axis) and p99 lateness (dashed, right axis).
  function rateChart(rate, now) {
    const W = 640, H = 200, L = 44, R = 52, T = 12, B = 24;
    const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': 'delivered per second and p99 lateness' });
    if (!rate.length) {
      g.append(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' }, 'no samples yet'));
      return g;
    }
    // Always the last 15 minutes, so the chart's width means the same time.
    const t1 = Math.max(isNum(now) ? now : 0, rate[rate.length - 1].t_ms);
    const t0 = t1 - 15 * 60000;
    rate = rate.filter((p) => p.t_ms >= t0);
    if (!rate.length) {
      g.append(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' }, 'no samples in the last 15 minutes'));
      return g;
    }
    const span = t1 - t0;
    const yMax1 = niceMax(Math.max(...rate.map((p) => p.delivered_per_s || 0)));
    const yMax2 = niceMax(Math.max(...rate.map((p) => (isNum(p.p99_ms) ? p.p99_ms : 0))));
    const x = (t) => L + ((t - t0) / span) * (W - L - R);
    const y1 = (v) => T + (1 - v / yMax1) * (H - T - B);
    const y2 = (v) => T + (1 - v / yMax2) * (H - T - B);
    for (const f of [0, 0.5, 1]) {
      const yy = T + (1 - f) * (H - T - B);
      g.append(svg('line', { x1: L, x2: W - R, y1: yy, y2: yy, class: 'grid' }));
      g.append(svg('text', { x: L - 6, y: yy + 4, 'text-anchor': 'end', class: 'axis a1' }, fmtRate(yMax1 * f)));
      g.append(svg('text', { x: W - R + 6, y: yy + 4, class: 'axis a2' }, fmtMs(yMax2 * f)));
    }
    g.append(svg('text', { x: L, y: H - 6, class: 'axis' }, '15m ago'));
    g.append(svg('text', { x: W - R, y: H - 6, 'text-anchor': 'end', class: 'axis' }, 'now'));
    const pts = rate.map((p) => [x(p.t_ms), y1(p.delivered_per_s || 0)]);
    const line = pts.map((p, i) => (i ? 'L' : 'M') + p[0].toFixed(1) + ' ' + p[1].toFixed(1)).join('');
    if (pts.length > 1) {
      g.append(svg('path', { d: `${line}L${pts[pts.length - 1][0].toFixed(1)} ${H - B}L${pts[0][0].toFixed(1)} ${H - B}Z`, class: 'area' }));
    }
    g.append(svg('path', { d: line, class: 'line l1' }));
    let d2 = '', pen = false;
    for (const p of rate) {
      if (!isNum(p.p99_ms)) { pen = false; continue; }
      d2 += (pen ? 'L' : 'M') + x(p.t_ms).toFixed(1) + ' ' + y2(p.p99_ms).toFixed(1);
      pen = true;
    }
    if (d2) g.append(svg('path', { d: d2, class: 'line l2' }));
    const last = pts[pts.length - 1];
    g.append(svg('circle', { cx: last[0], cy: last[1], r: 3, class: 'dot' }));
    return g;
  }

  function dueChart(due) {
    const items = [['overdue', due.overdue], ['next min', due.next_minute], ['next hour', due.next_hour],
      ['next day', due.next_day], ['later', due.later]];
    const W = 340, H = 200, T = 22, B = 26, gap = 14;
    const bw = (W - gap * (items.length + 1)) / items.length;
    const max = Math.max(1, ...items.map((i) => i[1] || 0));
    const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': 'messages by due time' });
    g.append(svg('line', { x1: 0, x2: W, y1: H - B, y2: H - B, class: 'grid' }));
    items.forEach(([label, v], i) => {
      const n = v || 0;
      let h = (n / max) * (H - T - B);
      if (n > 0 && h < 2) h = 2;
      const x = gap + i * (bw + gap);
      const cls = 'bar' + (i === 0 && n > 0 ? ' bar-warn' : '');
      g.append(svg('rect', { x, y: H - B - h, width: bw, height: h, rx: 3, class: cls },
        svg('title', null, `${label}: ${n}`)));
      g.append(svg('text', { x: x + bw / 2, y: H - B - h - 6, 'text-anchor': 'middle', class: 'count' }, fmtInt(v)));
      g.append(svg('text', { x: x + bw / 2, y: H - 8, 'text-anchor': 'middle', class: 'axis' }, label));
    });
    return g;
  }

  // --- overview

  function renderOverview(view) {
    view.append(
      el('div', { id: 'no-leader', class: 'alert warn', hidden: true },
        'No leader: no node is delivering messages right now. They are kept and will be delivered late once a node leads.'),
      el('div', { class: 'stats' },
        stat('Pending', 'pending-total', 'scheduled messages'),
        stat('Overdue', 'overdue'),
        stat('Oldest overdue', 'oldest-overdue'),
        stat('Held', 'held'),
        stat('Delivered / s', 'delivered-rate'),
        stat('Lateness p50 / p99', 'lateness', 'behind deliver_at')),
      el('div', { class: 'cols' },
        card('Throughput', el('div', { id: 'rate-chart', class: 'chart-box' }), {
          class: 'wide',
          extra: el('div', { class: 'legend' }, el('span', { class: 'key k1' }, 'delivered / s'), el('span', { class: 'key k2' }, 'p99 lateness')),
        }),
        card('Due', el('div', { id: 'due-chart', class: 'chart-box' }))),
      el('div', { class: 'cols' },
        card('Nodes', el('div', { id: 'nodes-box', class: 'scroll' }, table('nodes', ['Node'], [], 'loading…')), { class: 'wide' }),
        card('Cluster', el('dl', { class: 'kv' },
          el('dt', null, 'Leader'), el('dd', null, el('strong', { id: 'leader-node' }, '–')),
          el('dt', null, 'Address'), el('dd', { id: 'leader-address' }, '–'),
          el('dt', null, 'Epoch'), el('dd', { id: 'leader-epoch' }, '–'),
          el('dt', null, 'Mode'), el('dd', { id: 'leader-mode' }, '–'),
          el('dt', null, 'Fence'), el('dd', { id: 'fence' }, '–'),
          el('dt', null, 'Redis'), el('dd', null, el('span', { id: 'redis-status', class: 'badge' }, '–'), el('div', { id: 'redis-detail', class: 'muted small' })),
          el('dt', null, 'etcd'), el('dd', null, el('span', { id: 'etcd-status', class: 'badge' }, '–'))))),
      card('Leadership history', el('div', { id: 'history-box', class: 'scroll' }, table('history', ['Node'], [], 'loading…'))));
  }

  async function loadOverview(gen) {
    const [o, n, h] = await Promise.all([
      api('GET', '/v1/overview'), api('GET', '/v1/nodes'), api('GET', '/v1/leadership/history')]);
    if (gen !== state.gen) return;
    loaded([o, n, h]);
    if (o.ok && o.body) drawOverview(o.body);
    const now = (o.ok && o.body && o.body.now_ms) || (n.ok && n.body && n.body.now_ms) || Date.now();
    if (n.ok && n.body) drawNodes(n.body); else failBox('nodes-box', n);
    if (h.ok && h.body) drawHistory(h.body, now); else failBox('history-box', h);
  }

  function drawOverview(o) {
    const now = o.now_ms || Date.now();
    if (o.node) setRole(!!o.node.is_leader, o.node.node_id);
    const p = o.pending || {};
    setText('pending-total', fmtInt(p.total));
    setText('overdue', fmtInt(p.overdue));
    setText('overdue-sub', p.overdue ? 'due, not yet delivered' : 'nothing late');
    $('overdue-card').classList.toggle('warn', p.overdue > 0);
    setText('oldest-overdue', isNum(p.oldest_overdue_ms) ? fmtDur(p.oldest_overdue_ms) : '–');
    setText('oldest-overdue-sub', isNum(p.oldest_overdue_ms) ? 'late by' : 'no overdue message');
    setText('held', fmtInt(p.held));
    setText('held-sub', p.paused_streams ? `${plural(p.paused_streams, 'paused stream')}` : 'waiting for a rate limit or pause');
    const rate = Array.isArray(o.rate) ? o.rate : [];
    const last = rate[rate.length - 1];
    setText('delivered-rate', last ? fmtRate(last.delivered_per_s) : '–');
    setText('delivered-rate-sub', last ? 'sample ' + fmtAge(last.t_ms, now) : 'no samples yet');
    setText('lateness', last ? latency(last.p50_ms, last.p99_ms) : '–');

    const l = o.leader || {};
    $('no-leader').hidden = l.node_id != null;
    setText('leader-node', l.node_id || 'none');
    setText('leader-address', l.address || '–');
    setText('leader-epoch', isNum(l.epoch) ? String(l.epoch) : '–');
    setText('leader-mode', l.mode || '–');
    setText('fence', isNum(o.fence) ? String(o.fence) : 'unknown');
    const redis = o.redis || {};
    const rs = $('redis-status');
    rs.textContent = redis.status || '?';
    rs.className = 'badge ' + (redis.status === 'writable' ? 'good' : 'bad');
    setText('redis-detail', redis.detail || '');
    const etcd = (o.etcd && o.etcd.status) || '?';
    const es = $('etcd-status');
    es.textContent = etcd;
    es.className = 'badge ' + (etcd === 'reachable' ? 'good' : etcd === 'not used' ? 'subtle' : 'bad');

    $('rate-chart').replaceChildren(rateChart(rate, now));
    $('due-chart').replaceChildren(dueChart(o.due || {}));
  }

  // "4 / 15 ms" when both are under a second, else each with its unit.
  function latency(a, b) {
    if (isNum(a) && isNum(b) && a < 1000 && b < 1000) return `${Math.round(a)} / ${Math.round(b)} ms`;
    return `${fmtMs(a)} / ${fmtMs(b)}`;
  }

  // A box still showing its first "loading…" shows the failure instead.
  function failBox(id, r) {
    const b = $(id);
    if (b && !b.dataset.loaded) b.replaceChildren(el('p', { class: 'empty' }, errText(r)));
  }
  function fillBox(id, content) {
    const b = $(id);
    b.dataset.loaded = '1';
    b.replaceChildren(content);
  }

  function drawNodes(b) {
    const me = state.session && state.session.node_id;
    const nodes = Array.isArray(b.nodes) ? b.nodes : [];
    const rows = nodes.map((n) => el('tr', { data: { node: n.node_id, role: n.role }, class: n.role === 'gone' ? 'gone' : null },
      td(el('strong', null, n.node_id), n.node_id === me ? el('span', { class: 'muted' }, ' (this node)') : null),
      td(badge(n.role, 'role-' + n.role)),
      td(n.epoch == null ? '–' : String(n.epoch)),
      td(code(n.address)),
      td(n.version || '–'),
      td(when(n.started_at_ms, b.now_ms)),
      td(el('span', { title: fmtTime(n.last_seen_ms) }, fmtAge(n.last_seen_ms, b.now_ms) || '–'))));
    fillBox('nodes-box', table('nodes', ['Node', 'Role', 'Epoch', 'Address', 'Version', 'Started', 'Last seen'], rows,
      'no nodes have registered yet'));
  }

  function drawHistory(b, now) {
    const terms = Array.isArray(b.terms) ? b.terms : [];
    const groups = terms.some((t) => t.group != null);
    const heads = ['Node', 'Epoch'].concat(groups ? ['Group'] : [], ['From', 'To', 'Duration', 'Ended']);
    const rows = terms.map((t) => el('tr', { class: t.to_ms == null ? 'current' : null },
      td(el('strong', null, t.node_id)),
      td(String(t.epoch)),
      groups ? td(t.group == null ? '–' : String(t.group)) : null,
      td(when(t.from_ms, now)),
      td(t.to_ms == null ? badge('current', 'good') : when(t.to_ms, now)),
      td(fmtDur((t.to_ms == null ? now : t.to_ms) - t.from_ms)),
      td(t.ended || (t.to_ms == null ? '–' : '?'))));
    fillBox('history-box', table('history', heads, rows, 'no leadership terms recorded yet'));
  }

  // --- streams

  function renderStreams(view) {
    const pick = (w, label) => button(label, `window-${w}`, state.window === w ? 'on' : '', () => {
      state.window = w;
      delete state.seen.streams;
      for (const o of ['hour', 'day']) $(`window-${o}`).className = o === w ? 'on' : '';
      loadStreams(state.gen);
    });
    view.append(card('Streams', el('div', { id: 'streams-box', class: 'scroll' }, table('streams', ['Stream'], [], 'loading…')),
      { extra: el('span', { class: 'muted small' }, el('span', { id: 'streams-note' }), ' ',
        pick('hour', 'Last hour'), pick('day', 'Last day')) }));
  }

  async function loadStreams(gen) {
    const day = state.window === 'day';
    const r = await api('GET', day ? '/v1/streams?window=day' : '/v1/streams');
    if (gen !== state.gen) return;
    loaded([r]);
    if (!r.ok || !r.body) { failBox('streams-box', r); return; }
    if (!changed('streams', r.body)) return;
    const list = Array.isArray(r.body.streams) ? r.body.streams : [];
    const asOf = isNum(r.body.counted_at_ms) ? 'pending counted ' + fmtAge(r.body.counted_at_ms) : '';
    const estimate = r.body.exact === false ? 'counts are estimates (large streams)' : '';
    const lines = day ? 'lines: each quarter hour of the last day' : 'lines: each minute of the last hour';
    setText('streams-note', [asOf, estimate, lines].filter(Boolean).join(' · '));
    const per = day ? 'per quarter hour, the last day' : 'per minute, the last hour';
    const heads = ['Stream', 'State', 'Pending', 'Due next hour', 'Held', 'Delivered / s', 'Worst lateness', 'Dead letters', 'Consumer groups'];
    if (isAdmin()) heads.push('');
    const rows = list.map((s) => el('tr', { data: { stream: s.stream, paused: s.paused ? 'true' : 'false' }, class: s.paused ? 'paused' : null },
      td(el('strong', null, s.stream), el('div', { class: 'links small' },
        el('a', { href: `#/messages?stream=${enc(s.stream)}` }, 'upcoming'),
        el('a', { href: `#/messages?stream=${enc(s.stream)}&finished=1` }, 'finished'),
        el('a', { href: `#/dead?stream=${enc(s.stream)}` }, 'dead letters'))),
      td(s.paused ? badge(`paused · ${fmtInt(s.held)} held`, 'warn') : badge('active', 'good'),
        s.max_rate ? el('div', { class: 'muted small' }, `limit ${fmtInt(s.max_rate)}/s`) : null),
      td(fmtInt(s.pending)),
      td(fmtInt(s.due_next_hour)),
      td(fmtInt(s.held)),
      td(fmtRate(s.delivered_per_s), sparkline(day ? s.delivered_last_day : s.delivered_last_hour, `${s.stream}: delivered ${per}`)),
      td(worstCell(day ? s.worst_lateness_last_day : s.worst_lateness_last_hour, `${s.stream}: worst lateness ${per}`)),
      td(s.dead ? el('a', { href: `#/dead?stream=${enc(s.stream)}`, class: 'bad-text', title: s.dead_letter_stream || '' }, fmtInt(s.dead)) : '0',
        sparkline(day ? s.dead_last_day : s.dead_last_hour, `${s.stream}: dead-lettered ${per}`)),
      td(groupsCell(s.groups)),
      isAdmin() ? td(s.paused
        ? button('Resume', null, 'resume', () => pauseStream(s.stream, false))
        : button('Pause', null, 'pause', () => pauseStream(s.stream, true))) : null));
    fillBox('streams-box', table('streams', heads, rows, 'no streams yet: messages appear here once scheduled'));
  }

  // A small line of counts, oldest first (a point a minute or a quarter hour);
  // `said` words its title (by default the total and the busiest minute).
  function sparkline(points, title, said) {
    if (!Array.isArray(points) || !points.length) return null;
    const w = 90, h = 24, max = Math.max(1, ...points);
    const xy = points.map((n, i) => `${(i * w / Math.max(1, points.length - 1)).toFixed(1)},${(h - 1 - (n / max) * (h - 2)).toFixed(1)}`);
    const total = points.reduce((a, b) => a + b, 0);
    const text = said ? said(max) : `${fmtInt(total)} in all, at most ${fmtInt(max)} at one point`;
    return svg('svg', { class: 'spark', width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: 'img', 'aria-label': `${title}: ${text}` },
      svg('title', null, `${title}: ${text}`),
      svg('polyline', { points: xy.join(' '), fill: 'none', stroke: 'currentColor', 'stroke-width': 1.5 }));
  }

  // The worst lateness of each point of the window: the worst of all as text, the
  // points as a line (held messages' waits are not in it).
  function worstCell(points, title) {
    if (!Array.isArray(points) || !points.some((n) => n > 0)) return el('span', { class: 'muted' }, 'none');
    const worst = Math.max(...points);
    return [fmtMs(worst), sparkline(points, title, (m) => `at worst ${fmtMs(m)}`)];
  }

  function groupsCell(groups) {
    if (!Array.isArray(groups) || !groups.length) return el('span', { class: 'muted' }, 'none');
    return el('div', { class: 'groups' }, groups.map((g) => el('div', null,
      el('strong', null, g.name), el('span', { class: 'muted' },
        ` lag ${g.lag == null ? '?' : fmtInt(g.lag)} · ${fmtInt(g.pending)} pending`))));
  }

  async function pauseStream(name, pause) {
    if (pause && !window.confirm(`Pause delivery to stream "${name}"? Due messages are held until it is resumed.`)) {
      setStatus(`Pause of ${name} not done.`);
      return;
    }
    const r = await api('POST', `/v1/streams/${enc(name)}/${pause ? 'pause' : 'resume'}`);
    if (!r.ok) { failStatus(pause ? 'Pause' : 'Resume', r); return; }
    const b = r.body || {};
    setStatus(`Stream ${b.stream || name} ${b.paused ? 'paused: messages are held' : 'resumed: delivery goes on'}.`);
    await refresh(true);
  }

  // --- messages

  function renderMessages(view) {
    state.up = { stream: state.params.get('stream') || '', after: null };
    const lookup = el('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); return doLookup($('lookup-id').value.trim()); } },
      el('label', { for: 'lookup-id', class: 'sr-only' }, 'message id'),
      el('input', { id: 'lookup-id', type: 'search', placeholder: 'message id', spellcheck: 'false', value: state.params.get('id') || '' }),
      el('button', { id: 'lookup-go', type: 'submit', class: 'primary' }, 'Look up'));
    const filter = el('form', { class: 'row', onsubmit: (e) => {
      e.preventDefault();
      state.up = { stream: $('upcoming-stream').value.trim(), after: null };
      return loadUpcoming(state.gen);
    } },
      el('label', { for: 'upcoming-stream', class: 'sr-only' }, 'stream'),
      el('input', { id: 'upcoming-stream', type: 'search', placeholder: 'all streams', value: state.up.stream }),
      el('button', { id: 'upcoming-filter', type: 'submit' }, 'Filter'));
    const byKey = el('form', { class: 'row', onsubmit: (e) => {
      e.preventDefault();
      return keyLookup($('key-stream').value.trim(), $('key-key').value.trim());
    } },
      el('label', { for: 'key-stream', class: 'sr-only' }, 'stream'),
      el('input', { id: 'key-stream', type: 'search', placeholder: 'stream', spellcheck: 'false', value: state.params.get('stream') || '' }),
      el('label', { for: 'key-key', class: 'sr-only' }, 'business key'),
      el('input', { id: 'key-key', type: 'search', placeholder: 'business key', spellcheck: 'false', value: state.params.get('key') || '' }),
      el('button', { id: 'key-go', type: 'submit' }, 'Find'));
    state.fin = { stream: state.params.get('stream') || '', state: state.params.get('state') || '', key: '', after: null, next: null };
    const finished = el('form', { class: 'row', onsubmit: (e) => {
      e.preventDefault();
      state.fin = { stream: $('finished-stream').value.trim(), state: $('finished-state').value, key: $('finished-key').value.trim(), after: null, next: null };
      return loadFinished(state.gen);
    } },
      el('label', { for: 'finished-stream', class: 'sr-only' }, 'stream'),
      el('input', { id: 'finished-stream', type: 'search', placeholder: 'stream', spellcheck: 'false', value: state.fin.stream }),
      el('label', { for: 'finished-state', class: 'sr-only' }, 'state'),
      el('select', { id: 'finished-state' }, ...['', 'delivered', 'expired', 'dead', 'cancelled'].map((s) =>
        el('option', { value: s, selected: s === state.fin.state }, s || 'every state'))),
      el('label', { for: 'finished-key', class: 'sr-only' }, 'business key'),
      el('input', { id: 'finished-key', type: 'search', placeholder: 'any key', spellcheck: 'false' }),
      el('button', { id: 'finished-go', type: 'submit' }, 'Show'));
    view.append(
      card('Find a message', el('div', null, lookup, el('div', { id: 'lookup-result', class: 'result' }))),
      card('Find by business key', el('div', null, byKey, el('div', { id: 'key-result', class: 'result' }))),
      card('Upcoming', el('div', null,
        el('div', { id: 'upcoming-box', class: 'scroll' }, table('upcoming', ['Id'], [], 'loading…')),
        el('div', { class: 'pager' },
          button('First page', 'upcoming-first', '', () => { state.up.after = null; return loadUpcoming(state.gen); }),
          button('Next page', 'upcoming-next', '', () => loadUpcoming(state.gen, true), { disabled: true }))),
      { extra: filter }),
      card('Recently finished', el('div', null, finished,
        el('div', { id: 'finished-box', class: 'scroll' }, el('p', { class: 'muted' }, 'Enter a stream to see its messages that finished while records are kept, newest first.')),
        el('div', { class: 'pager' },
          button('Newest', 'finished-first', '', () => { state.fin.after = null; return loadFinished(state.gen); }),
          button('Older', 'finished-next', '', () => loadFinished(state.gen, true), { disabled: true })))));
  }

  // A stream's finished messages (delivered, expired, dead, cancelled), newest
  // first, a page at a time; each id opens the message.
  async function loadFinished(gen, nextPage) {
    const f = state.fin;
    const box = $('finished-box');
    if (!box || !f.stream) return;
    const after = nextPage ? f.next : f.after;
    let q = `/v1/streams/${enc(f.stream)}/finished?limit=50`;
    if (f.state) q += '&state=' + enc(f.state);
    if (f.key) q += '&key=' + enc(f.key);
    if (after) q += '&after=' + enc(after);
    const r = await api('GET', q);
    if (gen !== state.gen || !$('finished-box')) return;
    if (!r.ok || !r.body) { box.replaceChildren(el('p', { class: 'bad-text' }, errText(r))); return; }
    f.after = after || null;
    f.next = r.body.next || null;
    const msgs = Array.isArray(r.body.messages) ? r.body.messages : [];
    const now = Date.now();
    const rows = msgs.map((m) => el('tr', { data: { id: m.id } },
      td(el('a', { href: '#', class: 'mono', onclick: (e) => { e.preventDefault(); $('lookup-id').value = m.id; return doLookup(m.id); } }, m.id)),
      td(badge(m.state, 'state state-' + m.state)),
      td(when(m.at, now)),
      td(m.lateness_ms != null ? fmtMs(m.lateness_ms) : ''),
      td(m.entry_id != null ? code(m.entry_id) : ''),
      td(m.written_to && m.written_to !== f.stream ? m.written_to : ''),
      td(m.attempt != null ? String(m.attempt) : '')));
    const what = [f.state || 'finished', f.key ? `of key ${f.key}` : ''].filter(Boolean).join(' ');
    box.replaceChildren(table('finished', ['Id', 'State', 'When', 'Late', 'Entry', 'In', 'Attempt'], rows,
      `nothing ${what} in ${f.stream} on record`));
    $('finished-next').disabled = !f.next;
  }

  async function loadMessages(gen) {
    const id = state.params.get('id');
    const key = state.params.get('key');
    const stream = state.params.get('stream');
    await Promise.all([loadUpcoming(gen), id ? doLookup(id) : null, key && stream ? keyLookup(stream, key) : null,
      stream ? loadFinished(gen) : null]);
    if (state.params.get('finished') && $('finished-box')) $('finished-box').scrollIntoView();
  }

  // A business key's messages in a stream (pending first, then finished while
  // records are kept), each id opening the message; a writer may cancel them all.
  async function keyLookup(stream, key) {
    const box = $('key-result');
    if (!box) return;
    if (!stream || !key) { box.replaceChildren(el('p', { class: 'muted' }, 'Enter a stream and a business key.')); return; }
    box.replaceChildren(el('p', { class: 'muted' }, 'Looking up…'));
    const r = await api('GET', `/v1/streams/${enc(stream)}/keys/${enc(key)}?limit=1000`);
    if (!$('key-result')) return;
    if (!r.ok || !r.body) { box.replaceChildren(el('p', { class: 'bad-text' }, errText(r))); return; }
    const msgs = Array.isArray(r.body.messages) ? r.body.messages : [];
    const now = Date.now();
    const rows = msgs.map((m) => el('tr', { data: { id: m.id } },
      td(el('a', { href: '#', class: 'mono', onclick: (e) => { e.preventDefault(); $('lookup-id').value = m.id; return doLookup(m.id); } }, m.id)),
      td(badge(m.state, 'state state-' + m.state)),
      td(m.deliver_at != null ? when(m.deliver_at, now) : (m.at != null ? when(m.at, now) : '–')),
      td(m.entry_id != null ? code(m.entry_id) : '')));
    const out = el('div', null, table('key-messages', ['Id', 'State', 'Due / when', 'Entry'], rows,
      `no message of key ${key} in ${stream}, pending or on record`));
    if (r.body.next) out.append(el('p', { class: 'muted' }, 'The first 1000 shown.'));
    const pending = msgs.filter((m) => m.state === 'scheduled' || m.state === 'held').length;
    if (pending > 0 && canWrite()) {
      out.append(el('div', { class: 'actions' },
        button(`Cancel all ${pending} pending`, 'key-cancel', 'danger', () => cancelKey(stream, key, pending))));
    }
    box.replaceChildren(out);
  }

  async function cancelKey(stream, key, pending) {
    if (!window.confirm(`Cancel the ${pending} pending message(s) of key ${key} in ${stream}? They will not be delivered.`)) {
      setStatus(`Key ${key}: nothing cancelled.`);
      return;
    }
    const r = await api('DELETE', `/v1/streams/${enc(stream)}/keys/${enc(key)}`);
    if (!r.ok) { failStatus('Cancel by key', r); return; }
    setStatus(`Key ${key} in ${stream}: ${r.body.cancelled} cancelled, ${r.body.delivered} delivered before.`);
    await Promise.all([keyLookup(stream, key), loadUpcoming(state.gen), loadFinished(state.gen)]);
  }

  async function loadUpcoming(gen, nextPage) {
    const u = state.up;
    const after = nextPage ? u.next : u.after;
    let q = '/v1/upcoming?limit=50';
    if (u.stream) q += '&stream=' + enc(u.stream);
    if (after) q += '&after=' + enc(after);
    const r = await api('GET', q);
    if (gen !== state.gen) return;
    loaded([r]);
    if (!r.ok) {
      $('upcoming-box').replaceChildren(el('p', { class: 'empty' }, errText(r)));
      return;
    }
    u.after = after || null;
    u.next = (r.body && r.body.next) || null;
    const msgs = (r.body && Array.isArray(r.body.messages)) ? r.body.messages : [];
    const now = Date.now();
    const rows = msgs.map((m) => el('tr', { data: { id: m.id } },
      td(el('a', { href: '#', class: 'mono', onclick: (e) => { e.preventDefault(); $('lookup-id').value = m.id; return doLookup(m.id); } }, m.id)),
      td(m.stream),
      td(when(m.deliver_at, now)),
      td(m.priority == null ? '–' : String(m.priority)),
      td(m.held ? badge('held', 'warn') : '')));
    const empty = u.stream ? `nothing scheduled for ${u.stream}` : 'nothing scheduled: messages appear here once scheduled';
    $('upcoming-box').replaceChildren(table('upcoming', ['Id', 'Stream', 'Deliver at', 'Priority', ''], rows, empty));
    $('upcoming-next').disabled = !u.next;
  }

  async function doLookup(id) {
    const box = $('lookup-result');
    if (!box) return;
    if (!id) { box.replaceChildren(el('p', { class: 'muted' }, 'Enter a message id.')); return; }
    box.replaceChildren(el('p', { class: 'muted' }, 'Looking up…'));
    const r = await api('GET', '/v1/messages/' + enc(id));
    if (!$('lookup-result')) return;
    if (r.status === 404) {
      box.replaceChildren(el('p', { class: 'empty' }, 'no such message: ', code(id), el('span', { class: 'muted' }, ' (' + r.body.detail + ')')));
      return;
    }
    if (!r.ok || !r.body) {
      box.replaceChildren(el('p', { class: 'bad-text' }, errText(r)));
      return;
    }
    box.replaceChildren(messageView(r.body));
    if (state.session && state.session.journal) await loadJourney(id);
  }

  // A message's journey from the journal's transition log, oldest first, below its
  // page (asked only of a node with a journal); nothing without a history (404).
  async function loadJourney(id) {
    const r = await api('GET', '/v1/messages/' + enc(id) + '/history');
    const box = $('lookup-result');
    if (!box || !r.ok || !r.body || !Array.isArray(r.body.steps)) return;
    const now = Date.now();
    const rows = r.body.steps.map((s) => el('tr', null,
      td(when(s.at, now)),
      td(badge(s.step.replace('_', ' '), 'state step-' + s.step)),
      td(s.entry_id != null ? code(s.entry_id) : (s.deliver_at != null ? 'due ' + fmtTime(s.deliver_at) : '')),
      td(s.lateness_ms != null ? fmtMs(s.lateness_ms) : ''),
      td([s.attempt != null ? 'attempt ' + s.attempt : null, s.reason].filter((x) => x != null).join(' · ')),
      td([s.node, s.epoch != null ? 'epoch ' + s.epoch : null, s.shard != null ? 'shard ' + s.shard : null].filter((x) => x != null).join(' · ')),
      td(s.token || '')));
    box.append(el('div', { id: 'journey' }, el('h3', null, 'Journey'),
      table('journey', ['When', 'Step', 'Entry / due', 'Late', 'Why', 'Node', 'Token'], rows, 'no step on record')));
  }

  function messageView(m) {
    const now = Date.now();
    const kv = el('dl', { class: 'kv' });
    const add = (k, v) => { if (v != null) kv.append(el('dt', null, k), el('dd', null, v)); };
    add('Stream', m.stream);
    add('Business key', m.key != null ? code(m.key) : null);
    add('Entry id', m.entry_id != null ? code(m.entry_id) : null);
    add('Deliver at', m.deliver_at != null ? when(m.deliver_at, now) : null);
    add(m.state === 'delivered' ? 'Delivered' : 'At', m.at != null ? when(m.at, now) : null);
    add('Lateness', m.lateness_ms != null ? fmtMs(m.lateness_ms) : null);
    add('Priority', m.priority != null ? String(m.priority) : null);
    add('Created', m.created_at != null ? when(m.created_at, now) : null);
    add('Attempt', m.attempt != null ? String(m.attempt) : null);
    if (m.state === 'scheduled') add('Expires', m.expires_at != null ? when(m.expires_at, now) : 'never');
    add('Source', m.source || null);
    add('Detail', m.detail || null);
    const out = el('div', { class: 'msg' },
      el('div', { class: 'msg-head' }, code(m.id), badge(m.state, 'state state-' + m.state)), kv);
    if (Array.isArray(m.fields) && m.fields.length) {
      out.append(el('h3', null, 'Fields'), table('lookup-fields', ['Name', 'Value'],
        m.fields.map((f) => el('tr', null, td(code(f[0])), td(el('span', { class: 'val' }, String(f[1]))))), ''));
    }
    if (m.dead_letter === 'purged') {
      add('Dead letter', badge('purged', 'warn'));
    } else if (m.dead_letter === 'present' && m.target && isAdmin()) {
      out.append(el('div', { class: 'actions' },
        button('Replay dead letter', 'msg-replay', 'primary', () => replayOne(m.id, m.target))));
    }
    if (m.state === 'scheduled' && canWrite()) {
      out.append(el('div', { class: 'actions' },
        button('Deliver now', 'msg-deliver-now', 'primary', () => reschedule(m.id, { delay_ms: 0 })),
        button('Reschedule…', 'msg-reschedule', '', () => {
          const d = window.prompt('Deliver after this delay from now (e.g. 30s, 5m, 2h):', '5m');
          if (d == null || !d.trim()) { setStatus(`Reschedule of ${m.id}: nothing changed.`); return null; }
          return reschedule(m.id, { delay: d.trim() });
        }),
        button('Cancel message', 'msg-cancel', 'danger', () => cancelMessage(m.id))));
    }
    return out;
  }

  async function replayOne(id, target) {
    const r = await api('POST', `/v1/streams/${enc(target)}/dead/replay`, { ids: [id] });
    if (!r.ok) { failStatus('Replay', r); return; }
    const done = (r.body.replayed || []).length;
    const skipped = (r.body.skipped || [])[0];
    setStatus(done ? `Message ${id} replayed into ${target}: due now.` : `Message ${id} not replayed: ${skipped ? skipped.why : 'not found'}.`, done ? '' : 'err');
    await doLookup(id);
  }

  async function reschedule(id, body) {
    const r = await api('POST', `/v1/messages/${enc(id)}/reschedule`, body);
    if (!r.ok) { failStatus('Reschedule', r); return; }
    const at = r.body && r.body.deliver_at;
    setStatus(body.delay_ms === 0
      ? `Message ${r.body.id || id} is due now (deliver_at ${fmtTime(at)}).`
      : `Message ${r.body.id || id} rescheduled: delivers at ${fmtTime(at)} (${fmtAge(at)}).`);
    await doLookup(id);
  }

  async function cancelMessage(id) {
    if (!window.confirm(`Cancel message ${id}? It will not be delivered.`)) { setStatus(`Message ${id} kept.`); return; }
    const r = await api('DELETE', '/v1/messages/' + enc(id));
    if (!r.ok) { failStatus('Cancel', r); return; }
    setStatus(`Message ${(r.body && r.body.id) || id}: ${(r.body && r.body.state) || 'cancelled'}.`);
    await doLookup(id);
  }

  // --- schedules

  function renderSchedules(view) {
    view.append(card('Recurring schedules', el('div', { id: 'schedules-box', class: 'scroll' },
      table('schedules', ['Id'], [], 'loading…'))));
  }

  async function loadSchedules(gen) {
    const r = await api('GET', '/v1/schedules');
    if (gen !== state.gen) return;
    loaded([r]);
    if (!r.ok) { $('schedules-box').replaceChildren(el('p', { class: 'empty' }, errText(r))); return; }
    const all = (r.body && Array.isArray(r.body.schedules)) ? r.body.schedules : [];
    const now = Date.now();
    const rows = all.map((s) => el('tr', { data: { id: s.id } },
      td(code(s.id)),
      td(s.stream),
      td(s.cron ? `${s.cron} (${s.timezone || 'UTC'})` : `every ${s.every}`),
      td(s.paused ? badge('paused', 'warn') : (Array.isArray(s.next) && s.next.length ? when(s.next[0], now) : '–')),
      td(s.last != null ? when(s.last, now) : '–'),
      td(s.misfire + (s.misfire === 'all' ? ` (≤ ${s.max_catch_up})` : '')),
      td(s.missed ? badge(`${s.missed} missed`, 'warn') : '0'),
      td(s.declared ? badge('config file', 'role-standby') : 'API'),
      td(canWrite() && !s.declared ? button(s.paused ? 'Resume' : 'Pause', 'schedule-' + (s.paused ? 'resume-' : 'pause-') + s.id, '',
        () => pauseSchedule(s.id, !s.paused)) : '')));
    $('schedules-box').replaceChildren(table('schedules', ['Id', 'Stream', 'When', 'Next', 'Last made', 'Misfire', 'Missed', 'Declared in', ''], rows,
      'no schedules: POST /v1/schedules or delayq schedule add makes one'));
  }

  async function pauseSchedule(id, pause) {
    const r = await api('POST', `/v1/schedules/${enc(id)}/${pause ? 'pause' : 'resume'}`);
    if (!r.ok) { failStatus(pause ? 'Pause' : 'Resume', r); return; }
    setStatus(`Schedule ${id} ${pause ? 'paused: no occurrence until resumed' : 'resumed: occurrences from now on'}.`);
    await loadSchedules(state.gen);
  }

  // --- dead letters

  function renderDead(view) {
    state.dead.stream = state.params.get('stream') || '';
    state.dead.after = null;
    const pick = el('div', { class: 'row' },
      el('label', { for: 'dead-stream', class: 'muted' }, 'Stream'),
      el('select', { id: 'dead-stream', onchange: (e) => { if (e.target.value) location.hash = '#/dead?stream=' + enc(e.target.value); } },
        el('option', { value: '' }, 'loading…')),
      el('form', { class: 'row', onsubmit: (e) => {
        e.preventDefault();
        const v = $('dead-stream-input').value.trim();
        if (v) location.hash = '#/dead?stream=' + enc(v);
      } },
        el('input', { id: 'dead-stream-input', type: 'search', placeholder: 'or type a stream', 'aria-label': 'stream name' }),
        el('button', { id: 'dead-stream-go', type: 'submit' }, 'Open')));
    const acts = isAdmin() ? el('div', { class: 'actions' },
      button('Replay selected', 'dead-replay-selected', 'primary', () => deadAction('replay', false)),
      button('Replay all matching', 'dead-replay-all', '', () => deadAction('replay', true)),
      button('Purge selected', 'dead-purge-selected', 'danger', () => deadAction('purge', false)),
      button('Purge all matching', 'dead-purge-all', 'danger', () => deadAction('purge', true))) : null;
    // Which dead letters "all matching" takes: the start of the reason, and when they died.
    const filter = isAdmin() ? el('form', { class: 'row', id: 'dead-filter', onsubmit: (e) => { e.preventDefault(); return countMatching(); } },
      el('label', { for: 'dead-reason', class: 'muted' }, 'Reason starts with'),
      el('input', { id: 'dead-reason', type: 'search', placeholder: 'expired, max_attempts, …' }),
      el('label', { for: 'dead-since', class: 'muted' }, 'died from'),
      el('input', { id: 'dead-since', type: 'datetime-local' }),
      el('label', { for: 'dead-until', class: 'muted' }, 'to'),
      el('input', { id: 'dead-until', type: 'datetime-local' }),
      el('button', { id: 'dead-count', type: 'submit' }, 'Count matching'),
      el('span', { id: 'dead-matching', class: 'muted small' })) : null;
    view.append(card('Dead letters', el('div', null,
      filter,
      acts,
      el('p', { id: 'dead-summary', class: 'muted small' }),
      el('div', { id: 'dead-box', class: 'scroll' }),
      el('div', { class: 'pager' },
        button('First page', 'dead-first', '', () => { state.dead.after = null; return loadDeadEntries(state.gen); }),
        button('Next page', 'dead-next', '', () => loadDeadEntries(state.gen, true), { disabled: true }))),
    { extra: pick }));
  }

  async function loadDead(gen) {
    const r = await api('GET', '/v1/streams');
    if (gen !== state.gen) return;
    const list = r.ok && r.body && Array.isArray(r.body.streams) ? r.body.streams : [];
    state.dead.streams = list;
    if (!r.ok) loaded([r]);
    const d = state.dead;
    if (!d.stream && list.length) d.stream = (list.find((s) => s.dead > 0) || list[0]).stream;
    const sel = $('dead-stream');
    const opts = list.map((s) => el('option', { value: s.stream }, `${s.stream} (${fmtInt(s.dead)} dead)`));
    if (d.stream && !list.some((s) => s.stream === d.stream)) opts.push(el('option', { value: d.stream }, d.stream));
    if (!opts.length) opts.push(el('option', { value: '' }, 'no streams'));
    sel.replaceChildren(...opts);
    sel.value = d.stream;
    if (!d.stream) {
      $('dead-box').replaceChildren(el('p', { class: 'empty' }, 'no streams yet: messages appear here once scheduled'));
      return;
    }
    await loadDeadEntries(gen);
  }

  async function loadDeadEntries(gen, nextPage) {
    const d = state.dead;
    const after = nextPage ? d.next : d.after;
    let q = `/v1/streams/${enc(d.stream)}/dead?limit=50`;
    if (after) q += '&after=' + enc(after);
    const r = await api('GET', q);
    if (gen !== state.gen) return;
    loaded([r]);
    if (!r.ok || !r.body) {
      $('dead-box').replaceChildren(el('p', { class: 'empty' }, errText(r)));
      return;
    }
    d.after = after || null;
    d.next = r.body.next || null;
    d.dls = r.body.dead_letter_stream || d.stream + ':dead';
    const entries = Array.isArray(r.body.entries) ? r.body.entries : [];
    const known = d.streams.find((s) => s.stream === d.stream);
    setText('dead-summary', `${d.dls}` + (known ? ` · ${plural(known.dead || 0, 'dead letter')}` : '') + (after ? ' · later page' : ''));
    const all = el('input', { type: 'checkbox', id: 'dead-select-all', 'aria-label': 'select all on this page', onchange: (e) => {
      for (const c of document.querySelectorAll('#dead input.dead-select:not([disabled])')) c.checked = e.target.checked;
    } });
    const now = Date.now();
    const rows = entries.map((e) => {
      const extra = e.delayq || {};
      const due = Number(extra['delayq-due']);
      const held = extra['delayq-group'] ? `${extra['delayq-group']} / ${extra['delayq-consumer'] || '?'}` : '–';
      return el('tr', { data: { entryId: e.entry_id } },
        td(el('input', { type: 'checkbox', class: 'dead-select', value: e.id || '', disabled: e.id == null, 'aria-label': 'select ' + (e.id || e.entry_id) })),
        td(e.id ? el('a', { href: '#/messages?id=' + enc(e.id), class: 'mono' }, e.id) : el('span', { class: 'muted' }, 'no id'),
          e.key ? el('div', { class: 'muted small' }, 'key ', code(e.key)) : null),
        td(el('div', { class: 'reason' }, e.reason || '–'),
          e.reason === 'expired' && due ? el('div', { class: 'muted small' }, 'was due ', when(due, now)) : null),
        td(el('span', { title: 'entry ' + e.entry_id }, when(Number(String(e.entry_id).split('-')[0]), now))),
        td(e.attempt == null ? '–' : String(e.attempt)),
        td(held, e.last_delivery ? el('div', { class: 'muted small' }, 'last ', when(e.last_delivery, now)) : null),
        td(fieldsCell(e.fields)));
    });
    const t = table('dead', ['', 'Message id', 'Reason', 'Died', 'Attempt', 'Last held by', 'Fields'], rows, `no dead letters in ${d.dls}`);
    t.querySelector('th').append(all);
    $('dead-box').replaceChildren(t);
    $('dead-next').disabled = !d.next;
  }

  function fieldsCell(fields) {
    if (!Array.isArray(fields) || !fields.length) return el('span', { class: 'muted' }, 'none');
    return el('div', { class: 'fields' }, fields.slice(0, 6).map((f) =>
      el('div', { title: `${f[0]} = ${f[1]}` }, el('span', { class: 'fk' }, String(f[0])), ' ', el('span', { class: 'val' }, String(f[1])))),
    fields.length > 6 ? el('div', { class: 'muted' }, `+${fields.length - 6} more`) : null);
  }

  // The filter's fields of an "all" request, and how it reads.
  function deadFilter() {
    const f = { all: true };
    const words = [];
    const reason = ($('dead-reason') || {}).value;
    if (reason && reason.trim()) { f.reason = reason.trim(); words.push(`reason "${f.reason}…"`); }
    for (const [name, label] of [['since', 'from'], ['until', 'to']]) {
      const v = ($('dead-' + name) || {}).value;
      const ms = v ? new Date(v).getTime() : NaN;
      if (Number.isFinite(ms)) { f[name] = ms; words.push(`${label} ${v.replace('T', ' ')}`); }
    }
    return { body: f, text: words.length ? 'matching ' + words.join(', ') : '' };
  }

  // How many dead letters "all matching" takes now: a dry run, page by page.
  async function matchingCount() {
    const d = state.dead;
    const { body } = deadFilter();
    let matched = 0, after = null, calls = 0;
    do {
      const r = await api('POST', `/v1/streams/${enc(d.stream)}/dead/replay`, { ...body, dry_run: true, ...(after ? { after } : {}) });
      if (!r.ok || !r.body) return { fail: r };
      matched += r.body.matched || 0;
      after = r.body.next;
      calls++;
    } while (after && calls < 1000);
    return { matched };
  }

  async function countMatching() {
    const d = state.dead;
    if (!d.stream) { setStatus('Choose a stream first.', 'err'); return; }
    const { matched, fail } = await matchingCount();
    if (fail) { setStatus(`Counting failed: ${errText(fail)}`, 'err'); return; }
    setText('dead-matching', `${plural(matched, 'dead letter')} ${deadFilter().text || 'in all'}`);
  }

  async function deadAction(kind, all) {
    const d = state.dead;
    if (!d.stream) { setStatus('Choose a stream first.', 'err'); return; }
    const dls = d.dls || d.stream + ':dead';
    let ids = [];
    if (!all) {
      ids = [...new Set([...document.querySelectorAll('#dead input.dead-select:checked')].map((c) => c.value).filter(Boolean))];
      if (!ids.length) { setStatus('Select dead letters first (the boxes on the left).', 'err'); return; }
    }
    const filter = deadFilter();
    let howMany = String(ids.length);
    if (all) {
      // Counted first, so that the question says how many it takes.
      const { matched, fail } = await matchingCount();
      if (fail) { setStatus(`Counting failed: ${errText(fail)}`, 'err'); return; }
      if (!matched) { setStatus(`No dead letters in ${dls} ${filter.text}.`.replace(' .', '.')); return; }
      howMany = `${matched}` + (filter.text ? ` ${filter.text}` : '');
    }
    if (kind === 'purge' && !window.confirm(`Purge ${howMany} dead letter(s) from ${dls}? This cannot be undone.`)) {
      setStatus('Purge not done.'); return;
    }
    if (kind === 'replay' && all && !window.confirm(`Replay ${howMany} dead letter(s) from ${dls}? They are scheduled again for delivery.`)) {
      setStatus('Replay not done.'); return;
    }
    const path = `/v1/streams/${enc(d.stream)}/dead/${kind}`;
    const acc = { replayed: 0, skipped: [], not_found: 0, purged: 0 };
    let after = null, calls = 0, fail = null;
    do {
      const body = all ? (after ? { ...filter.body, after } : filter.body) : { ids };
      const r = await api('POST', path, body);
      if (!r.ok || !r.body) { fail = r; break; }
      const b = r.body;
      acc.replayed += (b.replayed || []).length;
      acc.skipped.push(...(b.skipped || []));
      acc.not_found += (b.not_found || []).length;
      acc.purged += b.purged || 0;
      after = all ? b.next : null;
      calls++;
    } while (after && calls < 1000);
    let msg = kind === 'replay'
      ? `${acc.replayed} replayed, ${acc.skipped.length} skipped`
      : `${acc.purged} purged`;
    if (acc.not_found) msg += `, ${acc.not_found} not found`;
    if (acc.skipped.length) msg += ' (' + acc.skipped.slice(0, 3).map((s) => `${s.id}: ${s.why}`).join('; ') + (acc.skipped.length > 3 ? '; …' : '') + ')';
    msg += ` in ${dls}.`;
    if (fail) setStatus(`${calls ? msg + ' Then ' : ''}${kind} failed: ${errText(fail)}`, 'err');
    else setStatus(msg);
    d.after = null;
    await loadDead(state.gen);
  }

  // --- admin

  function renderAdmin(view) {
    const me = (state.session && state.session.node_id) || 'this node';
    if (!isAdmin()) {
      view.append(el('div', { class: 'alert info' },
        `Actions here need an admin token; this session has ${state.scope ? 'the ' + state.scope + ' scope' : 'no known scope'}.`));
    } else {
      view.append(el('div', { class: 'cols' },
        card('Switchover', el('div', null,
          el('p', { class: 'muted' }, 'The leader steps down and hands leadership to a standby.'),
          el('div', { class: 'row' },
            el('label', { for: 'switchover-to', class: 'muted' }, 'To'),
            el('select', { id: 'switchover-to' }, el('option', { value: '' }, 'any standby')),
            button('Switch over', 'switchover-go', 'primary', switchover))), { class: 'wide' }),
        card('This node', el('div', null,
          el('p', { class: 'muted' }, `Acts on ${me}, the node serving this page.`),
          el('div', { class: 'actions' },
            button('Reload config', 'reload-go', '', reloadConfig),
            button('Resign leadership', 'resign-go', 'danger', resign)),
          el('p', { id: 'resign-note', class: 'muted small' }, 'This node stands by: it has no leadership to resign.')))));
      showResign();
    }
    view.append(card('Fences', el('div', null, el('p', { id: 'fences-summary', class: 'muted small' }),
      el('div', { id: 'fences-box', class: 'scroll' }, table('fences', ['Shard'], [], 'loading…')))));
    if (isAdmin()) {
      view.append(card('Audit trail', el('div', null,
        el('p', { class: 'muted small' }, 'Admin actions and cancels, refused ones too, newest first: who (a token\'s name or fingerprint), from where, what, and the answer.'),
        el('div', { id: 'audit-box', class: 'scroll' }, table('audit', ['When'], [], 'loading…')))));
    }
  }

  async function loadAudit(gen) {
    const r = await api('GET', '/v1/admin/audit?limit=50');
    if (gen !== state.gen || !$('audit-box')) return;
    if (!r.ok || !r.body) { $('audit-box').replaceChildren(el('p', { class: 'empty' }, errText(r))); return; }
    const now = Date.now();
    const rows = (r.body.entries || []).map((e) => el('tr', { class: Number(e.status) >= 400 ? 'warn-row' : null },
      td(when(Number(e.at), now)), td(e.who || '–'), td(e.from || '–'), td(e.what || '–'),
      td(e.target || '–'), td(e.status || '–'), td(e.node || '–')));
    $('audit-box').replaceChildren(table('audit', ['When', 'Who', 'From', 'What', 'Target', 'Answer', 'Node'], rows, 'nothing recorded yet'));
  }

  async function loadAdmin(gen) {
    if (isAdmin()) loadAudit(gen);
    const [n, f] = await Promise.all([isAdmin() ? api('GET', '/v1/nodes') : null, api('GET', '/v1/fences')]);
    if (gen !== state.gen) return;
    loaded([n, f].filter(Boolean));
    if (n && n.ok && n.body && $('switchover-to')) {
      const opts = (n.body.nodes || []).filter((x) => x.role !== 'gone' && x.role !== 'leader')
        .map((x) => el('option', { value: x.node_id }, `${x.node_id} (${x.role}${x.address ? ', ' + x.address : ''})`));
      $('switchover-to').replaceChildren(el('option', { value: '' }, 'any standby'), ...opts);
    }
    if (!f.ok || !f.body) {
      $('fences-box').replaceChildren(el('p', { class: 'empty' }, errText(f)));
      return;
    }
    const b = f.body;
    setText('fences-summary', `highest fence ${b.highest == null ? 'unknown' : b.highest} · leader epoch ${b.leader_epoch == null ? 'none' : b.leader_epoch}`);
    const rows = (b.shards || []).map((s) => el('tr', { class: b.leader_epoch != null && s.fence > b.leader_epoch ? 'warn-row' : null },
      td(String(s.shard)), td(s.fence == null ? '–' : String(s.fence)),
      td(s.fence === b.highest ? badge('highest', 'subtle') : '')));
    $('fences-box').replaceChildren(table('fences', ['Shard', 'Fence', ''], rows, 'no fences written yet'));
  }

  async function switchover() {
    const to = $('switchover-to').value;
    if (!window.confirm(`Switch leadership over to ${to || 'any standby'}? The current leader steps down.`)) {
      setStatus('Switchover not done.'); return;
    }
    setStatus('Switchover under way…');
    const r = await api('POST', '/v1/admin/switchover', to ? { to } : {});
    if (!r.ok || !r.body) {
      const why = { 404: 'unknown node', 409: 'refused', 504: 'not done in time' }[r.status];
      failStatus('Switchover' + (why ? ` (${why})` : ''), r); return;
    }
    setStatus(`Switchover done: ${r.body.from} → ${r.body.to}, epoch ${r.body.epoch}.`);
    await Promise.all([refreshHeader(), loadAdmin(state.gen)]);
  }

  async function reloadConfig() {
    const r = await api('POST', '/v1/admin/reload');
    if (!r.ok || !r.body) { failStatus('Reload', r); return; }
    const b = r.body;
    const changedKeys = b.changed || [], restart = b.restart_needed || [];
    let msg = `Reloaded the configuration of ${b.node_id} (the node serving this page): `;
    msg += changedKeys.length ? 'changed ' + changedKeys.join(', ') : 'nothing changed';
    if (restart.length) msg += '; needs a restart to apply: ' + restart.join(', ');
    const fromEnv = b.from_environment || [];
    if (fromEnv.length) msg += '; set by the environment, so the file is not used for: ' + fromEnv.join(', ');
    setStatus(msg + '.');
  }

  async function resign() {
    const me = (state.session && state.session.node_id) || 'this node';
    if (!window.confirm(`Make ${me} resign leadership? A standby takes over.`)) { setStatus('Resign not done.'); return; }
    const r = await api('POST', '/v1/admin/resign');
    if (!r.ok || !r.body) { failStatus('Resign', r); return; }
    setStatus(r.body.resigned
      ? `${r.body.node_id} resigned leadership (gave up epoch ${r.body.epoch}).`
      : `${r.body.node_id || me} did not resign (not the leader).`);
    await Promise.all([refreshHeader(), loadAdmin(state.gen)]);
  }

  // --- routing and polling

  const pages = {
    overview: { render: renderOverview, load: loadOverview, poll: true },
    streams: { render: renderStreams, load: loadStreams, poll: true },
    messages: { render: renderMessages, load: loadMessages },
    dead: { render: renderDead, load: loadDead },
    schedules: { render: renderSchedules, load: loadSchedules, poll: true },
    admin: { render: renderAdmin, load: loadAdmin },
  };

  function route() {
    // Tokens required and none accepted: ask for one before asking for any data.
    if (state.session && state.session.tokens_required && !state.scope) {
      showAuth({ detail: getToken() ? 'this daemon does not know that token' : 'enter a token to go on' });
      return;
    }
    const h = location.hash.replace(/^#\/?/, '');
    const [name, query] = h.split('?');
    state.page = pages[name] ? name : 'overview';
    state.params = new URLSearchParams(query || '');
    state.gen++;
    state.seen = {};
    for (const n of Object.keys(pages)) {
      const a = $('nav-' + n);
      a.classList.toggle('active', n === state.page);
      if (n === state.page) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    const view = $('view');
    view.replaceChildren();
    view.dataset.page = state.page;
    pages[state.page].render(view);
    refresh(true);
    if (state.page !== 'overview') refreshHeader().catch(oops);
  }

  async function refresh(force) {
    if (state.busy && !force) return;
    state.busy++;
    try { await pages[state.page].load(state.gen); } catch (e) { oops(e); } finally { state.busy--; }
  }

  function tick() {
    if (document.hidden || !$('auth').hidden) return;
    state.ticks++;
    if (pages[state.page].poll) refresh(false);
    else if (state.ticks % 5 === 0) refreshHeader().catch(oops);
  }

  async function boot() {
    applyTheme(store('local', THEME_KEY));
    if (window.matchMedia) {
      const mq = window.matchMedia('(prefers-color-scheme: dark)');
      if (mq.addEventListener) mq.addEventListener('change', safe(() => applyTheme()));
    }
    $('theme-toggle').addEventListener('click', safe(toggleTheme));
    $('token-form').addEventListener('submit', safe(saveToken));
    $('token-forget').addEventListener('click', safe(forgetToken));
    window.addEventListener('hashchange', safe(() => { dropPassingStatus(); return route(); }));
    document.addEventListener('visibilitychange', safe(() => { if (!document.hidden) tick(); }));
    updateTokenLink();
    await loadSession();
    route();
    setInterval(safe(tick), POLL_MS);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', safe(boot));
  else safe(boot)();
})();
