// The routes console: signs in with the admin token (kept in this tab's session storage, sent
// as `Authorization: Bearer`, never in a URL), lists the routes a page at a time by the API's
// cursor, filtered by path, upstream host, owner and name on the service, with each route's health from
// `GET /v1/routes/{uuid}/stats?minutes=5`; opens a route (`#route/<uuid>`: its configuration,
// secrets masked, and its health), calls its upstream now (Try it), edits its rules with a
// preview on a sample and saves them through `PUT` (problems marked where they are in the rules),
// purges its cache, and deletes it after a confirmation that names its path; registers a route
// from a form (`#register`) that shows the body it sends and marks each problem of the answer at
// its field. No framework, nothing loaded from elsewhere.
import { Editor, compact, listProblems, places, pointerSegment, pretty } from '/editor.js';

const TOKEN_KEY = 'recast.adminToken';
const PAGE_SIZE = 50;
/** Stats asked at once while a page fills in. */
const STATS_AT_ONCE = 6;

const $ = (id) => document.getElementById(id);

const page = {
  /** The cursor of each page shown so far; the first is `null`. */
  cursors: [null],
  next: null,
  filter: { path: '', host: '', owner: '', name: '' },
  /** Bumped by every load, so answers to an older one are dropped. */
  generation: 0,
};

/** Whether the service let this page in (with its token, or with none when the admin
 * endpoints are open). */
let admitted = false;

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** One call of the admin API: `{status, body, text, etag}` (the body parsed when it is JSON). */
async function api(method, path, { headers: more = {}, body: sent } = {}) {
  const headers = { accept: 'application/json', ...more };
  const held = token();
  if (held) headers.authorization = `Bearer ${held}`;
  if (sent !== undefined) headers['content-type'] = 'application/json';
  const answer = await fetch(path, { method, headers, body: sent, cache: 'no-store' });
  const text = await answer.text();
  let body = text;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    // Kept as text.
  }
  return { status: answer.status, body, text, etag: answer.headers.get('etag') };
}

/** The text of the member at `pointer` of a valid JSON text, as written there. */
function rawAt(text, pointer) {
  const place = places(text).get(pointer);
  return place ? text.slice(place.start, place.end) : 'null';
}

/** Whether an answer came to act on: when the service could not be reached, says so at
 * `statusId`; when it refused the token, goes back to signing in. */
function arrived(answer, statusId) {
  if (!answer) {
    say(statusId, 'The service cannot be reached.', true);
    return false;
  }
  if (answer.status === 401) {
    start();
    return false;
  }
  return true;
}

/** What a problem answer says, in one line. */
function problemText(answer) {
  const body = answer.body;
  if (body && typeof body === 'object' && body.title) {
    return body.detail ? `${body.title}: ${body.detail}` : body.title;
  }
  return `the service answered ${answer.status}`;
}

function say(id, text, isError = false) {
  const element = $(id);
  element.textContent = text;
  element.classList.toggle('error', isError);
}

function show(view) {
  $('signin').hidden = view !== 'signin';
  $('routes').hidden = view !== 'routes';
  $('route').hidden = view !== 'route';
  $('register').hidden = view !== 'register';
  $('consumers').hidden = view !== 'consumers';
  // A key shown once is not left on the page when the view changes.
  if (view !== 'consumers') forgetIssued();
}

/** The route a `#route/<uuid>` address names, if it does. */
function routeInHash() {
  const match = /^#route\/([0-9a-fA-F-]{36})$/.exec(location.hash);
  return match ? match[1] : null;
}

/** Asks for the first page: it says whether the token (or no token) is let in. */
async function start() {
  const probe = await api('GET', '/v1/routes?limit=1').catch(() => null);
  if (!probe) {
    admitted = false;
    show('signin');
    say('signin-status', 'The service cannot be reached.', true);
    return;
  }
  admitted = probe.status !== 401;
  if (probe.status === 401) {
    const hadToken = Boolean(token());
    sessionStorage.removeItem(TOKEN_KEY);
    show('signin');
    say('signin-status', hadToken ? 'That token was refused: it is not this service\'s admin token.' : '', hadToken);
    $('token').focus();
    return;
  }
  // Let in without a token: the admin endpoints are open.
  $('open-notice').hidden = Boolean(token());
  $('signout').hidden = !token();
  await navigate();
}

/** Shows what the address names: a route, or the list. */
async function navigate() {
  const uuid = routeInHash();
  if (location.hash === '#register') {
    show('register');
    showBody();
    $('register-title').focus();
  } else if (location.hash === '#consumers') {
    show('consumers');
    await loadConsumers();
    $('consumers-title').focus();
  } else if (uuid) {
    show('route');
    await openRoute(uuid);
  } else {
    show('routes');
    await load(page.cursors[page.cursors.length - 1]);
  }
}

async function signIn(event) {
  event.preventDefault();
  const given = $('token').value.trim();
  if (!given) return;
  sessionStorage.setItem(TOKEN_KEY, given);
  $('token').value = '';
  say('signin-status', 'Checking the token…');
  await start();
  if (!$('routes').hidden) $('main').focus();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  $('route-rows').replaceChildren();
  say('signin-status', 'Signed out.');
  start();
}

