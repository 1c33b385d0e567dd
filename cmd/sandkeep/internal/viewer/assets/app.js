// sandkeep run viewer. Everything shown is set as text (never as markup): event data is
// an agent's output, and the page's Content-Security-Policy enforces Trusted Types, so an
// HTML sink would throw. The page reads only the HTTP API of the server that served it.
'use strict';
(() => {
  // The API's rules, checked here before anything is fetched (shared/contract CheckID and
  // CheckTenant; viewer_test.go holds these to the server's): an id is 1-256 characters of
  // [A-Za-z0-9._:-] and neither "." nor ".."; a tenant 0-64 characters of [A-Za-z0-9._-].
  const idRule = /^[A-Za-z0-9._:-]{1,256}$/;
  const tenantRule = /^[A-Za-z0-9._-]{0,64}$/;
  const validId = (s) => idRule.test(s) && s !== '.' && s !== '..';
  const statuses = ['running', 'interrupted', 'completed', 'failed', 'aborted'];
  // show quotes a value from the address for an error message: control characters visible.
  const show = (s) => JSON.stringify(s);

  // The page's own query: ?tenant=NAME at most. Anything else is an error view, never a
  // request with a header the browser refuses (which would look like a lost connection).
  const { tenant, tenantError } = (() => {
    const q = new URLSearchParams(location.search);
    for (const k of q.keys()) {
      if (k !== 'tenant') return { tenant: '', tenantError: 'the page takes only ?tenant=NAME, not ' + show(k) + '.' };
    }
    const all = q.getAll('tenant');
    if (all.length > 1) return { tenant: '', tenantError: 'the tenant is given ' + all.length + ' times.' };
    const t = all[0] || '';
    if (!tenantRule.test(t)) {
      return { tenant: '', tenantError: 'the tenant ' + show(t) + ' is not a tenant name: up to 64 characters of A-Z, a-z, 0-9, ".", "_" and "-".' };
    }
    return { tenant: t, tenantError: '' };
  })();
  const main = document.getElementById('main');
  const conn = document.getElementById('conn');
  let skew = 0; // server clock minus ours (ms), from every answer's `now`
  let gen = 0; // the current view; loops of an older view stop
  const nowMs = () => Date.now() + skew;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const terminal = (s) => s === 'completed' || s === 'failed' || s === 'aborted';

  // el builds an element: attrs are set as attributes (never HTML), children that are not
  // nodes become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  class APIError extends Error {
    constructor(status, code, detail) {
      super(detail || ('HTTP ' + status));
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body, signal) {
    const headers = { Accept: 'application/json' };
    if (tenant) headers['X-Sandkeep-Tenant'] = tenant;
    const init = { method, headers, cache: 'no-store', signal };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let doc = null;
    try {
      doc = JSON.parse(await res.text());
    } catch (e) {
      doc = null;
    }
    if (!res.ok) throw new APIError(res.status, doc && doc.code, doc && doc.detail);
    if (doc && typeof doc.now === 'number') skew = doc.now - Date.now();
    return doc;
  }

  function setConn(ok, text) {
    conn.dataset.state = ok ? 'ok' : 'down';
    conn.textContent = text || (ok ? 'live' : 'reconnecting…');
  }

  // ---- formatting
  function dur(ms) {
    let s = Math.max(0, Math.floor(ms / 1000));
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (h) return h + 'h' + m + 'm';
    if (m) return m + 'm' + s + 's';
    return s + 's';
  }
  function stamp(ms) {
    if (!ms) return '—';
    const d = new Date(ms);
    const p = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + ' ' +
      p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
  }
  // Live cells: re-rendered every half second from the server-corrected clock.
  function detachedText(since) {
    return since ? 'detached for ' + dur(nowMs() - since) : 'attached';
  }
  function leaseText(run) {
    if (terminal(run.status)) return '—';
    if (!run.leaseUntil) return 'never leased';
    const left = run.leaseUntil - nowMs();
    return left >= 0 ? dur(left) + ' left' : 'lapsed ' + dur(-left) + ' ago';
  }
  function live(kind, value, run) {
    return el('span', { class: 'live', 'data-live': kind, 'data-v': value === undefined ? '' : value,
      'data-status': run ? run.status : '' }, kind === 'detached' ? detachedText(value) : leaseText(run));
  }
  setInterval(() => {
    for (const e of document.querySelectorAll('[data-live]')) {
      const v = Number(e.dataset.v) || 0;
      e.textContent = e.dataset.live === 'detached' ? detachedText(v) : leaseText({ leaseUntil: v, status: e.dataset.status });
    }
  }, 500);

  const badge = (status) => el('span', { class: 'badge st-' + status }, status);
  const runLink = (id) => el('a', { href: '#/runs/' + encodeURIComponent(id) }, id);
  function sandboxText(sb) {
    if (!sb) return '—';
    const who = (sb.provider || '?') + ' ' + (sb.providerSandboxId || '(not recorded)');
    return sb.state === 'live' ? who : who + ' (' + sb.state + ')';
  }
  // lifecycleText says what the sandbox costs now (running, stopped, archived, gone) and
  // since when (docs/design.md §5).
  function lifecycleText(sb) {
    if (!sb || !sb.lifecycle) return '—';
    return sb.lifecycle + (sb.lifecycleSince ? ' since ' + stamp(sb.lifecycleSince) : '');
  }

  // ---- routing
  // parseHash turns the address's fragment into a view, or an error that says what is wrong
  // with it: every id is checked here, before any request is made with it.
  function parseHash(hash) {
    const h = hash.replace(/^#/, '') || '/';
    const qi = h.indexOf('?');
    const path = qi < 0 ? h : h.slice(0, qi);
    const query = qi < 0 ? '' : h.slice(qi + 1);
    if (path === '/') {
      const q = new URLSearchParams(query);
      const f = {};
      for (const k of new Set(q.keys())) {
        if (!['thread', 'status', 'cursor'].includes(k)) return { error: 'the runs list takes thread, status and cursor, not ' + show(k) + '.' };
        if (q.getAll(k).length > 1) return { error: show(k) + ' is given more than once.' };
        f[k] = q.get(k);
      }
      if (f.thread !== undefined && !validId(f.thread)) return { error: 'the thread ' + show(f.thread) + ' is not a thread id: 1-256 characters of A-Z, a-z, 0-9, ".", "_", ":" and "-", not "." or "..".' };
      if (f.status !== undefined && !statuses.includes(f.status)) return { error: 'the status ' + show(f.status) + ' is not one of ' + statuses.join(', ') + '.' };
      if (f.cursor !== undefined && !/^[A-Za-z0-9_-]{1,1024}$/.test(f.cursor)) return { error: 'the cursor ' + show(f.cursor) + ' is not a cursor of the runs list.' };
      return { view: 'runs', thread: f.thread || '', status: f.status || '', cursor: f.cursor || '' };
    }
    if (path === '/reaper' && !query) return { view: 'reaper' };
    if (path.startsWith('/runs/') && !query) {
      const seg = path.slice(6);
      let id;
      try {
        id = decodeURIComponent(seg);
      } catch (e) {
        return { error: 'the run id ' + show(seg) + ' is not validly percent-encoded.' };
      }
      if (!validId(id)) return { error: 'the run id ' + show(id) + ' is not a run id: 1-256 characters of A-Z, a-z, 0-9, ".", "_", ":" and "-", not "." or "..".' };
      return { view: 'run', id };
    }
    return { error: 'no page of this viewer is at ' + show('#' + h) + '.' };
  }

  function route() {
    gen++;
    if (tenantError) return errorView('Not a tenant', tenantError, '/');
    const r = parseHash(location.hash);
    document.getElementById('nav-runs').classList.toggle('on', r.view === 'runs');
    document.getElementById('nav-reaper').classList.toggle('on', r.view === 'reaper');
    if (r.error) return errorView('Not an address of this viewer', r.error, '#/');
    if (r.view === 'run') return runView(gen, r.id);
    if (r.view === 'reaper') return reaperView(gen);
    return runsView(gen, r);
  }
  window.addEventListener('hashchange', route);
  document.getElementById('tenant').textContent = tenantError ? '(invalid)' : tenant || 'local (the dev default)';

  // errorView replaces the page with what is wrong with its address; nothing is fetched.
  function errorView(title, what, back) {
    setConn(true, 'idle');
    main.replaceChildren(el('h1', {}, title), el('p', { class: 'error', id: 'route-error' }, what),
      el('p', {}, el('a', { href: back }, back === '/' ? 'Open the viewer as the default tenant' : '← Runs')));
  }

  // poll calls fetchFn every period while the view is current, retrying after errors.
  async function poll(g, period, fetchFn) {
    while (g === gen) {
      try {
        await fetchFn();
        setConn(true);
      } catch (e) {
        if (e instanceof APIError && e.status < 500) {
          setConn(true);
          throw e;
        }
        setConn(false);
      }
      await sleep(period);
    }
  }

  function errorBox(e) {
    return el('p', { class: 'error' }, (e.code ? e.code + ': ' : '') + e.message);
  }

  // ---- the runs list
  function runsView(g, f) {
    const { thread, status, cursor } = f;
    const threadIn = el('input', { id: 'filter-thread', placeholder: 'any thread', value: thread, spellcheck: 'false' });
    const statusIn = el('select', { id: 'filter-status' },
      ['', ...statuses].map((s) =>
        el('option', { value: s, selected: s === status }, s || 'any status')));
    const apply = () => {
      const p = new URLSearchParams();
      if (threadIn.value.trim()) p.set('thread', threadIn.value.trim());
      if (statusIn.value) p.set('status', statusIn.value);
      location.hash = '#/' + (p.toString() ? '?' + p : '');
    };
    const form = el('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); apply(); } },
      el('label', {}, 'Thread ', threadIn), el('label', {}, 'Status ', statusIn),
      el('button', { type: 'submit' }, 'Filter'),
      (thread || status || cursor) ? el('a', { href: '#/' }, 'clear') : null);
    statusIn.addEventListener('change', apply);
    const body = el('tbody', { id: 'runs-body' });
    const note = el('p', { class: 'muted', id: 'runs-note' }, 'Loading…');
    const older = el('p', { class: 'pager' });
    main.replaceChildren(el('h1', {}, 'Runs'), form,
      el('table', { class: 'runs' },
        el('thead', {}, el('tr', {}, ['Run', 'Thread', 'Status', 'Epoch', 'Detached', 'Cancel', 'Driver lease',
          'Sandbox', 'Started', 'Finished'].map((h) => el('th', {}, h)))),
        body),
      note, older);
    const p = new URLSearchParams({ limit: '50' });
    if (thread) p.set('threadId', thread);
    if (status) p.set('status', status);
    if (cursor) p.set('cursor', cursor);
    poll(g, 1000, async () => {
      const page = await api('GET', '/v1/runs?' + p);
      if (g !== gen) return;
      body.replaceChildren(...page.runs.map((r) => el('tr', { 'data-run-id': r.runId },
        el('td', {}, runLink(r.runId)),
        el('td', {}, el('a', { href: '#/?thread=' + encodeURIComponent(r.threadId) }, r.threadId)),
        el('td', { class: 'status' }, badge(r.status)),
        el('td', { class: 'num' }, r.driverEpoch || 0),
        el('td', {}, terminal(r.status) ? (r.detachedSince ? 'was detached' : '—') : live('detached', r.detachedSince)),
        el('td', {}, r.cancelRequested ? el('span', { class: 'flag' }, 'requested') : '—'),
        el('td', {}, live('lease', r.leaseUntil, r)),
        el('td', { class: 'sandbox' }, sandboxText(r.sandbox)),
        el('td', {}, stamp(r.startedAt)),
        el('td', {}, stamp(r.finishedAt)))));
      note.textContent = page.runs.length ? '' : 'No runs' + (thread || status ? ' match the filter' : ' yet: start one with `sandkeep run --thread T -- CMD`') + '.';
      older.replaceChildren(...(page.next ? [el('a', { href: '#/?' + new URLSearchParams(
        Object.fromEntries([...(thread ? [['thread', thread]] : []), ...(status ? [['status', status]] : []), ['cursor', page.next]])) }, 'Older runs →')] : []));
    }).catch((e) => { if (g === gen) note.replaceChildren(errorBox(e)); });
  }

  // ---- one run
  function runView(g, id) {
    const enc = encodeURIComponent(id);
    const origin = location.origin;
    const tflag = tenant ? ' --tenant ' + shellQuote(tenant) : '';
    // Taking over works only on a run that has not ended: a terminal run is offered its log.
    const cmdsFor = (done) => done ? [
      ['read its log (the run has ended: it cannot be taken over)', 'sandkeep tail --api ' + origin + tflag + ' ' + shellQuote(id)],
    ] : [
      ['attach (take the run over and keep streaming)', 'sandkeep attach --api ' + origin + tflag + ' ' + shellQuote(id)],
      ['tail (read only)', 'sandkeep tail --api ' + origin + tflag + ' --follow ' + shellQuote(id)],
    ];
    const cmdsBox = el('div', { class: 'cmds', id: 'cmds' });
    const driver = el('p', { class: 'driver', id: 'driver-state' });
    let cmdsDone = null; // the commands shown are those of a run that has ended (or not yet shown)
    const record = el('dl', { class: 'record', id: 'record' });
    const cancelBtn = el('button', { id: 'cancel', class: 'danger', disabled: true }, 'Cancel run');
    const cancelNote = el('span', { class: 'muted', id: 'cancel-note' });
    const logState = el('span', { id: 'log-state', class: 'log-state', 'data-closed': 'false' }, 'log open');
    const count = el('span', { id: 'event-count', class: 'muted' }, '0 events');
    const events = el('ol', { id: 'events', class: 'events' });
    main.replaceChildren(
      el('p', { class: 'crumbs' }, el('a', { href: '#/' }, '← Runs')),
      el('h1', {}, 'Run ', el('code', { id: 'run-id' }, id), ' ', el('span', { id: 'run-status' })),
      record,
      el('div', { class: 'actions' }, cancelBtn, cancelNote),
      driver,
      cmdsBox,
      el('h2', {}, 'Events ', logState, ' ', count),
      events);

    cancelBtn.addEventListener('click', async () => {
      cancelBtn.disabled = true;
      cancelNote.textContent = 'requesting cancel…';
      try {
        await api('POST', '/v1/runs/' + enc + '/cancel', {});
        cancelNote.textContent = 'cancel requested: the driver ends the run at its next append or heartbeat';
      } catch (e) {
        cancelNote.textContent = 'cancel failed: ' + e.message;
        cancelBtn.disabled = false;
      }
    });

    poll(g, 1000, async () => {
      const v = await api('GET', '/v1/runs/' + enc + '/view');
      if (g !== gen) return;
      const r = v.run;
      document.getElementById('run-status').replaceChildren(badge(r.status));
      const rows = [
        ['Thread', el('a', { href: '#/?thread=' + encodeURIComponent(r.threadId) }, r.threadId)],
        ['Status', el('span', { id: 'record-status' }, r.status)],
        ['Driver epoch', r.driverEpoch || 0],
        ['Detached', terminal(r.status) ? (r.detachedSince ? 'was detached since ' + stamp(r.detachedSince) : '—') : live('detached', r.detachedSince)],
        ['Cancel requested', r.cancelRequested ? 'yes' : 'no'],
        ['Driver lease', live('lease', r.leaseUntil, r)],
        ['Sandbox', sandboxText(r.sandbox)],
        ['Sandbox key', r.sandboxKey || '—'],
        ['Sandbox lifecycle', el('span', { id: 'sandbox-lifecycle' }, lifecycleText(r.sandbox))],
        ['Started', stamp(r.startedAt)],
        ['Finished', stamp(r.finishedAt)],
      ];
      if (r.error) rows.push(['Error', (r.error.code ? r.error.code + ': ' : '') + r.error.message]);
      if (r.usage !== undefined) rows.push(['Usage', JSON.stringify(r.usage)]);
      record.replaceChildren(...rows.flatMap(([k, val]) => [el('dt', {}, k), el('dd', {}, val)]));
      const done = terminal(r.status);
      const ds = driverState(r);
      driver.dataset.state = ds.state;
      driver.textContent = ds.text;
      if (cmdsDone !== done) {
        cmdsDone = done;
        cmdsBox.replaceChildren(...cmdsFor(done).map(([what, cmd]) => el('div', { class: 'cmd' },
          el('span', { class: 'muted' }, what),
          el('code', { class: 'copy-text' }, cmd),
          el('button', { type: 'button', class: 'copy', onclick: (e) => copy(cmd, e.target) }, 'Copy'))));
      }
      if (done || (r.cancelRequested && !cancelNote.textContent)) cancelNote.textContent = done ? '' : 'cancel requested';
      cancelBtn.disabled = done || !!r.cancelRequested;
    }).catch((e) => { if (g === gen) record.replaceChildren(errorBox(e)); });

    // The log: pushed over GET /v1/subscribe (api/asyncapi.yaml; docs/design.md §8.1) from
    // the last offset shown, long-polled when the socket cannot open (a server without push:
    // `sandkeep dev --no-push`). After a dropped socket or a lost poll it resumes at the last
    // offset shown, and an event at or below it is never drawn twice, so the list has no
    // duplicate and no gap.
    let last = 0;
    let n = 0;
    const draw = (ev) => {
      if (ev.offset <= last) return;
      last = ev.offset;
      n++;
      const isText = typeof ev.data === 'string';
      events.append(el('li', { class: 'event', 'data-offset': ev.offset },
        el('span', { class: 'offset' }, ev.offset),
        el('pre', { class: 'data' + (isText ? ' text' : '') }, isText ? ev.data : JSON.stringify(ev.data))));
      count.textContent = n + (n === 1 ? ' event' : ' events');
    };
    const closeLog = () => {
      logState.textContent = 'log closed';
      logState.dataset.closed = 'true';
    };
    const pushURL = () => (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/v1/subscribe' +
      (tenant ? '?' + new URLSearchParams({ tenant }) : '');
    // pushFollow follows the log over one socket until it ends: 'closed' (the log closed),
    // 'refused' (it never opened), 'dropped' (it opened, then was lost), 'gone' (another
    // view) or an APIError (the run is not the caller's).
    const pushFollow = () => new Promise((resolve) => {
      let ws;
      try {
        ws = new WebSocket(pushURL(), 'sandkeep.push.v1');
      } catch (e) {
        resolve('refused');
        return;
      }
      let opened = false;
      let parts = [];
      let ended = false;
      const watch = setInterval(() => { if (g !== gen) end('gone'); }, 250);
      const end = (how) => {
        if (ended) return;
        ended = true;
        clearInterval(watch);
        ws.onclose = ws.onmessage = ws.onerror = null;
        try { ws.close(); } catch (e) { /* already closing */ }
        resolve(how);
      };
      ws.onopen = () => {
        opened = true;
        ws.send(JSON.stringify({ type: 'subscribe', runId: id, after: last }));
      };
      ws.onerror = () => {}; // onclose follows and says which
      ws.onclose = () => end(opened ? 'dropped' : 'refused');
      ws.onmessage = (m) => {
        if (g !== gen) return end('gone');
        let msg;
        try {
          msg = JSON.parse(m.data);
        } catch (e) {
          return end('dropped');
        }
        if (msg.runId !== id) return;
        if (msg.type === 'subscribed') setConn(true, 'live (push)');
        else if (msg.type === 'events') msg.events.forEach(draw);
        else if (msg.type === 'event-part') {
          parts.push(msg);
          if (msg.final) {
            // The parts' texts joined are the event's data (its JSON).
            let data;
            try {
              data = JSON.parse(parts.map((p) => p.text).join(''));
            } catch (e) {
              return end('dropped'); // a broken event: resubscribe from the last shown
            }
            draw({ offset: parts[0].offset, data });
            parts = [];
          }
        } else if (msg.type === 'closed') {
          closeLog();
          end('closed');
        } else if (msg.type === 'error') {
          const p = msg.problem || {};
          end(p.status && p.status < 500 ? new APIError(p.status, p.code, p.detail) : 'dropped');
        }
      };
    });
    // pollFollow long-polls until the log closes ('closed'), the view changes ('gone') or,
    // past `until` (ms), after its next poll ('polled').
    const pollFollow = async (until) => {
      let backoff = 250;
      while (g === gen) {
        try {
          const page = await api('GET', '/v1/runs/' + enc + '/events?after=' + last + '&limit=500&waitMs=15000');
          if (g !== gen) return 'gone';
          setConn(true);
          backoff = 250;
          page.events.forEach(draw);
          count.textContent = n + (n === 1 ? ' event' : ' events');
          if (page.closed) {
            closeLog();
            return 'closed';
          }
          if (Date.now() > until) return 'polled';
        } catch (e) {
          if (g !== gen) return 'gone';
          if (e instanceof APIError && e.status < 500) return e;
          setConn(false);
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 5000);
          if (Date.now() > until) return 'polled';
        }
      }
      return 'gone';
    };
    (async () => {
      let backoff = 250;
      for (;;) {
        let how = await pushFollow();
        if (how === 'refused') {
          // No push here (or the socket cannot open): long polls for half a minute, then
          // push is tried again, so a server reached again with push is used once it can be.
          how = await pollFollow(Date.now() + 30000);
        } else if (how === 'dropped') {
          setConn(false);
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 5000);
          continue;
        }
        if (how instanceof APIError) {
          events.append(el('li', { class: 'error' }, how.message));
          return;
        }
        if (how === 'closed' || how === 'gone' || g !== gen) return;
        backoff = 250;
      }
    })();
  }

  // driverState says in words whether a live driver holds the run: state is ended, none
  // (nobody drives it: detached, lapsed or never leased) or live.
  function driverState(r) {
    if (terminal(r.status)) return { state: 'ended', text: 'The run has ended (' + r.status + '): no driver holds it and it cannot be taken over; its log stays readable.' };
    const now = nowMs();
    const after = ' The agent may still be running: take the run over with the attach command below, or the reaper ends it (finalized once the agent exits, expired once detached past the TTL).';
    if (r.detachedSince) {
      const why = r.lapsed ? 'its driver stopped heartbeating and its lease lapsed ' : 'its driver detached ';
      return { state: 'none', text: 'No live driver: ' + why + dur(now - r.detachedSince) + ' ago.' + after };
    }
    if (!r.leaseUntil) return { state: 'none', text: 'No live driver: no driver has held a lease on this run.' + after };
    if (r.leaseUntil < now) {
      return { state: 'none', text: 'No live driver: the lease of the driver at epoch ' + (r.driverEpoch || 0) + ' lapsed ' + dur(now - r.leaseUntil) + ' ago (no heartbeat since).' + after };
    }
    return { state: 'live', text: 'Driven at epoch ' + (r.driverEpoch || 0) + ' (by the shipper in its sandbox, or by a host where the sandbox cannot reach the API): its lease has ' + dur(r.leaseUntil - now) + ' left. Attaching takes the run over from that driver.' };
  }

  function shellQuote(s) {
    return /^[A-Za-z0-9._:\/=-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'";
  }

  async function copy(text, btn) {
    try {
      await navigator.clipboard.writeText(text);
      btn.textContent = 'Copied';
    } catch (e) {
      btn.textContent = 'Select and copy';
    }
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  }

  // sandboxFate says what a sweep did with the sandbox of a run it ended.
  function sandboxFate(e) {
    if (!e.sandbox) return '—';
    if (e.sandbox !== 'kept') return e.sandbox;
    if (e.kept === 'in-use') return 'kept: run ' + (e.keptFor || '?') + ' uses it';
    if (e.kept === 'touched-recently') return 'kept: used recently' + (e.retryAt ? ', retried from ' + stamp(e.retryAt) : '');
    return 'kept';
  }

  // ---- the reaper
  function reaperView(g) {
    const head = el('p', { class: 'muted', id: 'reaper-settings' }, 'Loading…');
    const list = el('div', { id: 'sweeps' });
    main.replaceChildren(el('h1', {}, 'Reaper'), head, list);
    poll(g, 2000, async () => {
      const res = await api('GET', '/v1/reaper/sweeps?limit=10');
      if (g !== gen) return;
      const lastAt = res.sweeps.length ? res.sweeps[0].startedAt : 0;
      head.textContent = 'A sweep every ' + dur(res.everyMs) + '; a detached run expires after ' + dur(res.detachedTtlMs) +
        '. The last ' + res.kept + ' sweeps are kept; each shows what it did with your tenant\'s runs only.' +
        (lastAt ? ' Last sweep ' + dur(nowMs() - lastAt) + ' ago.' : ' No sweep yet.');
      list.replaceChildren(...res.sweeps.map((s) => {
        const rep = s.report;
        const outcomes = Object.entries(rep.outcomes).filter(([, n]) => n > 0);
        const boxes = Object.entries(rep.sandboxes || {}).filter(([, n]) => n > 0);
        return el('section', { class: 'sweep', 'data-seq': s.seq },
          el('h2', {}, 'Sweep #' + s.seq + ' ', el('span', { class: 'muted' },
            stamp(s.startedAt) + ' · ' + rep.considered + (rep.considered === 1 ? ' run' : ' runs') + ' of yours')),
          el('p', { class: 'chips' }, outcomes.length ? outcomes.map(([k, n]) => el('span', { class: 'chip oc-' + k }, k + ' ' + n)) : el('span', { class: 'muted' }, 'no runs of yours acted on'),
            boxes.map(([k, n]) => el('span', { class: 'chip sb-' + k }, 'sandbox ' + k + ' ' + n))),
          rep.runs.length ? el('table', { class: 'runs' },
            el('thead', {}, el('tr', {}, ['Run', 'Outcome', 'Status after', 'Exit code', 'Events appended', 'Sandbox', 'Error'].map((h) => el('th', {}, h)))),
            el('tbody', {}, rep.runs.map((e) => el('tr', { 'data-run-id': e.runId },
              el('td', {}, runLink(e.runId)), el('td', {}, el('span', { class: 'chip oc-' + e.outcome }, e.outcome)),
              el('td', {}, e.status || '—'), el('td', { class: 'num' }, e.exitCode === undefined ? '—' : e.exitCode),
              el('td', { class: 'num' }, e.events || 0), el('td', { class: 'sandbox-fate' }, sandboxFate(e)), el('td', {}, e.error || ''))))) : null);
      }));
      if (!res.sweeps.length) list.replaceChildren(el('p', { class: 'muted' }, 'The reaper has not swept yet.'));
    }).catch((e) => { if (g === gen) list.replaceChildren(errorBox(e)); });
  }

  route();
})();
