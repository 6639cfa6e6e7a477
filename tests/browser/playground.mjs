// Drives recast's playground page in headless Chromium and checks what it shows.
//
//   node tests/browser/playground.mjs BASE_URL ARTIFACT_DIR
//
// BASE_URL is a running recast (for the registration step its outbound policy must allow
// 127.0.0.1, as `--upstream-allow 127.0.0.0/8` does). Screenshots (PNG) go to ARTIFACT_DIR.
// Prints one line per check; on the first failed check it prints what was expected and what
// was found, saves failure.png, and exits 1.

import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';

import { Failed, check, finish, launch, waitFor, watch } from './harness.mjs';

const [given, artifacts] = process.argv.slice(2);
if (!given || !artifacts) {
  console.error('usage: node playground.mjs BASE_URL ARTIFACT_DIR');
  process.exit(2);
}
const base = given.replace(/\/+$/, '');
mkdirSync(artifacts, { recursive: true });
rmSync(join(artifacts, 'failure.png'), { force: true });

// A browser that hangs must not hang the test run.
setTimeout(() => {
  console.error('playground: FAILED: the checks did not finish within 120 s');
  process.exit(1);
}, 120_000).unref();

const EXAMPLE_OUTPUT = {
  id: 52772,
  name: 'Teriyaki Chicken Casserole',
  area: 'Japanese',
  ingredients: ['3/4 cup soy sauce', '1/2 cup water'],
};

const LIST_SAMPLE = JSON.stringify({
  meals: [
    { idMeal: '1', strMeal: 'Soup', strPrice: '4.5' },
    { idMeal: '2', strMeal: 'Stew', strPrice: 'ask' },
  ],
});

// Typed key by key: every prefix but the whole is invalid JSON, which the page must notice
// without asking the service.
const LIST_RULES = `{
  "each": ["meals"],
  "newBodyFields": {
    "name": { "key": "name", "type": "String", "position": 1 },
    "id": { "key": "id", "type": "Int", "position": 0 },
    "price": { "key": "price", "type": "Double" }
  },
  "oldBodyFields": {
    "id": { "keys": ["idMeal"] },
    "name": { "keys": ["strMeal"] },
    "price": { "keys": ["strPrice"] },
    "spare": { "keys": ["unused"] }
  }
}`;
const LIST_OUTPUT = [
  { id: 1, name: 'Soup', price: 4.5 },
  { id: 2, name: 'Stew', price: null },
];

// Line 3: an unknown type; line 4: a target without an `oldBodyFields` entry.
const BROKEN_RULES = `{
  "newBodyFields": {
    "a": { "key": "a", "type": "Integer" },
    "b": { "key": "b", "type": "Int" }
  },
  "oldBodyFields": {
    "a": { "keys": ["idMeal"], "parents": ["meals"] }
  }
}`;

// Line 7: an unknown function, after a JSON escape (`\u0073` is one character of the
// expression); line 8: an expression that ends too early.
const EXPRESSION_RULES = `{
  "newBodyFields": {
    "a": { "key": "a", "type": "String" },
    "b": { "key": "b", "type": "String" }
  },
  "oldBodyFields": {
    "a": { "expr": "\\u0073trMeal.lenth(@)" },
    "b": { "expr": "strMeal |" }
  }
}`;