function listingPath(cursor) {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (page.filter.path) query.set('path', page.filter.path);
  if (page.filter.host) query.set('host', page.filter.host);
  if (page.filter.owner) query.set('owner', page.filter.owner);
  if (page.filter.name) query.set('name', page.filter.name);
  if (cursor) query.set('cursor', cursor);
  return `/v1/routes?${query}`;
}

/** Loads the page after `cursor` (the first for `null`) and fills in its rows. */
async function load(cursor) {
  const generation = ++page.generation;
  say('routes-status', 'Loading routes…');
  const answer = await api('GET', listingPath(cursor)).catch(() => null);
  if (generation !== page.generation || !arrived(answer, 'routes-status')) return;
  if (answer.status !== 200) {
    say('routes-status', problemText(answer), true);
    return;
  }
  const routes = answer.body.routes;
  page.next = answer.body.nextCursor;
  $('next-page').disabled = !page.next;
  $('first-page').disabled = page.cursors.length <= 1;
  const rows = routes.map(row);
  $('route-rows').replaceChildren(...rows.map((r) => r.element));
  const pageNumber = page.cursors.length;
  const filtered = Object.values(page.filter).some(Boolean) ? ' matching the filter' : '';
  say(
    'routes-status',
    routes.length === 0
      ? `No routes${filtered} on this page.`
      : `Page ${pageNumber}: ${routes.length} route${routes.length === 1 ? '' : 's'}${filtered}${page.next ? '; more on the next page' : ''}.`,
  );
  await fillHealth(rows, generation);
}

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

/** What a route calls: its upstream's origin, or its sources' names and origins. */
function upstreamOf(route) {
  const origin = (base) => {
    try {
      const url = new URL(base);
      return url.origin;
    } catch {
      return base;
    }
  };
  // A paged upstream says how it pages, and how far.
  const paging = (paginate) => {
    if (!paginate) return '';
    const how = paginate.next === 'link' ? 'Link' : Object.keys(paginate.next)[0] === 'url' ? 'next URL' : 'query';
    return ` (pages by ${how}, at most ${paginate.maxPages})`;
  };
  if (route.sources) {
    return Object.entries(route.sources)
      .map(([name, source]) => `${name}: ${origin(source.originalApi.baseUrl)}${paging(source.paginate)}`)
      .join(', ');
  }
  const own = route.originalRoute;
  return own ? `${origin(own.originalApi.baseUrl)}${paging(own.paginate)}` : '';
}

/** The kind of credentials a route sends, never their value. */
function authOf(route) {
  if (route.authHeader && route.authHeader.type) return route.authHeader.type;
  if (route.auth === 'runtime') return 'the caller\'s (X-Mapped-Auth)';
  return 'none';
}

/** Who may call a route, in words: its consumers, its token issuers' hosts, its limit; or
 * `open` for a route anyone who knows its address may call. */
function callersOf(route) {
  const callers = route.callers;
  if (!callers || callers === 'open') return 'open';
  const parts = [];
  if (callers.consumers?.length) parts.push(`consumers ${callers.consumers.join(', ')}`);
  if (callers.jwt?.length) {
    const host = (issuer) => {
      try {
        return new URL(issuer).host;
      } catch {
        return issuer;
      }
    };
    parts.push(`tokens of ${callers.jwt.map((j) => host(j.issuer)).join(', ')}`);
  }
  if (callers.certificates?.length) parts.push(`client certificates ${callers.certificates.join(', ')}`);
  if (callers.limit) parts.push(`${callers.limit.requests} per ${callers.limit.perSeconds} s each`);
  return parts.join('; ');
}

function cacheOf(route) {
  if (!route.cache) return 'off';
  const stale = route.cache.staleWhileRevalidateSeconds;
  return `${route.cache.ttlSeconds} s${stale ? ` (+${stale} s stale)` : ''}`;
}

/** The callers cell of a route's row: an open route is marked, more so when its calls spend a
 * stored credential. */
function callersCell(route) {
  const text = callersOf(route);
  if (text !== 'open') return cell(text, 'callers');
  const spends = Boolean(route.authHeader && route.authHeader.type && route.authHeader.type !== 'None');
  const td = cell(spends ? 'open: anyone with its address spends its credentials' : 'open', 'callers open');
  if (spends) td.classList.add('warn');
  return td;
}

