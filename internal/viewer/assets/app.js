// sandkeep run viewer. Everything shown is set as text (never as markup): event data is
// an agent's output, and the page's Content-Security-Policy enforces Trusted Types, so an
// HTML sink would throw. The page reads only the HTTP API of the server that served it.
'use strict';
(() => {
  const tenant = new URLSearchParams(location.search).get('tenant') || '';
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

  // ---- routing
  function route() {
    gen++;
    const h = location.hash.replace(/^#/, '') || '/';
    const [path, query] = h.split('?');
    const q = new URLSearchParams(query || '');
    document.getElementById('nav-runs').classList.toggle('on', path === '/');
    document.getElementById('nav-reaper').classList.toggle('on', path === '/reaper');
    if (path.startsWith('/runs/')) return runView(gen, decodeURIComponent(path.slice(6)));
    if (path === '/reaper') return reaperView(gen);
    return runsView(gen, q);
  }
  window.addEventListener('hashchange', route);
  document.getElementById('tenant').textContent = tenant || 'local (the dev default)';

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
  function runsView(g, q) {
    const thread = q.get('thread') || '';
    const status = q.get('status') || '';
    const cursor = q.get('cursor') || '';
    const threadIn = el('input', { id: 'filter-thread', placeholder: 'any thread', value: thread, spellcheck: 'false' });
    const statusIn = el('select', { id: 'filter-status' },
      ['', 'running', 'interrupted', 'completed', 'failed', 'aborted'].map((s) =>
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
    const cmds = [
      ['attach (take the run over and keep streaming)', 'sandkeep attach --api ' + origin + tflag + ' ' + shellQuote(id)],
      ['tail (read only)', 'sandkeep tail --api ' + origin + tflag + ' --follow ' + shellQuote(id)],
    ];
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
      el('div', { class: 'cmds' }, cmds.map(([what, cmd]) => el('div', { class: 'cmd' },
        el('span', { class: 'muted' }, what),
        el('code', { class: 'copy-text' }, cmd),
        el('button', { type: 'button', class: 'copy', onclick: (e) => copy(cmd, e.target) }, 'Copy')))),
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
        ['Started', stamp(r.startedAt)],
        ['Finished', stamp(r.finishedAt)],
      ];
      if (r.error) rows.push(['Error', (r.error.code ? r.error.code + ': ' : '') + r.error.message]);
      if (r.usage !== undefined) rows.push(['Usage', JSON.stringify(r.usage)]);
      record.replaceChildren(...rows.flatMap(([k, val]) => [el('dt', {}, k), el('dd', {}, val)]));
      const done = terminal(r.status);
      if (done || (r.cancelRequested && !cancelNote.textContent)) cancelNote.textContent = done ? '' : 'cancel requested';
      cancelBtn.disabled = done || !!r.cancelRequested;
    }).catch((e) => { if (g === gen) record.replaceChildren(errorBox(e)); });

    // The log: long-poll from the last offset seen. After a lost connection it resumes at
    // the same `after`, and an event at or below the last shown offset is never drawn
    // twice, so the list has no duplicate and no gap.
    (async () => {
      let after = 0;
      let last = 0;
      let n = 0;
      let backoff = 250;
      while (g === gen) {
        try {
          const page = await api('GET', '/v1/runs/' + enc + '/events?after=' + after + '&limit=500&waitMs=15000');
          if (g !== gen) return;
          setConn(true);
          backoff = 250;
          for (const ev of page.events) {
            if (ev.offset <= last) continue;
            last = ev.offset;
            n++;
            const isText = typeof ev.data === 'string';
            events.append(el('li', { class: 'event', 'data-offset': ev.offset },
              el('span', { class: 'offset' }, ev.offset),
              el('pre', { class: 'data' + (isText ? ' text' : '') }, isText ? ev.data : JSON.stringify(ev.data))));
          }
          count.textContent = n + (n === 1 ? ' event' : ' events');
          after = Math.max(after, page.next);
          if (page.closed) {
            logState.textContent = 'log closed';
            logState.dataset.closed = 'true';
            return;
          }
        } catch (e) {
          if (g !== gen) return;
          if (e instanceof APIError && e.status < 500) {
            events.append(el('li', { class: 'error' }, e.message));
            return;
          }
          setConn(false);
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 5000);
        }
      }
    })();
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

  // ---- the reaper
  function reaperView(g) {
    const head = el('p', { class: 'muted', id: 'reaper-settings' }, 'Loading…');
    const list = el('div', { id: 'sweeps' });
    main.replaceChildren(el('h1', {}, 'Reaper'), head, list);
    poll(g, 2000, async () => {
      const res = await api('GET', '/v1/reaper/sweeps?limit=10');
      if (g !== gen) return;
      const lastAt = res.sweeps.length ? res.sweeps[0].finishedAt : 0;
      head.textContent = 'A sweep every ' + dur(res.everyMs) + '; a detached run expires after ' + dur(res.detachedTtlMs) +
        '. The last ' + res.kept + ' sweeps are kept; only your tenant\'s runs are shown.' +
        (lastAt ? ' Last sweep ' + dur(nowMs() - lastAt) + ' ago.' : ' No sweep yet.');
      list.replaceChildren(...res.sweeps.map((s) => {
        const rep = s.report;
        const outcomes = Object.entries(rep.outcomes).filter(([, n]) => n > 0);
        const swept = Object.entries(rep.swept).filter(([, n]) => n > 0);
        return el('section', { class: 'sweep', 'data-seq': s.seq },
          el('h2', {}, 'Sweep #' + s.seq + ' ', el('span', { class: 'muted' },
            stamp(s.startedAt) + ' · ' + (s.finishedAt - s.startedAt) + ' ms · ' + rep.considered + ' considered, ' + rep.probed + ' probed')),
          s.error ? el('p', { class: 'error' }, s.error) : null,
          el('p', { class: 'chips' }, outcomes.length ? outcomes.map(([k, n]) => el('span', { class: 'chip oc-' + k }, k + ' ' + n)) : el('span', { class: 'muted' }, 'no runs of yours acted on')),
          rep.runs.length ? el('table', { class: 'runs' },
            el('thead', {}, el('tr', {}, ['Run', 'Outcome', 'Status after', 'Exit code', 'Events appended', 'Error'].map((h) => el('th', {}, h)))),
            el('tbody', {}, rep.runs.map((e) => el('tr', { 'data-run-id': e.runId },
              el('td', {}, runLink(e.runId)), el('td', {}, el('span', { class: 'chip oc-' + e.outcome }, e.outcome)),
              el('td', {}, e.status || '—'), el('td', { class: 'num' }, e.exitCode === undefined ? '—' : e.exitCode),
              el('td', { class: 'num' }, e.events || 0), el('td', {}, e.error || ''))))) : null,
          el('p', { class: 'muted' }, 'Housekeeping: ' + (swept.length ? swept.map(([k, n]) => k + ' ' + n).join(', ') : 'nothing to do')));
      }));
      if (!res.sweeps.length) list.replaceChildren(el('p', { class: 'muted' }, 'The reaper has not swept yet.'));
    }).catch((e) => { if (g === gen) list.replaceChildren(errorBox(e)); });
  }

  route();
})();
