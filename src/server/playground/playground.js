// The playground: maps the sample by the rules through `POST /v1/preview?trace=true` as the user
// types, shows the output, the trace, warnings and problems (marked in the text they point
// into), and builds the `POST /v1/mapping` body for the same rules.
import { Editor, compact, listProblems, places, pretty, syntaxError } from '/editor.js';

const $ = (id) => document.getElementById(id);

/** Milliseconds of quiet typing before the preview is asked for. */
const DEBOUNCE_MS = 150;

const sample = new Editor('sample');
const rules = new Editor('rules');
const output = $('output');
const state = $('state');
const traceBody = $('trace').querySelector('tbody');

let timer;
/** Numbers the previews asked for, so an answer to an older one is dropped. */
let asked = 0;
let inFlight = null;

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(preview, DEBOUNCE_MS);
}

function setState(text, kind = '') {
  state.textContent = text;
  state.className = kind;
}

/** Empties what the last answer showed. */
function clearResults(outputText) {
  output.textContent = outputText;
  traceBody.replaceChildren();
  $('trace').classList.remove('with-elements');
  $('problems').hidden = true;
  $('errors').replaceChildren();
  $('warnings-box').hidden = true;
  $('warnings').replaceChildren();
}

async function preview() {
  const ticket = ++asked;
  inFlight?.abort();
  inFlight = null;
  const sampleError = sample.check();
  const rulesError = rules.check();
  if (sampleError || rulesError) {
    setState('Waiting for valid JSON; nothing was sent.', 'error');
    clearResults('');
    return;
  }
  const controller = new AbortController();
  inFlight = controller;
  setState('Mapping…');
  const started = performance.now();
  let response;
  let text;
  try {
    response = await fetch('/v1/preview?trace=true', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"originalResponse":${sample.area.value},"mappingRules":${rules.area.value}}`,
      signal: controller.signal,
    });
    text = await response.text();
  } catch (e) {
    if (ticket === asked) {
      setState(`The service could not be reached: ${e.message}`, 'error');
      clearResults('');
    }
    return;
  }
  // A later edit asked again; its answer is the one to show.
  if (ticket !== asked) return;
  inFlight = null;
  const elapsed = Math.round(performance.now() - started);
  if (response.ok) {
    showMapped(text);
    setState(`Mapped in ${elapsed} ms.`, 'ok');
  } else {
    showProblem(response.status, text);
    setState(`The service answered ${response.status}.`, 'error');
  }
}

/** Shows a traced preview: `{"output", "trace", "warnings"}`. */
function showMapped(text) {
  const answer = JSON.parse(text);
  const at = places(text);
  const raw = (pointer) => {
    const place = at.get(pointer);
    return place ? text.slice(place.start, place.end) : 'null';
  };
  clearResults(pretty(raw('/output')));
  const withElements = answer.trace.some((entry) => entry.element !== undefined);
  $('trace').classList.toggle('with-elements', withElements);
  traceBody.replaceChildren(
    ...answer.trace.map((entry, n) => {
      const row = document.createElement('tr');
      const cells = [
        [entry.element ?? '', 'element'],
        [entry.id, 'id'],
        [entry.key, 'key'],
        [entry.resolved ? 'yes' : 'no', entry.resolved ? 'yes' : 'no'],
        [entry.included ? 'yes' : 'no', entry.included ? 'yes' : 'no'],
        [entry.included ? raw(`/trace/${n}/value`) : '—', 'value'],
        [entry.note, 'note'],
      ];
      for (const [content, name] of cells) {
        const cell = document.createElement('td');
        cell.className = name;
        cell.textContent = content;
        row.append(cell);
      }
      return row;
    }),
  );
  const marks = new Map();
  const spots = [];
  listProblems(rules, $('warnings'), answer.warnings, 'warning', marks, spots);
  $('warnings-box').hidden = answer.warnings.length === 0;
  rules.mark(marks, spots);
}

/** Shows an RFC 9457 problem; rule problems are listed and marked in the rules. */
function showProblem(status, text) {
  clearResults('');
  let problem;
  try {
    problem = JSON.parse(text);
  } catch {
    problem = { title: `HTTP ${status}`, detail: text.slice(0, 500) };
  }
  $('problems').hidden = false;
  $('problem-detail').textContent = [problem.title, problem.detail].filter(Boolean).join(': ');
  const marks = new Map();
  const spots = [];
  listProblems(rules, $('errors'), Array.isArray(problem.errors) ? problem.errors : [], 'error', marks, spots);
  rules.mark(marks, spots);
}


for (const [editor, file] of [[sample, 'sample-file'], [rules, 'rules-file']]) {
  editor.area.addEventListener('input', schedule);
  $(file).addEventListener('change', async (event) => {
    const chosen = event.target.files[0];
    if (!chosen) return;
    editor.area.value = await chosen.text();
    editor.paint();
    preview();
  });
}

$('reset').addEventListener('click', () => {
  for (const editor of [sample, rules]) {
    editor.area.value = editor.area.defaultValue;
    editor.paint();
  }
  preview();
});

/** A source's name, as a composed route takes it (SPEC §2.3). */
const SOURCE_NAME = /^[a-z][a-z0-9_]{0,31}$/;

function sourcesStatus(text, kind) {
  const status = $('sources-status');
  status.textContent = text;
  status.className = `status ${kind}`;
}

$('make-sources').addEventListener('click', () => {
  const names = $('source-names').value.split(',').map((name) => name.trim()).filter((name) => name !== '');
  const wrong = names.find((name) => !SOURCE_NAME.test(name) || name === 'request');
  if (names.length === 0 || wrong !== undefined) {
    sourcesStatus(
      wrong === undefined
        ? 'Name at least one source.'
        : `"${wrong}" is not a source name: a lower-case letter, then up to 31 lower-case letters, digits or _ (and not "request").`,
      'error',
    );
    return;
  }
  const box = $('source-samples');
  box.replaceChildren();
  for (const name of new Set(names)) {
    const label = document.createElement('label');
    label.textContent = `Sample answer of ${name}`;
    const area = document.createElement('textarea');
    area.id = `source-${name}`;
    area.dataset.source = name;
    area.rows = 5;
    area.spellcheck = false;
    area.value = '{}';
    label.append(area);
    box.append(label);
  }
  $('compose-sample').hidden = false;
  sourcesStatus('', '');
});

$('compose-sample').addEventListener('click', () => {
  const document_ = {};
  const outcomes = {};
  for (const area of $('source-samples').querySelectorAll('textarea')) {
    const name = area.dataset.source;
    try {
      document_[name] = JSON.parse(area.value);
    } catch (e) {
      sourcesStatus(`The sample of ${name} is not JSON: ${e.message}`, 'error');
      area.focus();
      return;
    }
    outcomes[name] = { status: 200, outcome: 'ok' };
  }
  document_.request = { query: {}, headers: {}, body: null };
  document_._sources = outcomes;
  sample.area.value = JSON.stringify(document_, null, 2);
  sample.paint();
  preview();
  sourcesStatus(`The sample is now the document of ${Object.keys(outcomes).join(', ')}.`, 'ok');
});

/** Quotes a text for a POSIX shell. */
function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

$('route-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const status = $('copy-status');
  if (syntaxError(rules.area.value)) {
    status.textContent = 'The rules are not valid JSON yet; fix them first.';
    status.className = 'error';
    return;
  }
  const method = $('route-method').value;
  const head = {
    path: $('route-path').value.trim(),
    method,
    originalRoute: {
      originalApi: { baseUrl: $('base-url').value.trim() },
      path: $('upstream-path').value.trim(),
      method,
    },
  };
  const token = $('upstream-token').value.trim();
  if (token) head.authHeader = { type: 'Bearer', token };
  // The caller's request the registration's live call is made as (never stored).
  const sampleQuery = $('sample-query').value.trim().replace(/^\?/, '');
  const sampleBody = $('sample-body').value.trim();
  if (sampleQuery || sampleBody) {
    head.sampleRequest = {};
    if (sampleQuery) head.sampleRequest.query = Object.fromEntries(new URLSearchParams(sampleQuery));
    if (sampleBody) {
      try {
        head.sampleRequest.body = JSON.parse(sampleBody);
      } catch (e) {
        status.textContent = `The sample body is not JSON: ${e.message}`;
        status.className = 'error';
        return;
      }
    }
  }
  // The rules go in as written, so ids keep their order.
  const body = `${JSON.stringify(head).slice(0, -1)},"rulesAsString":${compact(rules.area.value)}}`;
  const shown = pretty(body);
  const registration = $('registration');
  registration.value = shown;
  const admin = $('admin-token').value.trim();
  $('curl').value = [
    `curl -s ${location.origin}/v1/mapping`,
    `  -H 'content-type: application/json'`,
    ...(admin ? [`  -H ${shellQuote(`authorization: Bearer ${admin}`)}`] : []),
    `  -d ${shellQuote(body)}`,
  ].join(' \\\n');
  try {
    await navigator.clipboard.writeText(shown);
    status.textContent = 'Copied. POST it to /v1/mapping, or run the curl command below.';
    status.className = 'ok';
  } catch {
    registration.focus();
    registration.select();
    status.textContent = 'The clipboard is not available here: the body below is selected; copy it from there.';
    status.className = 'error';
  }
});

sample.paint();
rules.paint();
preview();