/** A table row for `route`, and the cell its health goes in. */
function row(route) {
  const tr = document.createElement('tr');
  tr.dataset.uuid = route.uuid;
  // A locked route (sealed by a key the ring lacks) shows no configuration: no path, no method.
  const path = (route.path || '').replace(/^\/v1\/[^/]+\//, '');
  const pathCell = cell('', 'path');
  const link = document.createElement('a');
  link.href = `#route/${route.uuid}`;
  link.textContent = path || '(unknown)';
  pathCell.append(link);
  tr.append(
    cell(route.method || ''),
    pathCell,
    cell(route.name ? (route.owner ? `${route.name} (${route.owner})` : route.name) : '', 'name'),
    cell(upstreamOf(route), 'upstream'),
    cell(authOf(route)),
    callersCell(route),
    cell(cacheOf(route)),
  );
  const label = { ok: 'serving', locked: 'locked' }[route.status] || 'unavailable';
  const status = cell(label, route.status === 'ok' ? 'ok' : 'broken');
  if (route.problem) status.title = route.problem;
  const health = cell('…', 'health');
  tr.append(status, health);
  return { element: tr, uuid: route.uuid, health };
}

/** Asks each row's stats, a few at a time, and writes them into its health cell. */
async function fillHealth(rows, generation) {
  let next = 0;
  const worker = async () => {
    while (next < rows.length && generation === page.generation) {
      const target = rows[next++];
      const answer = await api('GET', `/v1/routes/${target.uuid}/stats?minutes=5`).catch(() => null);
      if (generation !== page.generation) return;
      target.health.replaceChildren(...healthText(answer));
    }
  };
  await Promise.all(Array.from({ length: STATS_AT_ONCE }, worker));
}

/** The nodes that show one route's stats. */
function healthText(answer) {
  if (!answer || answer.status !== 200) return [document.createTextNode('not available')];
  const stats = answer.body;
  const parts = [document.createTextNode(`${stats.calls} call${stats.calls === 1 ? '' : 's'}`)];
  const errors = Object.entries(stats.errors);
  if (errors.length) {
    const span = document.createElement('span');
    span.className = 'errors';
    span.textContent = `; errors: ${errors.map(([kind, n]) => `${kind} ${n}`).join(', ')}`;
    parts.push(span);
  }
  const { p50, p99 } = stats.latencyMs;
  if (p50 !== null) parts.push(document.createTextNode(`; p50 ${p50} ms, p99 ${p99} ms`));
  return parts;
}

/** The route shown, as the API gave it, the text it came as, and its version (`ETag`). */
let shown = null;
let shownText = '';
let shownTag = null;
/** The upstream's document the last Try it brought, as text. */
let triedDocument = null;

/** Opens route `uuid`: its configuration and its health. */
async function openRoute(uuid) {
  shown = null;
  triedDocument = null;
  // What was asked for the route shown before is not shown on this one, and a caller's
  // credentials typed for that route are not sent to this one.
  clearTimeout(previewTimer);
  asked++;
  saves++;
  $('mapped-auth').value = '';
  $('use-tried').disabled = true;
  $('editing').hidden = true;
  $('tried').hidden = true;
  $('route-title').textContent = 'Loading the route…';
  $('route-config').textContent = '';
  $('health-rows').replaceChildren();
  say('route-status', '');
  const answer = await api('GET', `/v1/routes/${uuid}`).catch(() => null);
  if (!arrived(answer, 'route-status')) return;
  if (answer.status !== 200) {
    $('route-title').textContent = 'No such route';
    say('route-status', problemText(answer), true);
    return;
  }
  shown = answer.body;
  shownText = answer.text;
  shownTag = answer.etag;
  const path = (shown.path || '').replace(/^\/v1\/[^/]+\//, '');
  $('route-title').textContent = `${shown.method || ''} ${path || '(unknown path)'}`.trim();
  if (shown.status !== 'ok') say('route-status', `This route cannot serve calls: ${shown.problem}`, true);
  $('route-config').textContent = JSON.stringify(shown, null, 2);
  const callers = callersOf(shown);
  $('route-callers').textContent = callers === 'open'
    ? 'Who may call: anyone who knows its address (no callers named).'
    : `Who may call: ${callers}.`;
  $('route-callers').className = callers === 'open' ? 'open' : '';
  startEditing();
  const [total, recent] = await Promise.all([
    api('GET', `/v1/routes/${uuid}/stats`).catch(() => null),
    api('GET', `/v1/routes/${uuid}/stats?minutes=5`).catch(() => null),
  ]);
  $('health-rows').replaceChildren(healthRow('since it was loaded', total), healthRow('the last 5 minutes', recent));
  $('route-title').focus?.();
}

/** A row of the route's health table. */
function healthRow(over, answer) {
  const tr = document.createElement('tr');
  const th = document.createElement('th');
  th.scope = 'row';
  th.textContent = over;
  tr.append(th);
  if (!answer || answer.status !== 200) {
    tr.append(cell('not available'), cell(''), cell(''), cell(''));
    return tr;
  }
  const stats = answer.body;
  const errors = Object.entries(stats.errors).map(([kind, n]) => `${kind} ${n}`).join(', ') || 'none';
  const ms = (value) => (value === null ? '–' : `${value} ms`);
  tr.append(cell(String(stats.calls)), cell(errors), cell(ms(stats.latencyMs.p50)), cell(ms(stats.latencyMs.p99)));
  return tr;
}

/** Calls the route's upstream now: its document beside the mapped answer, and the trace. */
async function tryRoute() {
  if (!shown) return;
  $('tried').hidden = true;
  // Called as the sample request in the editor says (the stored one until it is edited).
  if (request.area.value.trim() && request.check()) {
    say('route-status', 'The sample request is not valid JSON; nothing was sent.', true);
    return;
  }
  say('route-status', 'Calling the upstream…');
  const body = `{"sampleRequest":${sampleRequestText()}}`;
  const answer = await api('POST', `/v1/routes/${shown.uuid}/try`, { headers: callerAuth(), body }).catch(() => null);
  if (!arrived(answer, 'route-status')) return;
  if (answer.status !== 200) {
    say('route-status', problemText(answer), true);
    return;
  }
  const tried = answer.body;
  // Shown as the service wrote them: member order and numbers as they came.
  triedDocument = tried.upstream === null ? null : pretty(rawAt(answer.text, '/upstream'));
  $('tried-upstream').textContent = triedDocument ?? '(no document: the rules did not run)';
  $('tried-output').textContent = pretty(rawAt(answer.text, '/output'));
  $('tried-rows').replaceChildren(...traceRows(tried.trace, answer.text));
  // The pages each paged source fetched in this try.
  const pages = Object.entries(tried.pages || {});
  $('tried-pages').textContent = `Pages fetched: ${pages.map(([name, n]) => `${name} ${n}`).join(', ')}`;
  $('tried-pages').hidden = pages.length === 0;
  $('use-tried').disabled = triedDocument === null;
  if (triedDocument !== null && !sample.area.value.trim()) useTried();
  $('tried-warnings').replaceChildren(
    ...tried.warnings.map((warning) => {
      const item = document.createElement('li');
      const where = document.createElement('code');
      where.textContent = warning.location || '(the rules)';
      item.append(where, document.createTextNode(`: ${warning.message}`));
      return item;
    }),
  );
  $('tried').hidden = false;
  say('route-status', 'The upstream answered; its document and the mapped answer are below.');
}

/** The rows of a trace (`POST /v1/preview?trace=true`), values as `text` wrote them. */
function traceRows(trace, text) {
  const at = places(text);
  return trace.map((entry, n) => {
    const tr = document.createElement('tr');
    const id = entry.element === undefined ? entry.id : `${entry.id} [${entry.element}]`;
    const place = at.get(`/trace/${n}/value`);
    const value = entry.included && place ? text.slice(place.start, place.end) : '(left out)';
    tr.append(cell(id), cell(entry.key), cell(value, entry.resolved ? '' : 'errors'), cell(entry.note));
    return tr;
  });
}

// The rules editor: the route's rules, previewed on a sample as they change, and saved through
// `PUT /v1/routes/{uuid}`.

const rules = new Editor('edit-rules');
const sample = new Editor('edit-sample');
const request = new Editor('edit-request');
/** Milliseconds of quiet typing before the preview is asked for. */
const DEBOUNCE_MS = 250;
/** The longest list of the rules kept on one line (`"keys": ["idMeal"]`). */
const RULES_WIDTH = 60;
/** Members of a route as shown that the service writes, not the client: not sent back. `path`
 * is shown as the public path, and cannot change. */
const WRITTEN = new Set(['uuid', 'path', 'auth', 'createdAt', 'updatedAt', 'status', 'problem', 'revision']);
let previewTimer;
/** Numbers the previews asked for, and the saves, so an answer to an older one (or one for
 * another route) is dropped. */
let asked = 0;
let saves = 0;

/** The caller's `X-Mapped-Auth` a runtime-auth route's live calls need, when given. */
function callerAuth() {
  const given = $('mapped-auth').value.trim();
  return shown && shown.auth === 'runtime' && given ? { 'x-mapped-auth': given } : {};
}

/** Puts the route's stored rules in the editor; a route whose configuration is unknown (sealed
 * by a key the ring lacks) has none to edit. */
function startEditing() {
  const stored = rawAt(shownText, '/rulesAsString');
  $('editing').hidden = stored === 'null';
  if (stored === 'null') return;
  $('mapped-auth-field').hidden = shown.auth !== 'runtime';
  rules.area.value = pretty(stored, RULES_WIDTH);
  rules.area.defaultValue = rules.area.value;
  rules.mark(new Map());
  sample.area.value = '';
  sample.mark(new Map());
  const storedRequest = rawAt(shownText, '/sampleRequest');
  request.area.value = storedRequest === 'null' ? '' : pretty(storedRequest, RULES_WIDTH);
  request.mark(new Map());
  clearEdit('Paste a sample upstream answer, or use Try it, to preview the rules.');
}

function clearEdit(status = '', isError = false) {
  say('edit-status', status, isError);
  $('edit-problems').replaceChildren();
  $('edit-output-title').textContent = 'Output';
  $('edit-output').textContent = '';
  $('edit-trace-rows').replaceChildren();
  $('edit-trace-wrap').hidden = true;
}

function useTried() {
  if (triedDocument === null) return;
  sample.area.value = triedDocument;
  sample.paint();
  previewEdit();
}

function schedulePreview() {
  clearTimeout(previewTimer);
  previewTimer = setTimeout(previewEdit, DEBOUNCE_MS);
}

/** Maps the sample by the rules in the editor (`POST /v1/preview?trace=true`). */
async function previewEdit() {
  const ticket = ++asked;
  const rulesError = rules.check();
  if (!sample.area.value.trim()) {
    if (!rulesError) clearEdit('Paste a sample upstream answer, or use Try it, to preview the rules.');
    return;
  }
  if (sample.check() || rulesError) {
    clearEdit('Waiting for valid JSON; nothing was sent.', true);
    return;
  }
  say('edit-status', 'Mapping the sample…');
  const body = `{"originalResponse":${sample.area.value},"mappingRules":${rules.area.value}}`;
  const answer = await api('POST', '/v1/preview?trace=true', { body }).catch(() => null);
  if (ticket !== asked) return;
  if (!answer) {
    clearEdit('The service cannot be reached.', true);
    return;
  }
  clearEdit();
  const marks = new Map();
  const spots = [];
  if (answer.status === 200) {
    $('edit-output-title').textContent = 'Output on the sample';
    $('edit-output').textContent = pretty(rawAt(answer.text, '/output'));
    $('edit-trace-rows').replaceChildren(...traceRows(answer.body.trace, answer.text));
    $('edit-trace-wrap').hidden = false;
    listProblems(rules, $('edit-problems'), answer.body.warnings, 'warning', marks, spots);
    const warned = answer.body.warnings.length;
    say('edit-status', `Previewed on the sample${warned ? `, with ${warned} warning${warned === 1 ? '' : 's'}` : ''}; not saved yet.`);
  } else {
    const errors = Array.isArray(answer.body?.errors) ? answer.body.errors : [];
    listProblems(rules, $('edit-problems'), errors, 'error', marks, spots);
    say('edit-status', `The preview failed: ${problemText(answer)}`, true);
  }
  rules.mark(marks, spots);
}

/** The sample request in the editor, compact (`{}`, no query and no body, when it is empty). */
function sampleRequestText() {
  return request.area.value.trim() ? compact(request.area.value) : '{}';
}

/** The route as stored, with the rules and the sample request of the editor: the body of its `PUT`. Each member is
 * sent back as the service wrote it (member order, numbers and masked secrets as they came). */
function updateBody() {
  const at = places(shownText);
  const members = Object.keys(shown)
    .filter((name) => !WRITTEN.has(name) && name !== 'rulesAsString' && name !== 'sampleRequest')
    .map((name) => {
      const place = at.get(`/${pointerSegment(name)}`);
      return `${JSON.stringify(name)}:${shownText.slice(place.start, place.end)}`;
    });
  members.push(`"sampleRequest":${sampleRequestText()}`);
  members.push(`"rulesAsString":${compact(rules.area.value)}`);
  return `{${members.join(',')}}`;
}

/** Saves the rules: `PUT` with the live call; its problems are marked where they are in the
 * rules, and the others listed. */
async function saveRules() {
  if (!shown || $('save').disabled) return;
  clearTimeout(previewTimer);
  const ticket = ++saves;
  if (rules.check()) {
    say('edit-status', 'The rules are not valid JSON; nothing was sent.', true);
    rules.area.focus();
    return;
  }
  if (request.area.value.trim() && request.check()) {
    say('edit-status', 'The sample request is not valid JSON; nothing was sent.', true);
    request.area.focus();
    return;
  }
  if (shown.auth === 'runtime' && !callerAuth()['x-mapped-auth']) {
    say('edit-status', 'This route sends its caller\'s credentials: give an X-Mapped-Auth for the live call.', true);
    $('mapped-auth').focus();
    return;
  }
  say('edit-status', 'Saving: recast makes a live call through the route with these rules…');
  const uuid = shown.uuid;
  $('save').disabled = true;
  // Only the version shown is replaced: a change made meanwhile is not undone by this one.
  const headers = { ...callerAuth(), ...(shownTag ? { 'if-match': shownTag } : {}) };
  const answer = await api('PUT', `/v1/routes/${uuid}`, { headers, body: updateBody() }).catch(() => null);
  $('save').disabled = false;
  if (ticket !== saves || !arrived(answer, 'edit-status')) return;
  clearEdit();
  const marks = new Map();
  const spots = [];
  if (answer.status === 200) {
    $('edit-output-title').textContent = 'Output of the live call';
    $('edit-output').textContent = pretty(rawAt(answer.text, '/preview'));
    listProblems(rules, $('edit-problems'), answer.body.warnings, 'warning', marks, spots, '/rulesAsString');
    rules.mark(marks, spots);
    rules.area.defaultValue = rules.area.value;
    say('edit-status', 'Saved. The live call mapped to the output below; calls use these rules now.');
    await followStored(uuid);
    return;
  }
  if (answer.status === 412) {
    await followStored(uuid);
    say(
      'edit-status',
      'Not saved: the route was changed meanwhile (by another admin, or in another tab). Its configuration below is the one now; your rules stay in the editor: save again to put them on it.',
      true,
    );
    return;
  }
  const errors = Array.isArray(answer.body?.errors) ? answer.body.errors : [];
  // A live call that failed is the upstream's, or the mapping's: said in the status.
  listProblems(rules, $('edit-problems'), errors, 'error', marks, spots, '/rulesAsString');
  rules.mark(marks, spots);
  say('edit-status', `Not saved: ${problemText(answer)}. The route keeps its stored rules.`, true);
  $('edit-problems').querySelector('button.line')?.focus();
}

/** Shows the route as stored now (its configuration and version), the editor's text kept. */
async function followStored(uuid) {
  const fresh = await api('GET', `/v1/routes/${uuid}`).catch(() => null);
  if (fresh && fresh.status === 200 && shown && shown.uuid === uuid) {
    shown = fresh.body;
    shownText = fresh.text;
    shownTag = fresh.etag;
    $('route-config').textContent = JSON.stringify(shown, null, 2);
  }
}

function resetRules() {
  rules.area.value = rules.area.defaultValue;
  rules.mark(new Map());
  previewEdit();
}

async function purge() {
  if (!shown) return;
  const answer = await api('DELETE', `/v1/routes/${shown.uuid}/cache`).catch(() => null);
  if (answer && answer.status === 204) say('route-status', 'Cached answers purged on this node.');
  else say('route-status', answer ? problemText(answer) : 'The service cannot be reached.', true);
}

function askDelete() {
  if (!shown) return;
  $('confirm-text').textContent =
    `The route at ${shown.path} will be deleted for good: every call to it answers 404 from then on, on every node.`;
  $('confirm-delete').showModal();
}

async function confirmDelete() {
  if ($('confirm-delete').returnValue !== 'delete' || !shown) {
    $('delete').focus();
    return;
  }
  const path = shown.path;
  const answer = await api('DELETE', `/v1/routes/${shown.uuid}`).catch(() => null);
  if (answer && answer.status === 204) {
    shown = null;
    history.pushState(null, '', '#');
    show('routes');
    await load(page.cursors[page.cursors.length - 1]);
    say('routes-status', `Deleted the route at ${path}.`);
    $('main').focus();
  } else {
    say('route-status', answer ? problemText(answer) : 'The service cannot be reached.', true);
  }
}

const EXAMPLE_RULES = `{
  "newBodyFields": {
    "id": { "key": "id", "type": "Int" },
    "name": { "key": "name", "type": "String" }
  },
  "oldBodyFields": {
    "id": { "keys": ["idMeal"], "parents": ["meals"] },
    "name": { "keys": ["strMeal"], "parents": ["meals"] }
  }
}`;

/** `name=value` (or `Name: value`) lines as an object; blank lines skipped. */
function pairs(text, separator) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const at = line.indexOf(separator);
    if (at < 0) out[line.trim()] = '';
    else out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return out;
}

/** The registration the form describes; `masked` puts `***` for every secret. */
function registration(masked) {
  const secret = (value) => (masked && value ? '***' : value);
  const upstream = {
    originalApi: { baseUrl: $('reg-base').value.trim() },
    path: $('reg-upstream-path').value.trim(),
    method: $('reg-upstream-method').value,
  };
  const queries = pairs($('reg-queries').value, '=');
  if (Object.keys(queries).length) upstream.queries = queries;
  const headers = pairs($('reg-headers').value, ':');
  if (Object.keys(headers).length) upstream.headers = headers;
  const body = { path: $('reg-path').value.trim(), method: $('reg-method').value, originalRoute: upstream };
  const auth = $('reg-auth').value;
  if (auth === 'Bearer' || auth === 'Basic') body.authHeader = { type: auth, token: secret($('reg-token').value) };
  else if (auth === 'Runtime') body.authHeader = { type: 'Runtime' };
  else if (auth === 'OAuth2ClientCredentials') {
    body.authHeader = {
      type: auth,
      tokenUrl: $('reg-token-url').value.trim(),
      clientId: $('reg-client-id').value.trim(),
      clientSecret: secret($('reg-client-secret').value),
    };
    if ($('reg-scope').value.trim()) body.authHeader.scope = $('reg-scope').value.trim();
  }
  const number = (id) => ($(id).value.trim() === '' ? null : Number($(id).value));
  if (number('reg-cache') !== null) body.cache = { ttlSeconds: number('reg-cache') };
  if (number('reg-retry') !== null) {
    const on = $('reg-retry-on').value.split(',').map((item) => item.trim()).filter(Boolean);
    body.retry = { attempts: number('reg-retry'), on: on.map((item) => (/^\d+$/.test(item) ? Number(item) : item)) };
    if (upstream.method === 'POST' || upstream.method === 'PATCH') body.retry.unsafe = true;
  }
  if (number('reg-rate') !== null) body.rateLimit = { requestsPerSecond: number('reg-rate') };
  // The rules as written when they are JSON (so the service locates their problems), else as text.
  const rules = $('reg-rules').value;
  try {
    body.rulesAsString = JSON.parse(rules);
  } catch {
    body.rulesAsString = rules;
  }
  return body;
}

function showBody() {
  $('reg-json').textContent = JSON.stringify(registration(true), null, 2);
  const auth = $('reg-auth').value;
  document.querySelectorAll('.auth-token').forEach((e) => (e.hidden = auth !== 'Bearer' && auth !== 'Basic'));
  document.querySelectorAll('.auth-oauth').forEach((e) => (e.hidden = auth !== 'OAuth2ClientCredentials'));
}

/** Clears the marks of the last answer's problems. */
function unmark() {
  document.querySelectorAll('#register-form [aria-invalid]').forEach((field) => {
    field.removeAttribute('aria-invalid');
    field.removeAttribute('aria-describedby');
  });
  document.querySelectorAll('#register-form .field-error').forEach((note) => note.remove());
  $('register-errors').replaceChildren();
}

/** The field a problem's location (a JSON pointer into the body) belongs to: the one whose
 * `data-at` is the longest prefix of it. */
function fieldAt(location) {
  let best = null;
  for (const field of document.querySelectorAll('#register-form [data-at]')) {
    const at = field.dataset.at;
    if ((location === at || location.startsWith(`${at}/`)) && (!best || at.length > best.dataset.at.length)) {
      if (!field.closest('[hidden]')) best = field;
    }
  }
  return best;
}

/** Marks `field` invalid with `message` below it, read with the field. */
function mark(field, message) {
  field.setAttribute('aria-invalid', 'true');
  const note = document.createElement('span');
  note.className = 'field-error';
  note.id = `${field.id}-error`;
  note.textContent = message;
  field.insertAdjacentElement('afterend', note);
  field.setAttribute('aria-describedby', note.id);
}

async function submitRegistration(event) {
  event.preventDefault();
  unmark();
  say('register-status', 'Registering: recast makes a live call through the route…');
  const answer = await api('POST', '/v1/mapping', { body: JSON.stringify(registration(false)) }).catch(() => null);
  if (!arrived(answer, 'register-status')) return;
  if (answer.status === 201) {
    const created = answer.body;
    say('register-status', `Registered: calls go to ${created.path}.`);
    const link = document.createElement('a');
    link.href = `#route/${created.uuid}`;
    link.textContent = 'Open the new route';
    const item = document.createElement('li');
    item.className = 'done';
    item.append(link);
    $('register-errors').replaceChildren(item);
    return;
  }
  say('register-status', problemText(answer), true);
  const errors = (answer.body && Array.isArray(answer.body.errors)) ? answer.body.errors : [];
  // A live call that failed is the upstream's: shown at the base URL.
  if (!errors.length && answer.body && answer.body.type && answer.body.type.endsWith('/upstream-validation-failed')) {
    errors.push({ location: '/originalRoute/originalApi/baseUrl', message: answer.body.detail || 'the live call failed' });
  }
  let first = null;
  for (const error of errors) {
    const item = document.createElement('li');
    const where = document.createElement('code');
    where.textContent = error.location;
    item.append(where, document.createTextNode(`: ${error.message}`));
    $('register-errors').append(item);
    const field = fieldAt(error.location);
    if (field && !field.hasAttribute('aria-invalid')) {
      mark(field, error.location.startsWith(field.dataset.at + '/') ? `${error.location}: ${error.message}` : error.message);
      first ??= field;
    }
  }
  first?.focus();
}

/** The key shown once, forgotten: the field emptied and its panel hidden. */
function forgetIssued() {
  $('issued-key').value = '';
  $('issued').hidden = true;
}

/** Lists the consumers (up to 1,000, by name), each with its keys and what can be done. */
async function loadConsumers() {
  say('consumers-status', 'Loading consumers…');
  const answer = await api('GET', '/v1/consumers?limit=1000').catch(() => null);
  if (!arrived(answer, 'consumers-status')) return;
  if (answer.status !== 200) {
    say('consumers-status', problemText(answer), true);
    return;
  }
  const consumers = answer.body.consumers;
  $('consumer-rows').replaceChildren(...consumers.map(consumerRow));
  say('consumers-status', consumers.length === 0
    ? 'No consumers yet.'
    : `${consumers.length} consumer${consumers.length === 1 ? '' : 's'}${answer.body.next ? ' (the first 1,000)' : ''}.`);
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : 'never';
}

function button(text, action, label) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = text;
  if (label) b.setAttribute('aria-label', label);
  b.addEventListener('click', action);
  return b;
}