const NOT_JSON_RULES = `{
  "newBodyFields": {
    "a": { "key": "a", "type": }
  }
}`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** An upstream on 127.0.0.1 that answers every GET with the README's recipe. */
async function startUpstream() {
  const received = [];
  const server = http.createServer((request, response) => {
    received.push({ url: request.url, authorization: request.headers.authorization });
    response.setHeader('content-type', 'application/json');
    response.end(
      JSON.stringify({
        meals: [
          {
            idMeal: '52772',
            strMeal: 'Teriyaki Chicken Casserole',
            strArea: 'Japanese',
            strMeasure1: '3/4 cup',
            strIngredient1: 'soy sauce',
            strMeasure2: '1/2 cup',
            strIngredient2: 'water',
            strMeasure3: ' ',
            strIngredient3: '',
          },
        ],
      }),
    );
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, received, url: `http://127.0.0.1:${server.address().port}/` };
}

const profile = mkdtempSync(join(tmpdir(), 'recast-chromium-'));
const upstream = await startUpstream();
let context;
let page;
let step = 'starting Chromium';
const problems = [];

async function screenshot(name) {
  await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
}

async function output() {
  return page.locator('#output').textContent();
}

/** The trace table's rows as [id, key] pairs. */
async function traceRows() {
  return page.locator('#trace tbody tr').evaluateAll((rows) =>
    rows.map((row) => [row.querySelector('.id').textContent, row.querySelector('.key').textContent]),
  );
}

/** The problem or warning list items as their text. */
async function items(list) {
  return page.locator(`${list} li`).allTextContents();
}

/** Which rules lines the backdrop marks, as {line: kind}. */
async function marks() {
  return page.locator('#rules-backdrop [data-line]').evaluateAll((spans) =>
    Object.fromEntries(spans.map((s) => [s.dataset.line, s.className])),
  );
}

async function run() {
  ({ context, page } = await launch(profile));
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: new URL(base).origin });
  watch(page, [base], problems);
  const previews = [];
  page.on('request', (request) => {
    if (new URL(request.url()).pathname === '/v1/preview') previews.push(request.url());
  });

  step = 'the page loads';
  const response = await page.goto(base + '/');
  check(response.status() === 200, 'GET / answers 200', response.status());
  check(
    (response.headers()['content-security-policy'] ?? '').startsWith("default-src 'self'"),
    'GET / carries the Content-Security-Policy',
    response.headers()['content-security-policy'],
  );
  check(
    (await page.title()) === 'recast playground',
    'the page has its title',
    await page.title(),
  );
  console.log('ok: the page loads with its security policy');

  step = 'the example maps';
  const expected = JSON.stringify(EXAMPLE_OUTPUT, null, 2);
  await waitFor('the example output is shown, pretty-printed', output, (text) => text === expected);
  const exampleRows = await waitFor('the trace lists the four targets', traceRows, (rows) => rows.length === 4);
  check(
    isDeepStrictEqual(exampleRows, [
      ['id', 'id'],
      ['name', 'name'],
      ['area', 'area'],
      ['ing', 'ingredients'],
    ]),
    'the trace rows are the targets in output order (id, key)',
    JSON.stringify(exampleRows),
  );
  check(
    (await page.locator('#trace tbody tr').first().locator('.note').textContent()).includes('/meals/0/idMeal'),
    'the trace note says where the id was read',
  );
  await screenshot('01-example');
  console.log('ok: the example output and its trace');

  step = 'a sample from a file and rules typed key by key';
  await page.setInputFiles('#sample-file', {
    name: 'list.json',
    mimeType: 'application/json',
    buffer: Buffer.from(LIST_SAMPLE),
  });
  await page.fill('#rules', '');
  const before = previews.length;
  await page.focus('#rules');
  await page.keyboard.type(LIST_RULES, { delay: 2 });
  const listExpected = JSON.stringify(LIST_OUTPUT, null, 2);
  await waitFor('the typed rules map the list', output, (text) => text === listExpected);
  // Typing ran for far longer than the debounce, but only complete documents are sent.
  check(previews.length - before <= 2, 'no preview is asked while the rules are not JSON', previews.length - before);
  const listRows = await traceRows();
  check(
    isDeepStrictEqual(listRows, [
      ['id', 'id'],
      ['name', 'name'],
      ['price', 'price'],
      ['id', 'id'],
      ['name', 'name'],
      ['price', 'price'],
    ]),
    'the trace has each target for each element, in position order',
    JSON.stringify(listRows),
  );
  check(
    await page.locator('#trace th.element').isVisible(),
    'the trace shows the element column for rules with each',
  );
  const warnings = await items('#warnings');
  check(
    warnings.length === 1 && warnings[0].includes('/oldBodyFields/spare') && warnings[0].includes('line 12'),
    'the unused oldBodyFields entry is a warning at its line',
    JSON.stringify(warnings),
  );
  check(isDeepStrictEqual(await marks(), { 12: 'mark-warning' }), 'line 12 is marked', JSON.stringify(await marks()));
  await screenshot('02-typed-list');
  console.log('ok: a sample loaded from a file, rules typed key by key, trace per element, a warning');

  step = 'a late answer to an older edit is not shown';
  let delayed = false;
  await page.route('**/v1/preview*', async (route) => {
    if (!delayed) {
      delayed = true;
      // This answer arrives after the next edit's answer.
      const late = await route.fetch();
      await sleep(800);
      await route.fulfill({ response: late }).catch(() => {});
    } else {
      await route.continue();
    }
  });
  await page.fill('#rules', LIST_RULES.replace('"String", "position": 1', '"String", "position": 2'));
  await waitFor('the first edit asks for a preview', async () => delayed, (asked) => asked);
  await page.fill('#rules', LIST_RULES.replace('"key": "name"', '"key": "title"'));
  const renamed = JSON.stringify(
    LIST_OUTPUT.map(({ id, name, price }) => ({ id, title: name, price })),
    null,
    2,
  );
  await waitFor('the newest edit is shown', output, (text) => text === renamed);
  await sleep(1000);
  check((await output()) === renamed, 'the late answer did not replace the newest one', await output());
  await page.unroute('**/v1/preview*');
  console.log('ok: an answer to an older edit is dropped');

  step = 'rule problems are listed with their locations and marked';
  await page.fill('#rules', BROKEN_RULES);
  const errors = await waitFor('two rule problems are listed', () => items('#errors'), (list) => list.length === 2);
  const typeProblem = errors.find((e) => e.startsWith('/newBodyFields/a/type'));
  const missingProblem = errors.find((e) => e.startsWith('/newBodyFields/b'));
  check(
    typeProblem?.includes('unknown type `Integer`') && typeProblem.includes('line 3'),
    'the unknown type is listed at /newBodyFields/a/type, line 3',
    JSON.stringify(errors),
  );
  check(
    missingProblem?.includes('no `oldBodyFields` entry') && missingProblem.includes('line 4'),
    'the target without a source is listed at /newBodyFields/b, line 4',
    JSON.stringify(errors),
  );
  check(
    (await page.locator('#problem-detail').textContent()).startsWith('The mapping rules are invalid'),
    'the problem title is shown',
    await page.locator('#problem-detail').textContent(),
  );
  check(
    isDeepStrictEqual(await marks(), { 3: 'mark-error', 4: 'mark-error' }),
    'lines 3 and 4 of the rules are marked',
    JSON.stringify(await marks()),
  );
  check((await output()) === '', 'no output is shown for broken rules', await output());
  await page.getByRole('button', { name: 'Select line 4 of the rules' }).click();
  const selected = await page.$eval('#rules', (area) => area.value.slice(area.selectionStart, area.selectionEnd));
  check(selected === '    "b": { "key": "b", "type": "Int" }', 'the line button selects line 4', selected);
  await screenshot('03-rule-problems');
  console.log('ok: rule problems listed with their locations; their lines marked and selectable');

  step = "an expression's compile error is marked at its character";
  await page.fill('#rules', EXPRESSION_RULES);
  const expressionErrors = await waitFor(
    'two expression problems are listed',
    () => items('#errors'),
    (list) => list.length === 2 && list.every((e) => e.startsWith('/oldBodyFields/')),
  );
  const lines = EXPRESSION_RULES.split('\n');
  const unknownColumn = lines[6].indexOf('lenth') + 1;
  const endColumn = lines[7].lastIndexOf('"') + 1;
  check(
    expressionErrors.some(
      (e) =>
        e.startsWith('/oldBodyFields/a/expr') &&
        e.includes('at character 8: unknown function lenth()') &&
        e.includes(`line 7, column ${unknownColumn}`),
    ),
    `the unknown function is listed at line 7, column ${unknownColumn} (after an escape)`,
    JSON.stringify(expressionErrors),
  );
  check(
    expressionErrors.some(
      (e) => e.startsWith('/oldBodyFields/b/expr') && e.includes('at character 9:') && e.includes(`line 8, column ${endColumn}`),
    ),
    `the early end is listed at the closing quote, line 8, column ${endColumn}`,
    JSON.stringify(expressionErrors),
  );
  check(
    isDeepStrictEqual(await marks(), { 7: 'mark-error', 8: 'mark-error' }),
    'lines 7 and 8 of the rules are marked',
    JSON.stringify(await marks()),
  );
  const spots = await page.locator('#rules-backdrop mark').allTextContents();
  check(isDeepStrictEqual(spots, ['l', '"']), 'the character of each problem is marked within its line', JSON.stringify(spots));
  await page
    .getByRole('button', { name: `Select the expression's character at line 7, column ${unknownColumn} of the rules` })
    .click();
  const spot = await page.$eval('#rules', (area) => [area.selectionStart, area.value.slice(area.selectionStart, area.selectionEnd)]);
  check(
    spot[1] === 'l' && spot[0] === EXPRESSION_RULES.indexOf('lenth'),
    "the button selects the expression's character",
    JSON.stringify(spot),
  );
  await screenshot('04-expression-problem');
  console.log("ok: expression problems marked and selectable at their character");

  step = 'text that is not JSON is refused locally';
  const asked = previews.length;
  await page.fill('#rules', NOT_JSON_RULES);
  await page.fill('#sample', '{"meals": [1, 2}');
  const rulesStatus = await waitFor(
    'the rules status names line and column',
    () => page.locator('#rules-status').textContent(),
    (text) => text.startsWith('Not valid JSON'),
  );
  check(rulesStatus.startsWith('Not valid JSON at line 3, column 32:'), 'the rules problem is at line 3, column 32', rulesStatus);
  const sampleStatus = await page.locator('#sample-status').textContent();
  check(sampleStatus.startsWith('Not valid JSON at line 1, column 16:'), 'the sample problem is at line 1, column 16', sampleStatus);
  await sleep(400);
  check(previews.length === asked, 'nothing is sent while the text is not JSON', previews.length - asked);
  check(isDeepStrictEqual(await marks(), { 3: 'mark-error' }), 'the bad line is marked', JSON.stringify(await marks()));
  await screenshot('05-not-json');
  console.log('ok: JSON mistakes shown at their line and column, nothing sent');

  step = 'back to the example';
  await page.getByRole('button', { name: 'Back to the example' }).click();
  await waitFor('the example maps again', output, (text) => text === expected);
  check((await page.locator('#rules-status').textContent()) === '', 'the rules status is clear');
  console.log('ok: back to the example');

  step = 'the registration body';
  await page.getByLabel('Route path').fill('meals/from-the-playground');
  await page.getByLabel('Method (route and upstream)').selectOption('GET');
  await page.getByLabel('Upstream base URL').fill(upstream.url);
  await page.getByLabel('Upstream path').fill('api/json/v1/1/random.php');
  await page.getByLabel('Upstream Bearer token (optional)').fill('playground-token');
  // A sample body that is not JSON is refused with a clear line, and nothing is copied.
  await page.locator('#sample-body').fill('{"order": ');
  await page.getByRole('button', { name: 'Copy the registration body' }).click();
  await waitFor(
    'a sample body that is not JSON is refused',
    () => page.locator('#copy-status').textContent(),
    (text) => text.startsWith('The sample body is not JSON'),
  );
  await page.locator('#sample-query').fill('page=2&q=soup');
  await page.locator('#sample-body').fill('{"order": 1042}');
  await page.getByRole('button', { name: 'Copy the registration body' }).click();
  const shown = await waitFor(
    'the registration body is shown',
    () => page.locator('#registration').inputValue(),
    (text) => text !== '',
  );
  let body;
  try {
    body = JSON.parse(shown);
  } catch (e) {
    throw new Failed(`the registration body is JSON (${e.message})\n  found: ${shown}`);
  }
  const rules = JSON.parse(await page.locator('#rules').inputValue());
  check(isDeepStrictEqual(body.rulesAsString, rules), 'rulesAsString holds the rules', JSON.stringify(body.rulesAsString));
  check(
    body.path === 'meals/from-the-playground' &&
      body.method === 'GET' &&
      body.originalRoute?.originalApi?.baseUrl === upstream.url &&
      body.originalRoute?.path === 'api/json/v1/1/random.php' &&
      body.authHeader?.type === 'Bearer' &&
      body.authHeader?.token === 'playground-token' &&
      isDeepStrictEqual(body.sampleRequest, { query: { page: '2', q: 'soup' }, body: { order: 1042 } }),
    'the body holds the route form',
    shown,
  );
  const curl = await page.locator('#curl').inputValue();
  check(curl.startsWith(`curl -s ${base}/v1/mapping`), 'the curl command posts to /v1/mapping', curl);
  const status = await page.locator('#copy-status').textContent();
  check(status.startsWith('Copied'), 'the page says the body was copied', status);
  const clipboard = await page.evaluate(() => navigator.clipboard.readText());
  check(clipboard === shown, 'the clipboard holds the shown body', clipboard);
  await screenshot('06-registration');

  // The copied body registers a route as it is.
  const registered = await fetch(`${base}/v1/mapping`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: clipboard,
  });
  const answer = await registered.json();
  check(registered.status === 201, 'POST /v1/mapping with the copied body answers 201', JSON.stringify(answer));
  check(isDeepStrictEqual(answer.preview, EXAMPLE_OUTPUT), 'the live call maps like the preview', JSON.stringify(answer.preview));
  check(
    upstream.received.at(-1)?.authorization === 'Bearer playground-token',
    'the upstream got the Bearer token',
    JSON.stringify(upstream.received),
  );
  console.log('ok: the copied body parses, holds the rules and registers a route');

  step = 'samples of several sources';
  await page.click('#sources-box summary');
  await page.fill('#source-names', 'user, Orders');
  await page.click('#make-sources');
  const refused = await page.textContent('#sources-status');
  check(refused.includes('"Orders" is not a source name'), 'a name that is not a source name is refused', refused);
  await page.fill('#source-names', 'user, orders');
  await page.click('#make-sources');
  await page.fill('#source-user', '{"name": "Ada"}');
  await page.fill('#source-orders', '{"items": [{"price": 5}, {"price": 7]');
  await page.click('#compose-sample');
  const broken = await page.textContent('#sources-status');
  check(broken.startsWith('The sample of orders is not JSON'), 'a sample that is not JSON is named', broken);
  await page.fill('#source-orders', '{"items": [{"price": 5}, {"price": 7}]}');
  await page.fill(
    '#rules',
    JSON.stringify({
      newBodyFields: { name: { key: 'name', type: 'String' }, total: { key: 'total', type: 'Int' }, ok: { key: 'ok', type: 'String' } },
      oldBodyFields: { name: { expr: 'user.name' }, total: { expr: 'sum(orders.items[*].price)' }, ok: { expr: '_sources.orders.outcome' } },
    }),
  );
  await page.click('#compose-sample');
  await waitFor(
    'the composed sample maps',
    output,
    (text) => text === JSON.stringify({ name: 'Ada', total: 12, ok: 'ok' }, null, 2),
  );
  const composed = JSON.parse(await page.inputValue('#sample'));
  check(
    isDeepStrictEqual(Object.keys(composed), ['user', 'orders', 'request', '_sources']),
    'the sample is the document of the sources, request and _sources',
    JSON.stringify(composed),
  );
  await screenshot('07-sources');
  console.log('ok: samples of several sources make one composed sample');

  step = 'the dark colour scheme';
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.fill('#rules', BROKEN_RULES);
  await waitFor('the problems show in the dark scheme', () => items('#errors'), (list) => list.length === 2);
  await screenshot('08-dark');
  console.log('ok: dark colour scheme');

  step = 'nothing went wrong in the page';
  check(problems.length === 0, 'no uncaught errors, console errors or outside requests', problems.join('\n'));
}

await finish('playground', artifacts, run, () => ({ step, page, problems }), async () => {
  await context?.close().catch(() => {});
  upstream.server.close();
  rmSync(profile, { recursive: true, force: true });
});
