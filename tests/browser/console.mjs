// Drives recast's routes console in headless Chromium and checks what it shows.
//
//   node tests/browser/console.mjs BASE_URL ADMIN_TOKEN ARTIFACT_DIR OPEN_URL
//
// BASE_URL is a running recast started with RECAST_ADMIN_TOKEN=ADMIN_TOKEN whose outbound policy
// allows 127.0.0.1 (`--upstream-allow 127.0.0.0/8`); it should hold no route yet. OPEN_URL is
// another, started without an admin token: the console must say its admin endpoints are open. The script
// registers 120 routes through the API, then signs in with a wrong token and the right one,
// pages through the list, filters it by path and by upstream host, calls a route and sees its
// health move, opens it, purges its cache, deletes it after a confirmation, registers a route
// from the form (a rule problem marked at its field first), edits a route's rules (previewed on the
// document Try it brought; a rule problem marked in the editor, then a fix saved with the stored
// token kept), tries and saves a composed route whose templates read its stored sample request,
// uses the page by keyboard alone, and
// signs out. axe-core checks every view for
// serious or critical accessibility violations. Screenshots (PNG) go to ARTIFACT_DIR. Prints one
// line per check; on the first failed check it prints what was expected and what was found,
// saves failure.png, and exits 1.

import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { WAIT_MS, check, finish, launch, waitFor, watch } from './harness.mjs';

const [given, adminToken, artifacts, open] = process.argv.slice(2);
if (!given || !adminToken || !artifacts || !open) {
  console.error('usage: node console.mjs BASE_URL ADMIN_TOKEN ARTIFACT_DIR OPEN_URL');
  process.exit(2);
}
const openBase = open.replace(/\/+$/, '');
const base = given.replace(/\/+$/, '');
mkdirSync(artifacts, { recursive: true });
rmSync(join(artifacts, 'failure.png'), { force: true });

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

const ROUTES = 120;

setTimeout(() => {
  console.error('console: FAILED: the checks did not finish within 180 s');
  process.exit(1);
}, 180_000).unref();

let upstreamHits = 0;
const upstreamCalls = () => upstreamHits;
/** The `Authorization` the upstream last received. */
let upstreamAuthorization;

/** An upstream on 127.0.0.1 that answers every GET with a one-meal document. */
async function startUpstream() {
  const server = http.createServer((request, response) => {
    upstreamHits += 1;
    upstreamAuthorization = request.headers.authorization;
    response.setHeader('content-type', 'application/json');
    response.end(JSON.stringify({ meals: [{ idMeal: '52772', strMeal: 'Teriyaki Chicken Casserole' }] }));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: server.address().port };
}

/** Registers route `i`: every third under `shop/orders-<i>`, the others under `users/<i>`; the
 * odd ones call the upstream by the name `localhost`, the even ones by its address. */
async function register(i, port) {
  const host = i % 2 === 1 ? 'localhost' : '127.0.0.1';
  const body = {
    path: i % 3 === 0 ? `shop/orders-${i}` : `users/${i}`,
    originalRoute: { originalApi: { baseUrl: `http://${host}:${port}/` }, path: 'meal' },
    authHeader: i === 0 ? { type: 'Bearer', token: 'upstream-secret-e51d' } : undefined,
    cache: i === 3 ? { ttlSeconds: 60 } : undefined,
    rulesAsString: {
      newBodyFields: { id: { key: 'id', type: 'Int' }, name: { key: 'name', type: 'String' } },
      oldBodyFields: { id: { keys: ['idMeal'], parents: ['meals'] }, name: { keys: ['strMeal'], parents: ['meals'] } },
    },
  };
  const answer = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify(body),
  });
  const text = await answer.text();
  check(answer.status === 201, `registration ${i} answers 201`, `${answer.status} ${text}`);
  return JSON.parse(text);
}

const profile = mkdtempSync(join(tmpdir(), 'recast-chromium-'));
const upstream = await startUpstream();
let context;
let page;
let step = 'registering the routes';
const problems = [];
const requested = [];

async function screenshot(name) {
  // The viewport, as a user sees the view (a full page of 50 rows would be a long strip).
  await page.screenshot({ path: join(artifacts, `${name}.png`) });
}

/** axe-core on the page as it is: no serious or critical violation. */
async function accessible(view) {
  const installed = await page.evaluate(() => typeof window.axe !== 'undefined');
  // Evaluated through the browser's debugging protocol, which the page's policy does not govern.
  if (!installed) await page.evaluate(AXE_SOURCE);
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document, { resultTypes: ['violations'] });
    return result.violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.map((n) => `${n.target.join(' ')}: ${n.failureSummary}`),
    }));
  });
  const bad = violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  check(bad.length === 0, `axe-core finds no serious or critical violation (${view})`, JSON.stringify(bad));
  console.log(`ok: axe-core: no serious or critical violation (${view}; ${violations.length} of lesser impact)`);
}

const rowPaths = () => page.locator('#route-rows tr td.path').allTextContents();
const status = () => page.textContent('#routes-status');