/** A consumer's row: its name, metadata, keys (each with its prefix, times, last use and a
 * revoke button), and a button that issues a key. */
function consumerRow(consumer) {
  const tr = document.createElement('tr');
  tr.dataset.name = consumer.name;
  const name = document.createElement('th');
  name.scope = 'row';
  name.textContent = consumer.name;
  const keys = document.createElement('td');
  const list = document.createElement('ul');
  list.className = 'keys';
  for (const key of consumer.keys) {
    const item = document.createElement('li');
    item.dataset.id = key.id;
    const text = document.createElement('span');
    text.textContent = `${key.prefix}… created ${when(key.createdAt)}, expires ${key.expiresAt ? when(key.expiresAt) : 'never'}, last used ${when(key.lastUsedAt)}`;
    item.append(text, ' ', button('Revoke', () => revokeKey(consumer.name, key.id, key.prefix), `Revoke key ${key.prefix}… of ${consumer.name}`));
    list.append(item);
  }
  keys.append(consumer.keys.length ? list : document.createTextNode('no keys'));
  const actions = document.createElement('td');
  actions.append(button('Issue a key', () => issueKey(consumer.name), `Issue a key to ${consumer.name}`));
  tr.append(name, cell(consumer.metadata ? JSON.stringify(consumer.metadata) : ''), keys, actions);
  return tr;
}

async function createConsumer(event) {
  event.preventDefault();
  const name = $('consumer-name').value.trim();
  const text = $('consumer-metadata').value.trim();
  let metadata = null;
  if (text) {
    try {
      metadata = JSON.parse(text);
    } catch {
      say('consumers-status', 'The metadata is not JSON.', true);
      return;
    }
  }
  const answer = await api('POST', '/v1/consumers', { body: JSON.stringify({ name, metadata }) }).catch(() => null);
  if (!arrived(answer, 'consumers-status')) return;
  if (answer.status !== 201) {
    say('consumers-status', problemText(answer), true);
    return;
  }
  $('consumer-name').value = '';
  $('consumer-metadata').value = '';
  await loadConsumers();
  say('consumers-status', `Consumer ${name} created.`);
}

/** Issues a key to `name` and shows it this once, with a button that copies it. */
async function issueKey(name) {
  const answer = await api('POST', `/v1/consumers/${encodeURIComponent(name)}/keys`).catch(() => null);
  if (!arrived(answer, 'consumers-status')) return;
  if (answer.status !== 201) {
    say('consumers-status', problemText(answer), true);
    return;
  }
  $('issued-consumer').textContent = name;
  $('issued-key').value = answer.body.key;
  say('issued-status', '');
  $('issued').hidden = false;
  await loadConsumers();
  $('issued-title').focus();
}