async function run() {
  const registered = [];
  for (let i = 0; i < ROUTES; i++) registered.push(await register(i, upstream.port));
  console.log(`ok: ${ROUTES} routes registered`);

  step = 'starting Chromium';
  ({ context, page } = await launch(profile));
  watch(page, [base, openBase], problems);
  page.on('request', (request) => requested.push(request.url()));

  step = 'the console loads and asks for the token';
  const response = await page.goto(`${base}/console`);
  check(response.status() === 200, 'GET /console answers 200', response.status());
  check(
    (response.headers()['content-security-policy'] ?? '').startsWith("default-src 'self'"),
    'GET /console carries the Content-Security-Policy',
    response.headers()['content-security-policy'],
  );
  await page.waitForSelector('#signin:not([hidden])', { timeout: WAIT_MS });
  check(await page.isHidden('#routes'), 'the routes stay hidden until signed in');
  await accessible('sign in');
  await screenshot('console-01-sign-in');
  console.log('ok: the console asks for the admin token');

  step = 'a wrong token is refused';
  await page.fill('#token', 'not-the-token');
  await page.click('#signin-form button[type=submit]');
  await waitFor('the page says the token was refused', () => page.textContent('#signin-status'), (t) => t.includes('refused'));
  check(await page.isHidden('#routes'), 'still signed out');
  check(
    (await page.evaluate(() => sessionStorage.getItem('recast.adminToken'))) === null,
    'a refused token is not kept',
  );
  await accessible('wrong token');
  await screenshot('console-02-wrong-token');
  console.log('ok: a wrong token is refused and not kept');

  step = 'signing in by keyboard alone';
  await page.focus('#token');
  await page.keyboard.type(adminToken);
  await page.keyboard.press('Enter');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  check(
    (await page.evaluate(() => sessionStorage.getItem('recast.adminToken'))) === adminToken,
    'the token is kept in session storage',
  );
  check(await page.isHidden('#open-notice'), 'no "admin endpoints are open" notice with a token');
  await waitFor('the first page lists 50 routes', rowPaths, (paths) => paths.length === 50);
  const newest = registered[ROUTES - 1];
  check(
    (await rowPaths())[0] === newest.path.replace(/^\/v1\/[^/]+\//, ''),
    'newest first',
    (await rowPaths())[0],
  );
  await waitFor('every row has its health', () => page.locator('td.health').allTextContents(), (cells) =>
    cells.length === 50 && cells.every((c) => c.startsWith('0 calls')),
  );
  await accessible('routes');
  await screenshot('console-03-routes');
  console.log('ok: signed in by keyboard; the first page lists 50 routes, newest first, with their health');

  step = 'paging through 120 routes';
  const seen = new Set(await rowPaths());
  await page.click('#next-page');
  await waitFor('page 2 holds 50 more', status, (t) => t.startsWith('Page 2: 50 routes; more'));
  (await rowPaths()).forEach((p) => seen.add(p));
  await page.click('#next-page');
  await waitFor('page 3 holds the last 20', status, (t) => t.startsWith('Page 3: 20 routes.'));
  (await rowPaths()).forEach((p) => seen.add(p));
  check(seen.size === ROUTES, 'the three pages hold every route once', seen.size);
  check(await page.isDisabled('#next-page'), 'no page after the last');
  await page.click('#first-page');
  await waitFor('back on the first page', status, (t) => t.startsWith('Page 1: 50 routes'));
  console.log('ok: three pages of 50, 50 and 20 routes, each route once');

  step = 'filtering by path and by upstream host';
  await page.fill('#filter-path', 'ORDERS');
  await page.click('#filters button[type=submit]');
  await waitFor('40 routes have "orders" in their path', status, (t) => t.startsWith('Page 1: 40 routes matching the filter.'));
  check((await rowPaths()).every((p) => p.startsWith('shop/orders-')), 'only those routes are listed');
  await accessible('filtered');
  await screenshot('console-04-filtered');
  await page.fill('#filter-host', 'localhost');
  await page.click('#filters button[type=submit]');
  // Paths of every third route, called by the name localhost (odd i): i = 3, 9, 15, ... (20).
  await waitFor('20 of them call localhost', status, (t) => t.startsWith('Page 1: 20 routes matching the filter.'));
  check(
    (await page.locator('td.upstream').allTextContents()).every((u) => u.startsWith('http://localhost:')),
    'each calls localhost',
  );
  await page.fill('#filter-path', 'no-such-route');
  await page.click('#filters button[type=submit]');
  await waitFor('a filter nothing matches', status, (t) => t.startsWith('No routes matching the filter'));
  await page.click('#filter-clear');
  await waitFor('the filter cleared', status, (t) => t.startsWith('Page 1: 50 routes;'));
  console.log('ok: filtered by path (40 routes), by path and host (20), by nothing that matches, then cleared');

  step = 'the auth type shows, never the secret';
  const text = await page.textContent('#route-table');
  check(!text.includes('upstream-secret-e51d'), 'no stored secret in the page');
  const firstRoute = registered[0];
  await page.fill('#filter-path', 'orders-0');
  await page.click('#filters button[type=submit]');
  await waitFor('route 0 alone', rowPaths, (paths) => paths.length === 1 && paths[0] === 'shop/orders-0');
  const cells = await page.locator('#route-rows tr td').allTextContents();
  check(cells[4] === 'Bearer', 'the auth type of route 0 is Bearer', JSON.stringify(cells));
  console.log('ok: the auth type is shown, the token never');

  step = 'the health moves after calls';
  for (let n = 0; n < 3; n++) {
    const call = await fetch(`${base}${firstRoute.path}`);
    check(call.status === 200, 'a call of route 0 answers 200', call.status);
  }
  await page.click('#refresh');
  await waitFor('route 0 shows 3 calls and its latency', () => page.textContent('td.health'), (t) =>
    t.startsWith('3 calls') && t.includes('p50') && t.includes('p99'),
  );
  await screenshot('console-05-health');
  console.log('ok: after 3 calls the route shows 3 calls with p50 and p99');

  step = 'opening a route';
  await page.click('td.path a');
  await page.waitForSelector('#route:not([hidden])', { timeout: WAIT_MS });
  await waitFor('the route is shown', () => page.textContent('#route-title'), (t) => t === 'GET shop/orders-0');
  check(page.url().endsWith(`#route/${firstRoute.uuid}`), 'the address names the route', page.url());
  const config = await page.textContent('#route-config');
  check(config.includes('"token": "***"') && !config.includes('upstream-secret-e51d'), 'the token is masked', config);
  await waitFor('its health since it was loaded shows the 3 calls', () => page.locator('#health-rows tr').allTextContents(), (rows) =>
    rows.length === 2 && rows[0].startsWith('since it was loaded3none') && rows[1].startsWith('the last 5 minutes3none'),
  );
  await accessible('a route');
  console.log('ok: a route opens with its configuration (token masked) and its health');

  step = 'trying a route';
  const callsBefore = upstreamCalls();
  await page.click('#try');
  await page.waitForSelector('#tried:not([hidden])', { timeout: WAIT_MS });
  check(upstreamCalls() === callsBefore + 1, 'one real upstream call', upstreamCalls() - callsBefore);
  check(
    JSON.parse(await page.textContent('#tried-upstream')).meals[0].idMeal === '52772',
    'the upstream\'s document is shown',
    await page.textContent('#tried-upstream'),
  );
  check(
    (await page.textContent('#tried-output')) === JSON.stringify({ id: 52772, name: 'Teriyaki Chicken Casserole' }, null, 2),
    'beside the mapped answer',
    await page.textContent('#tried-output'),
  );
  const traced = await page.locator('#tried-rows tr').evaluateAll((rows) =>
    rows.map((row) => [...row.querySelectorAll('td')].map((td) => td.textContent)),
  );
  check(traced.length === 2 && traced[0][1] === 'id' && traced[0][2] === '52772', 'with the trace of each target', JSON.stringify(traced));
  await accessible('a route, tried');
  await screenshot('console-07-route');
  console.log('ok: trying a route shows the upstream\'s document beside the mapped answer, with the trace');

  step = 'editing the rules: previewed on the tried document';
  const sampleText = await page.inputValue('#edit-sample');
  check(JSON.parse(sampleText).meals[0].strMeal === 'Teriyaki Chicken Casserole', 'the tried document is the sample', sampleText);
  const storedRules = await page.inputValue('#edit-rules');
  check(JSON.parse(storedRules).newBodyFields.id.type === 'Int', 'the editor holds the route\'s rules', storedRules);
  await waitFor('the preview maps the sample', () => page.textContent('#edit-output'), (t) =>
    t === JSON.stringify({ id: 52772, name: 'Teriyaki Chicken Casserole' }, null, 2),
  );

  step = 'editing the rules: a rule problem is marked in the editor';
  const wrong = storedRules.replace('"type": "Int"', '"type": "Integer"');
  check(wrong !== storedRules, 'the test made a rule problem', storedRules);
  await page.fill('#edit-rules', wrong);
  const problemAt = (location) => async () =>
    (await page.locator('#edit-problems li').allTextContents()).find((t) => t.startsWith(location));
  await waitFor('the preview lists the problem at its rule', problemAt('/newBodyFields/id/type'), (t) => t !== undefined);
  const wrongLine = wrong.split('\n').findIndex((line) => line.includes('"Integer"')) + 1;
  await waitFor('and marks its line in the editor', () => page.locator('#edit-rules-backdrop .mark-error').evaluateAll((spans) => spans.map((s) => s.dataset.line)), (lines) => lines.includes(String(wrongLine)));
  const callsBeforeSave = upstreamCalls();
  await page.click('#save');
  await waitFor('the update is refused', () => page.textContent('#edit-status'), (t) => t.startsWith('Not saved:'));
  const refused = await problemAt('/rulesAsString/newBodyFields/id/type')();
  check(refused !== undefined && refused.includes(`line ${wrongLine}`), 'located in the update and shown at its line of the rules', refused);
  check(upstreamCalls() === callsBeforeSave, 'no live call for rules that do not compile', upstreamCalls() - callsBeforeSave);
  await page.click('#edit-problems button.line');
  const selected = await page.evaluate(() => {
    const area = document.getElementById('edit-rules');
    return [document.activeElement.id, area.value.slice(area.selectionStart, area.selectionEnd)];
  });
  check(selected[0] === 'edit-rules' && selected[1].includes('"Integer"'), 'its button selects the line in the editor', JSON.stringify(selected));
  check(
    (await (await fetch(`${base}${firstRoute.path}`)).text()) === JSON.stringify({ id: 52772, name: 'Teriyaki Chicken Casserole' }),
    'the route keeps its stored rules',
  );
  await accessible('rules editor, with a problem');
  await screenshot('console-12-rules-problem');

  step = 'editing the rules: the fix is saved';
  const fixed = JSON.stringify({
    newBodyFields: { title: { key: 'title', type: 'String' }, id: { key: 'id', type: 'Int' } },
    oldBodyFields: { title: { keys: ['strMeal'], parents: ['meals'] }, id: { keys: ['idMeal'], parents: ['meals'] } },
  }, null, 2);
  await page.fill('#edit-rules', fixed);
  const expected = { title: 'Teriyaki Chicken Casserole', id: 52772 };
  await waitFor('the preview maps the sample by the fix', () => page.textContent('#edit-output'), (t) => t === JSON.stringify(expected, null, 2));
  // Meanwhile, another admin gives the route a cache through the API.
  const asAdmin = { authorization: `Bearer ${adminToken}` };
  const current = await (await fetch(`${base}/v1/routes/${firstRoute.uuid}`, { headers: asAdmin })).json();
  for (const written of ['uuid', 'path', 'auth', 'createdAt', 'updatedAt', 'status', 'problem', 'revision']) delete current[written];
  current.cache = { ttlSeconds: 30 };
  const meanwhile = await fetch(`${base}/v1/routes/${firstRoute.uuid}`, {
    method: 'PUT',
    headers: { ...asAdmin, 'content-type': 'application/json' },
    body: JSON.stringify(current),
  });
  check(meanwhile.status === 200, 'another admin changed the route meanwhile', `${meanwhile.status} ${await meanwhile.text()}`);
  const callsBeforeStale = upstreamCalls();
  await page.click('#save');
  await waitFor('the save names the change made meanwhile', () => page.textContent('#edit-status'), (t) => t.startsWith('Not saved: the route was changed meanwhile'));
  check(upstreamCalls() === callsBeforeStale, 'no live call for a stale version', upstreamCalls() - callsBeforeStale);
  check((await page.textContent('#route-config')).includes('"ttlSeconds": 30'), 'the configuration shown is the one now');
  check((await page.inputValue('#edit-rules')) === fixed, 'the edited rules stay in the editor');
  const callsBeforeFix = upstreamCalls();
  await page.click('#save');
  await waitFor('the update is saved', () => page.textContent('#edit-status'), (t) => t.startsWith('Saved.'));
  check(upstreamCalls() === callsBeforeFix + 1, 'one live call', upstreamCalls() - callsBeforeFix);
  check(upstreamAuthorization === 'Bearer upstream-secret-e51d', 'with the stored token, shown as *** and kept', upstreamAuthorization);
  check((await page.locator('#edit-problems li').count()) === 0, 'no problem is left', await page.locator('#edit-problems').textContent());
  const mapped = await (await fetch(`${base}${firstRoute.path}`)).text();
  check(mapped === JSON.stringify(expected), 'calls use the saved rules, in their order', mapped);
  const configShown = await page.textContent('#route-config');
  check(configShown.includes('"title"') && configShown.includes('"token": "***"'), 'the configuration shown follows, the token still masked', configShown);
  check(configShown.includes('"ttlSeconds": 30'), 'and the change made meanwhile is kept', configShown);
  await accessible('rules editor, saved');
  await screenshot('console-13-rules-saved');
  console.log('ok: the rules are edited, previewed on the tried document, refused with the problem marked at its line, not saved over a change made meanwhile, then saved with the token and that change kept');

  step = 'editing a runtime-auth route: its live call needs the caller\'s credentials';
  const runtimeAnswer = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}`, 'x-mapped-auth': 'Bearer caller-a' },
    body: JSON.stringify({
      path: 'runtime/meal',
      originalRoute: { originalApi: { baseUrl: `http://127.0.0.1:${upstream.port}/` }, path: 'meal' },
      rulesAsString: { newBodyFields: { name: { key: 'name', type: 'String' } }, oldBodyFields: { name: { keys: ['strMeal'], parents: ['meals'] } } },
    }),
  });
  check(runtimeAnswer.status === 201, 'a runtime-auth route is registered', runtimeAnswer.status);
  const runtimeRoute = await runtimeAnswer.json();
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, runtimeRoute.uuid);
  await waitFor('the runtime-auth route is shown', () => page.textContent('#route-title'), (t) => t === 'GET runtime/meal');
  check(await page.isVisible('#mapped-auth'), 'the page asks for an X-Mapped-Auth for its live calls');
  const runtimeCalls = upstreamCalls();
  await page.click('#save');
  await waitFor('without one, nothing is sent', () => page.textContent('#edit-status'), (t) => t.includes('give an X-Mapped-Auth'));
  check(upstreamCalls() === runtimeCalls, 'no live call without credentials', upstreamCalls() - runtimeCalls);
  await page.fill('#mapped-auth', 'Bearer caller-b');
  await page.click('#save');
  await waitFor('with one, the rules are saved', () => page.textContent('#edit-status'), (t) => t.startsWith('Saved.'));
  check(upstreamAuthorization === 'Bearer caller-b', 'the live call sent the X-Mapped-Auth given', upstreamAuthorization);
  const runtimeShown = await (await fetch(`${base}/v1/routes/${runtimeRoute.uuid}`, { headers: { authorization: `Bearer ${adminToken}` } })).json();
  check(runtimeShown.auth === 'runtime', 'the route still takes its callers\' credentials', runtimeShown.auth);
  await fetch(`${base}/v1/routes/${runtimeRoute.uuid}`, { method: 'DELETE', headers: { authorization: `Bearer ${adminToken}` } });
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, firstRoute.uuid);
  await waitFor('back on the first route', () => page.textContent('#route-title'), (t) => t === 'GET shop/orders-0');
  console.log('ok: a runtime-auth route\'s rules are saved with the X-Mapped-Auth given for the live call, and it stays runtime-auth');

  step = 'a composed route whose templates read the request: tried and saved with its sample request';
  const composedAnswer = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify({
      path: 'composed/meal',
      sources: { meal: { originalApi: { baseUrl: `http://127.0.0.1:${upstream.port}/` }, path: 'meal', queries: { id: '{{request.query.id}}' } } },
      sampleRequest: { query: { id: '52772' } },
      rulesAsString: { newBodyFields: { name: { key: 'name', type: 'String' } }, oldBodyFields: { name: { expr: 'meal.meals[0].strMeal' } } },
    }),
  });
  check(composedAnswer.status === 201, 'a composed route reading request.query is registered', `${composedAnswer.status}`);
  const composedRoute = await composedAnswer.json();
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, composedRoute.uuid);
  await waitFor('the composed route is shown', () => page.textContent('#route-title'), (t) => t === 'GET composed/meal');
  const requestShown = JSON.parse(await page.inputValue('#edit-request'));
  check(requestShown.query?.id === '52772', 'its stored sample request is in the editor', JSON.stringify(requestShown));
  let composedCalls = upstreamCalls();
  await page.click('#try');
  await waitFor('Try it calls its source', () => page.textContent('#route-status'), (t) => t.startsWith('The upstream answered'));
  check(upstreamCalls() === composedCalls + 1, 'one source call', upstreamCalls() - composedCalls);
  const triedShown = JSON.parse(await page.textContent('#tried-upstream'));
  check(triedShown.request?.query?.id === '52772' && triedShown.meal?.meals?.[0]?.idMeal === '52772', 'the document of the try holds the request and the source', JSON.stringify(triedShown));
  await waitFor('the sample is the tried document, mapped', () => page.textContent('#edit-output'), (t) => t === JSON.stringify({ name: 'Teriyaki Chicken Casserole' }, null, 2));
  await page.fill('#edit-request', '{"query": {"id": "9"}}');
  await page.fill('#edit-rules', JSON.stringify({ newBodyFields: { title: { key: 'title', type: 'String' } }, oldBodyFields: { title: { expr: 'meal.meals[0].strMeal' } } }));
  composedCalls = upstreamCalls();
  await page.click('#save');
  await waitFor('the composed route is saved', () => page.textContent('#edit-status'), (t) => t.startsWith('Saved.'));
  check(upstreamCalls() === composedCalls + 1, 'with one live call', upstreamCalls() - composedCalls);
  const composedStored = await (await fetch(`${base}/v1/routes/${composedRoute.uuid}`, { headers: { authorization: `Bearer ${adminToken}` } })).json();
  check(JSON.stringify(composedStored.sampleRequest) === JSON.stringify({ query: { id: '9' } }), 'the edited sample request is stored', JSON.stringify(composedStored.sampleRequest));
  await accessible('composed route, tried and saved');
  await fetch(`${base}/v1/routes/${composedRoute.uuid}`, { method: 'DELETE', headers: { authorization: `Bearer ${adminToken}` } });
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, firstRoute.uuid);
  await waitFor('back on the first route', () => page.textContent('#route-title'), (t) => t === 'GET shop/orders-0');
  console.log('ok: a composed route reading request is tried with its stored sample request (its document becomes the preview sample), and saved with an edited one');

  step = 'a paged source: Try it says the pages it fetched';
  const pagedAnswer = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify({
      path: 'paged/meals',
      sources: { meals: { originalApi: { baseUrl: `http://127.0.0.1:${upstream.port}/` }, path: 'meals',
        paginate: { items: 'meals', next: { query: { page: '$page + `1`' } }, while: '$page < `2`', maxPages: 5 } } },
      rulesAsString: { newBodyFields: { names: { key: 'names', type: 'Json' } }, oldBodyFields: { names: { expr: 'meals[*].strMeal' } } },
    }),
  });
  check(pagedAnswer.status === 201, 'a route with a paged source is registered', `${pagedAnswer.status}`);
  const pagedRoute = await pagedAnswer.json();
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, pagedRoute.uuid);
  await waitFor('the paged route is shown', () => page.textContent('#route-title'), (t) => t === 'GET paged/meals');
  check(await page.isHidden('#tried-pages'), 'no pages are told before a try');
  const pagedCalls = upstreamCalls();
  await page.click('#try');
  await waitFor('Try it follows the pages', () => page.textContent('#route-status'), (t) => t.startsWith('The upstream answered'));
  check(upstreamCalls() === pagedCalls + 2, 'two pages asked for', upstreamCalls() - pagedCalls);
  check(await page.isVisible('#tried-pages'), 'the pages fetched are told');
  check((await page.textContent('#tried-pages')) === 'Pages fetched: meals 2', 'as the source\'s name and count', await page.textContent('#tried-pages'));
  await accessible('paged route, tried');
  await fetch(`${base}/v1/routes/${pagedRoute.uuid}`, { method: 'DELETE', headers: { authorization: `Bearer ${adminToken}` } });
  await page.evaluate((uuid) => { location.hash = `#route/${uuid}`; }, firstRoute.uuid);
  await waitFor('back on the first route', () => page.textContent('#route-title'), (t) => t === 'GET shop/orders-0');
  console.log('ok: a route with a paged source tells the pages its Try it fetched');

  step = 'purging a route\'s cache';
  await page.click('#purge');
  await waitFor('the purge is confirmed', () => page.textContent('#route-status'), (t) => t === 'Cached answers purged on this node.');
  console.log('ok: purged');

  step = 'deleting a route after a confirmation that names its path';
  await page.click('#delete');
  await page.waitForSelector('#confirm-delete[open]', { timeout: WAIT_MS });
  const question = await page.textContent('#confirm-text');
  check(question.includes(firstRoute.path), 'the confirmation names the path', question);
  check(
    (await page.evaluate(() => document.activeElement.id)) === 'confirm-cancel',
    'the safe choice has the focus',
    await page.evaluate(() => document.activeElement.id),
  );
  await accessible('delete confirmation');
  await screenshot('console-08-delete');
  await page.keyboard.press('Escape');
  await waitFor('Escape keeps the route', () => page.isVisible('#confirm-delete'), (open) => !open);
  check((await fetch(`${base}${firstRoute.path}`)).status === 200, 'the route still answers');
  await page.click('#delete');
  await page.click('#confirm-yes');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  await waitFor('the list says the route is deleted', status, (t) => t === `Deleted the route at ${firstRoute.path}.`);
  check((await fetch(`${base}${firstRoute.path}`)).status === 404, 'the deleted route answers 404');
  console.log('ok: the confirmation names the path; Escape keeps the route; Delete deletes it');

  step = 'registering a route from the form';
  await page.click('#to-register');
  await page.waitForSelector('#register:not([hidden])', { timeout: WAIT_MS });
  check(page.url().endsWith('#register'), 'the address names the form', page.url());
  await page.fill('#reg-path', 'console/new');
  await page.fill('#reg-base', `http://127.0.0.1:${upstream.port}/`);
  await page.fill('#reg-upstream-path', 'meal');
  await page.selectOption('#reg-auth', 'Bearer');
  await page.fill('#reg-token', 'reg-secret-77');
  await page.fill('#reg-cache', '30');
  const brokenRules = (await page.inputValue('#reg-rules')).replace('"type": "Int"', '"type": "Integer"');
  await page.fill('#reg-rules', brokenRules);
  const shownBody = JSON.parse(await page.textContent('#reg-json'));
  check(
    shownBody.path === 'console/new' &&
      shownBody.originalRoute.originalApi.baseUrl === `http://127.0.0.1:${upstream.port}/` &&
      shownBody.authHeader.type === 'Bearer' &&
      shownBody.authHeader.token === '***' &&
      shownBody.cache.ttlSeconds === 30,
    'the body it will send is shown as the form says, the token as ***',
    JSON.stringify(shownBody),
  );
  check(!(await page.textContent('#register')).includes('reg-secret-77'), 'the typed token is not shown');
  await page.click('#reg-submit');
  await waitFor('the rule problem is listed with its location', () => page.locator('#register-errors li').allTextContents(), (items) =>
    items.length === 1 && items[0].startsWith('/rulesAsString/newBodyFields/id/type: '),
  );
  check((await page.getAttribute('#reg-rules', 'aria-invalid')) === 'true', 'the rules field is marked invalid');
  check(
    (await page.textContent('#reg-rules-error')).startsWith('/rulesAsString/newBodyFields/id/type: '),
    'the problem is written at the rules field',
  );
  check((await page.evaluate(() => document.activeElement.id)) === 'reg-rules', 'the focus moves to the field');
  await accessible('register, with a problem');
  await screenshot('console-09-register-problem');
  await page.fill('#reg-rules', brokenRules.replace('"type": "Integer"', '"type": "Int"'));
  await page.click('#reg-submit');
  await waitFor('registered', () => page.textContent('#register-status'), (t) => t.startsWith('Registered: calls go to /v1/'));
  check((await page.getAttribute('#reg-rules', 'aria-invalid')) === null, 'the mark is gone once fixed');
  const newPath = (await page.textContent('#register-status')).match(/\/v1\/\S+\/console\/new/)[0];
  const registeredCall = await fetch(`${base}${newPath}`);
  check(registeredCall.status === 200, 'the new route answers 200', registeredCall.status);
  check(
    JSON.stringify(await registeredCall.json()) === JSON.stringify({ id: 52772, name: 'Teriyaki Chicken Casserole' }),
    'the new route maps as its rules say',
  );
  await screenshot('console-10-registered');
  await page.click('#register-errors a');
  await waitFor('the new route opens', () => page.textContent('#route-title'), (t) => t === 'GET console/new');
  check((await page.textContent('#route-config')).includes('"ttlSeconds": 30'), 'with the cache it was given');
  await page.click('#back');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  console.log('ok: the form shows the body it sends (token masked), marks a rule problem at its field, then registers');

  step = 'callers: open routes marked, a protected route\'s callers shown';
  const guarded = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify({
      path: 'guarded',
      originalRoute: { originalApi: { baseUrl: `http://127.0.0.1:${upstream.port}/` }, path: 'meal' },
      name: 'guarded-route',
      owner: 'team-a',
      callers: { consumers: ['app-*'], limit: { requests: 100, perSeconds: 60 } },
      rulesAsString: { newBodyFields: { id: { key: 'id', type: 'Int' } }, oldBodyFields: { id: { keys: ['idMeal'], parents: ['meals'] } } },
    }),
  }).then((answer) => answer.json());
  check(typeof guarded.path === 'string', 'the protected route is registered', JSON.stringify(guarded));
  await page.fill('#filter-path', 'guarded');
  await page.click('#filters button[type=submit]');
  await waitFor('the protected route alone', rowPaths, (paths) => paths.length === 1 && paths[0] === 'guarded');
  const guardedCells = await page.locator('#route-rows tr td').allTextContents();
  check(guardedCells[5] === 'consumers app-*; 100 per 60 s each', 'its callers are shown', JSON.stringify(guardedCells));
  check(guardedCells[2] === 'guarded-route (team-a)', 'its name and owner are shown', JSON.stringify(guardedCells));
  await page.fill('#filter-path', '');
  await page.fill('#filter-owner', 'team-a');
  await page.click('#filters button[type=submit]');
  await waitFor('the routes of owner team-a: the protected one alone', rowPaths, (paths) => paths.length === 1 && paths[0] === 'guarded');
  await page.fill('#filter-owner', '');
  await page.fill('#filter-name', 'guarded-route');
  await page.click('#filters button[type=submit]');
  await waitFor('the route named guarded-route', rowPaths, (paths) => paths.length === 1 && paths[0] === 'guarded');
  await page.fill('#filter-name', '');
  const paid = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify({
      path: 'paid',
      originalRoute: { originalApi: { baseUrl: `http://127.0.0.1:${upstream.port}/` }, path: 'meal' },
      authHeader: { type: 'Bearer', token: 'upstream-secret-e51d' },
      rulesAsString: { newBodyFields: { id: { key: 'id', type: 'Int' } }, oldBodyFields: { id: { keys: ['idMeal'], parents: ['meals'] } } },
    }),
  }).then((answer) => answer.json());
  check(paid.warnings.some((w) => w.location === '/callers'), 'its registration warns of an open route that spends a token', JSON.stringify(paid.warnings));
  await page.fill('#filter-path', 'paid');
  await page.click('#filters button[type=submit]');
  await waitFor('the paid route alone', rowPaths, (paths) => paths.length === 1 && paths[0] === 'paid');
  const openCells = await page.locator('#route-rows tr td').allTextContents();
  check(openCells[5] === 'open: anyone with its address spends its credentials', 'an open route with a stored token is marked', JSON.stringify(openCells));
  await page.click('td.path a');
  await waitFor('it says who may call it', () => page.textContent('#route-callers'), (t) => t.startsWith('Who may call: anyone'));
  await page.click('#back');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  await page.fill('#filter-path', 'users/1');
  await page.click('#filters button[type=submit]');
  await waitFor('open routes without credentials', () => page.locator('td.callers').allTextContents(), (cells) =>
    cells.length > 0 && cells.every((c) => c === 'open'),
  );
  console.log('ok: each route\'s callers are shown in the list and the route view, open routes marked');

  step = 'consumers: created, a key issued and shown once, copied, used, revoked';
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
  await page.click('#to-consumers');
  await page.waitForSelector('#consumers:not([hidden])', { timeout: WAIT_MS });
  const consumersStatus = () => page.textContent('#consumers-status');
  await waitFor('an empty list of consumers', consumersStatus, (t) => t === 'No consumers yet.');
  await page.fill('#consumer-name', 'app-mobile');
  await page.fill('#consumer-metadata', '{"plan": "gold"}');
  await page.click('#consumer-create');
  await waitFor('the consumer is created', consumersStatus, (t) => t === 'Consumer app-mobile created.');
  await page.click('tr[data-name="app-mobile"] button');
  await page.waitForSelector('#issued:not([hidden])', { timeout: WAIT_MS });
  const key = await page.inputValue('#issued-key');
  check(/^rk_[A-Za-z0-9_-]{43}$/.test(key), 'the new key is shown', key);
  await accessible('consumers, a key shown once');
  await screenshot('console-14-consumer-key');
  await page.click('#issued-copy');
  await waitFor('the key is copied', () => page.textContent('#issued-status'), (t) => t === 'Copied.');
  check((await page.evaluate(() => navigator.clipboard.readText())) === key, 'the clipboard holds the key');
  const guardedCall = (headers) => fetch(`${base}${guarded.path}`, { headers }).then((answer) => answer.status);
  check((await guardedCall({ 'x-api-key': key })) === 200, 'the key calls the protected route');
  check((await guardedCall({})) === 401, 'no key is refused');
  await page.click('#issued-done');
  check(await page.isHidden('#issued'), 'the key is hidden once done');
  check(!(await page.content()).includes(key.slice(3)), 'the key is no longer in the page');
  // Seen again (the page reloaded, the token kept in this tab): the key's last use.
  await page.reload();
  await page.waitForSelector('#consumers:not([hidden])', { timeout: WAIT_MS });
  await waitFor('its key shows its prefix and last use', () => page.textContent('tr[data-name="app-mobile"] ul.keys'), (t) =>
    t.startsWith(`${key.slice(0, 11)}… created`) && !t.includes('last used never'),
  );
  await screenshot('console-15-consumers');
  await page.click('tr[data-name="app-mobile"] ul.keys button');
  await waitFor('the key is revoked', consumersStatus, (t) => t.startsWith(`Key ${key.slice(0, 11)}… of app-mobile revoked`));
  check((await guardedCall({ 'x-api-key': key })) === 401, 'the revoked key is refused');
  await accessible('consumers');
  await page.click('#consumers-back');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  console.log('ok: a consumer created, its key shown once and copied, used (last use shown), revoked and refused');

  step = 'keyboard only: tab to a control, see its focus, use it';
  await page.click('#filter-clear');
  await waitFor('the filter cleared', status, (t) => t.startsWith('Page 1: 50 routes;'));
  // From the filters, Tab goes through the filter's buttons and each route's link to the pager.
  await page.focus('#filter-name');
  const order = [];
  for (let n = 0; n < 60 && order[order.length - 1] !== 'next-page'; n++) {
    await page.keyboard.press('Tab');
    order.push(await page.evaluate(() => document.activeElement.id || document.activeElement.getAttribute('href')));
  }
  check(
    order.length === 53 &&
      order[0] === 'filter-apply' &&
      order[1] === 'filter-clear' &&
      order.slice(2, 52).every((target) => target.startsWith('#route/')) &&
      order[52] === 'next-page',
    'Tab goes: Filter, Clear, the 50 routes\' links, Next page (First page is disabled)',
    JSON.stringify(order),
  );
  const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
  check(outline !== 'none', 'the focused control shows its focus', outline);
  await page.keyboard.press('Enter');
  await waitFor('Enter on "Next page" turns the page', status, (t) => t.startsWith('Page 2:'));
  console.log('ok: Tab reaches the pager with a visible focus, Enter turns the page');

  step = 'the dark colour scheme';
  await page.emulateMedia({ colorScheme: 'dark' });
  await waitFor('page 2 has its health', () => page.locator('td.health').allTextContents(), (cells) =>
    cells.length === 50 && cells.every((c) => c.includes('call')),
  );
  await page.evaluate(() => window.scrollTo(0, 0));
  await accessible('routes, dark');
  await screenshot('console-06-dark');
  console.log('ok: dark colour scheme');

  step = 'signing out';
  await page.click('#signout');
  await page.waitForSelector('#signin:not([hidden])', { timeout: WAIT_MS });
  check(
    (await page.evaluate(() => sessionStorage.getItem('recast.adminToken'))) === null,
    'signing out forgets the token',
  );
  console.log('ok: signed out, the token forgotten');

  step = 'a service without an admin token';
  await page.emulateMedia({ colorScheme: 'light' });
  await page.goto(`${openBase}/console`);
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  check(await page.isVisible('#open-notice'), 'the page says the admin endpoints are open');
  check(await page.isHidden('#signin'), 'no sign-in is asked');
  check(await page.isHidden('#signout'), 'nothing to sign out of');
  await waitFor('its empty list', status, (t) => t.startsWith('No routes on this page'));
  await page.click('#to-register');
  await page.waitForSelector('#register:not([hidden])', { timeout: WAIT_MS });
  await page.click('#register-back');
  await page.waitForSelector('#routes:not([hidden])', { timeout: WAIT_MS });
  await accessible('admin endpoints open');
  await screenshot('console-11-open');
  console.log('ok: without an admin token the console says the admin endpoints are open, and navigates');

  step = 'nothing went wrong in the page';
  check(!requested.some((url) => url.includes(adminToken)), 'the token is never in a URL');
  check(problems.length === 0, 'no uncaught errors, console errors or outside requests', problems.join('\n'));
}

await finish('console', artifacts, run, () => ({ step, page, problems }), async () => {
  await context?.close().catch(() => {});
  upstream.server.close();
  rmSync(profile, { recursive: true, force: true });
});