async function copyIssued() {
  try {
    await navigator.clipboard.writeText($('issued-key').value);
    say('issued-status', 'Copied.');
  } catch {
    $('issued-key').select();
    say('issued-status', 'The page may not copy here: the key is selected, copy it with the keyboard.');
  }
}

async function revokeKey(name, id, prefix) {
  const answer = await api('DELETE', `/v1/consumers/${encodeURIComponent(name)}/keys/${encodeURIComponent(id)}`).catch(() => null);
  if (!arrived(answer, 'consumers-status')) return;
  if (answer.status !== 204) {
    say('consumers-status', problemText(answer), true);
    return;
  }
  await loadConsumers();
  say('consumers-status', `Key ${prefix}… of ${name} revoked: it is refused from now on.`);
}

function applyFilter(event) {
  event.preventDefault();
  page.filter = {
    path: $('filter-path').value.trim(),
    host: $('filter-host').value.trim(),
    owner: $('filter-owner').value.trim(),
    name: $('filter-name').value.trim(),
  };
  page.cursors = [null];
  load(null);
}

function clearFilter() {
  for (const id of ['filter-path', 'filter-host', 'filter-owner', 'filter-name']) $(id).value = '';
  applyFilter(new Event('submit'));
}

document.addEventListener('DOMContentLoaded', () => {
  $('signin-form').addEventListener('submit', signIn);
  $('signout').addEventListener('click', signOut);
  $('filters').addEventListener('submit', applyFilter);
  $('filter-clear').addEventListener('click', clearFilter);
  $('next-page').addEventListener('click', () => {
    if (!page.next) return;
    page.cursors.push(page.next);
    load(page.next);
  });
  $('first-page').addEventListener('click', () => {
    page.cursors = [null];
    load(null);
  });
  $('refresh').addEventListener('click', () => load(page.cursors[page.cursors.length - 1]));
  $('back').addEventListener('click', (event) => {
    event.preventDefault();
    history.pushState(null, '', '#');
    navigate();
  });
  $('purge').addEventListener('click', purge);
  rules.area.addEventListener('input', schedulePreview);
  sample.area.addEventListener('input', schedulePreview);
  $('use-tried').addEventListener('click', useTried);
  $('save').addEventListener('click', saveRules);
  $('edit-reset').addEventListener('click', resetRules);
  $('try').addEventListener('click', tryRoute);
  $('register-back').addEventListener('click', (event) => {
    event.preventDefault();
    history.pushState(null, '', '#');
    navigate();
  });
  $('reg-rules').value = EXAMPLE_RULES;
  $('register-form').addEventListener('input', showBody);
  $('register-form').addEventListener('change', showBody);
  $('register-form').addEventListener('submit', submitRegistration);
  $('delete').addEventListener('click', askDelete);
  $('consumer-form').addEventListener('submit', createConsumer);
  $('issued-copy').addEventListener('click', copyIssued);
  $('issued-done').addEventListener('click', forgetIssued);
  $('consumers-back').addEventListener('click', (event) => {
    event.preventDefault();
    history.pushState(null, '', '#');
    navigate();
  });
  $('confirm-delete').addEventListener('close', confirmDelete);
  window.addEventListener('hashchange', () => {
    if (admitted) navigate();
  });
  start();
});
