// The playground: maps the sample by the rules through `POST /v1/preview?trace=true` as the user
// types, shows the output, the trace, warnings and problems (marked in the text they point
// into), and builds the `POST /v1/mapping` body for the same rules.
'use strict';

const $ = (id) => document.getElementById(id);

/** Milliseconds of quiet typing before the preview is asked for. */
const DEBOUNCE_MS = 150;

// JSON is handled as text wherever it is passed on or shown, not as parsed values: that keeps
// member order (JavaScript objects put integer-like names first), repeated names, and numbers
// beyond what a JavaScript number holds exactly as they were written.

/** One JSON token: a string, a punctuation mark, or a number or literal. */
const TOKEN = /\s*("(?:[^"\\]|\\.)*"|[{}[\],:]|[^\s{}[\],:"]+)/y;

/** The tokens of a valid JSON text, each with its offset. */
function tokens(text) {
  const found = [];
  TOKEN.lastIndex = 0;
  for (let m; (m = TOKEN.exec(text)) !== null; ) {
    found.push({ text: m[1], at: TOKEN.lastIndex - m[1].length });
  }
  return found;
}

/** A valid JSON text indented by two spaces. */
function pretty(text) {
  const list = tokens(text);
  let out = '';
  let depth = 0;
  const newline = () => '\n' + '  '.repeat(depth);
  for (let i = 0; i < list.length; i++) {
    const t = list[i].text;
    if (t === '{' || t === '[') {
      const next = list[i + 1]?.text;
      if (next === '}' || next === ']') {
        out += t + next;
        i++;
      } else {
        depth++;
        out += t + newline();
      }
    } else if (t === '}' || t === ']') {
      depth--;
      out += newline() + t;
    } else if (t === ',') {
      out += ',' + newline();
    } else if (t === ':') {
      out += ': ';
    } else {
      out += t;
    }
  }
  return out;
}

/** A valid JSON text without white space between tokens. */
function compact(text) {
  return tokens(text).map((t) => t.text).join('');
}

/** A member name as a JSON-pointer segment (RFC 6901). */
function pointerSegment(name) {
  return name.replaceAll('~', '~0').replaceAll('/', '~1');
}

/**
 * Where each value of a valid JSON text is, by JSON pointer: the offset of its member name (or
 * of the value itself, for list elements and the root) and the offsets its text starts and
 * ends at. A repeated member name points at its last occurrence, the one a duplicate is
 * reported at.
 */
function places(text) {
  const list = tokens(text);
  const found = new Map();
  let i = 0;
  const value = (pointer, nameAt) => {
    const open = list[i++];
    if (open.text === '{' || open.text === '[') {
      const close = open.text === '{' ? '}' : ']';
      for (let n = 0; list[i].text !== close; n++) {
        if (open.text === '{') {
          const name = list[i];
          i += 2; // The name and the colon.
          value(`${pointer}/${pointerSegment(JSON.parse(name.text))}`, name.at);
        } else {
          value(`${pointer}/${n}`, undefined);
        }
        if (list[i].text === ',') i++;
      }
      i++;
    }
    const last = list[i - 1];
    found.set(pointer, { name: nameAt ?? open.at, start: open.at, end: last.at + last.text.length });
  };
  if (list.length > 0) value('', undefined);
  return found;
}

/** 1-based line and column of an offset. */
function lineColumn(text, offset) {
  const before = text.slice(0, offset);
  const lineStart = before.lastIndexOf('\n') + 1;
  return { line: before.split('\n').length, column: offset - lineStart + 1 };
}

/**
 * Why a text is not JSON, with the offset where it goes wrong, or null when it is JSON. Browsers'
 * own messages do not always say where, so a small checker finds the place.
 */
function syntaxError(text) {
  try {
    JSON.parse(text);
    return null;
  } catch (e) {
    try {
      return checkJson(text) ?? { at: text.length, message: e.message };
    } catch {
      // Nesting too deep for the checker: only the browser's message is left.
      return { at: text.length, message: e.message };
    }
  }
}

const LITERAL = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null/y;

/** Walks a JSON text by RFC 8259 and returns the first problem, or null. */
function checkJson(text) {
  let i = 0;
  const problem = (message) => ({ at: i, message });
  const space = () => {
    while (i < text.length && ' \t\n\r'.includes(text[i])) i++;
  };
  const string = () => {
    i++;
    while (text[i] !== '"') {
      if (i >= text.length) return problem('the string is not closed');
      if (text[i] < ' ') return problem('a control character in a string must be escaped (\\n, \\t, ...)');
      if (text[i] === '\\') {
        i++;
        if (text[i] === 'u') {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 1, i + 5))) return problem('\\u needs four hex digits');
          i += 4;
        } else if (i >= text.length || !'"\\/bfnrt'.includes(text[i])) {
          return problem('unknown escape in a string');
        }
      }
      i++;
    }
    i++;
    return null;
  };
  const value = () => {
    space();
    if (i >= text.length) return problem('the text ends where a value should be');
    const c = text[i];
    if (c === '{' || c === '[') {
      const close = c === '{' ? '}' : ']';
      i++;
      space();
      if (text[i] === close) {
        i++;
        return null;
      }
      for (;;) {
        if (c === '{') {
          space();
          if (text[i] !== '"') return problem('expected a member name in double quotes');
          const bad = string();
          if (bad) return bad;
          space();
          if (text[i] !== ':') return problem("expected ':' after the member name");
          i++;
        }
        const bad = value();
        if (bad) return bad;
        space();
        if (text[i] === ',') {
          i++;
        } else if (text[i] === close) {
          i++;
          return null;
        } else {
          return problem(i >= text.length ? `the text ends before '${close}'` : `expected ',' or '${close}'`);
        }
      }
    }
    if (c === '"') return string();
    LITERAL.lastIndex = i;
    if (LITERAL.test(text)) {
      i = LITERAL.lastIndex;
      return null;
    }
    return problem('expected a value (an object, a list, a string, a number, true, false or null)');
  };
  const bad = value();
  if (bad) return bad;
  space();
  return i < text.length ? problem('unexpected text after the JSON value') : null;
}

/**
 * A text area with a backdrop behind it that marks whole lines, and within them the characters
 * a problem points at; the text area's background is transparent and the backdrop scrolls with
 * it.
 */
class Editor {
  constructor(name) {
    this.area = $(name);
    this.backdrop = $(`${name}-backdrop`);
    this.status = $(`${name}-status`);
    this.marks = new Map();
    this.spots = [];
    this.area.addEventListener('scroll', () => this.follow());
    this.area.addEventListener('input', () => {
      // The text changed under them: the characters a spot pointed at may be elsewhere now.
      this.spots = [];
      this.paint();
    });
    new ResizeObserver(() => this.follow()).observe(this.area);
  }

  /**
   * Marks lines: a map from 1-based line number to 'error' or 'warning'; and spots, `{start,
   * end}` offsets of the text on one line, marked within their line.
   */
  mark(marks, spots = []) {
    this.marks = marks;
    this.spots = spots;
    this.paint();
  }

  paint() {
    // Without marks there is nothing to show behind the text, and a large sample is not copied.
    if (this.marks.size === 0 && this.spots.length === 0) {
      this.backdrop.replaceChildren();
      return;
    }
    const lines = this.area.value.split('\n');
    let lineStart = 0;
    const spans = lines.map((line, n) => {
      const span = document.createElement('span');
      const spots = this.spots
        .filter((s) => s.start >= lineStart && s.end <= lineStart + line.length && s.end > s.start)
        .sort((a, b) => a.start - b.start);
      let from = 0;
      for (const spot of spots) {
        const start = spot.start - lineStart;
        if (start < from) continue;
        const marked = document.createElement('mark');
        marked.textContent = line.slice(start, spot.end - lineStart);
        marked.dataset.start = spot.start;
        marked.dataset.end = spot.end;
        span.append(line.slice(from, start), marked);
        from = spot.end - lineStart;
      }
      span.append(line.slice(from) || (from === 0 ? ' ' : ''));
      const mark = this.marks.get(n + 1);
      if (mark) {
        span.className = `mark-${mark}`;
        span.dataset.line = n + 1;
      }
      lineStart += line.length + 1;
      return span;
    });
    this.backdrop.replaceChildren(...spans);
    this.follow();
  }

  follow() {
    this.backdrop.scrollTop = this.area.scrollTop;
    this.backdrop.scrollLeft = this.area.scrollLeft;
  }

  /** Puts the caret on a line and selects it, so it is in view and a screen reader reads it. */
  select(line) {
    const text = this.area.value;
    let start = 0;
    for (let n = 1; n < line; n++) start = text.indexOf('\n', start) + 1;
    const end = text.indexOf('\n', start);
    this.selectRange(start, end === -1 ? text.length : end);
  }

  /** Selects the text from offset `start` to `end`. */
  selectRange(start, end) {
    this.area.focus();
    this.area.setSelectionRange(start, end);
  }

  /** Shows whether the text is JSON; returns the problem, or null. */
  check() {
    const error = syntaxError(this.area.value);
    if (error) {
      const { line, column } = lineColumn(this.area.value, error.at);
      this.status.textContent = `Not valid JSON at line ${line}, column ${column}: ${error.message}`;
      this.status.className = 'status error';
      this.mark(new Map([[line, 'error']]));
    } else {
      this.status.textContent = '';
      this.status.className = 'status';
      // Marks from an earlier answer may sit on lines that have moved since.
      this.mark(new Map());
    }
    return error;
  }
}

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
  listProblems($('warnings'), answer.warnings, 'warning', marks, spots);
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
  listProblems($('errors'), Array.isArray(problem.errors) ? problem.errors : [], 'error', marks, spots);
  rules.mark(marks, spots);
}

/**
 * Lists `{location, message}` items; each location that is in the rules text gets a button that
 * selects its line, and the line is marked as `kind`. An expression's problem at a character
 * (`at character N: ...`) selects that character, which is added to `spots`.
 */
function listProblems(list, problems, kind, marks, spots) {
  const text = rules.area.value;
  const at = places(text);
  list.replaceChildren(
    ...problems.map((p) => {
      const item = document.createElement('li');
      item.className = `item-${kind}`;
      const location = document.createElement('code');
      location.className = 'location';
      location.textContent = p.location === '' ? '(the whole document)' : p.location;
      item.append(location, ' ', p.message);
      const line = lineOf(at, text, p.location);
      if (line !== null) {
        if (marks.get(line) !== 'error') marks.set(line, kind);
        const spot = expressionSpot(at, text, p);
        const go = document.createElement('button');
        go.type = 'button';
        go.className = 'line';
        if (spot) {
          spots.push(spot);
          const { line: spotLine, column } = lineColumn(text, spot.start);
          go.textContent = `line ${spotLine}, column ${column}`;
          go.setAttribute('aria-label', `Select the expression's character at line ${spotLine}, column ${column} of the rules`);
          go.addEventListener('click', () => rules.selectRange(spot.start, spot.end));
        } else {
          go.textContent = `line ${line}`;
          go.setAttribute('aria-label', `Select line ${line} of the rules`);
          go.addEventListener('click', () => rules.select(line));
        }
        item.append(' ', go);
      }
      return item;
    }),
  );
}

/** How an expression's problem names its place: characters counted from the expression's start. */
const AT_CHARACTER = /^at character (\d+): /;

/**
 * Where in the rules text an expression's problem points, as `{start, end}` offsets: the
 * character it names within the expression's JSON string (an escape sequence is one character,
 * as is a pair of surrogates), or the closing quote when it names the end. `null` for any other
 * problem.
 */
function expressionSpot(at, text, problem) {
  const found = AT_CHARACTER.exec(problem.message);
  if (!found || !/(^|\/)(expr|each)$/.test(problem.location)) return null;
  const place = at.get(problem.location);
  if (!place || text[place.start] !== '"') return null;
  let wanted = Number(found[1]);
  let i = place.start + 1;
  const close = place.end - 1;
  while (i < close) {
    const length = characterLength(text, i);
    if (wanted === 0) return { start: i, end: i + length };
    wanted--;
    i += length;
  }
  return wanted === 0 ? { start: close, end: close + 1 } : null;
}

/** Code units of the character that starts at `i` of a JSON string's text. */
function characterLength(text, i) {
  const high = (unit) => unit >= 0xd800 && unit <= 0xdbff;
  const low = (unit) => unit >= 0xdc00 && unit <= 0xdfff;
  if (text[i] !== '\\') return high(text.charCodeAt(i)) && low(text.charCodeAt(i + 1)) ? 2 : 1;
  if (text[i + 1] !== 'u') return 2;
  const unit = parseInt(text.slice(i + 2, i + 6), 16);
  const next = text.slice(i + 6, i + 8) === '\\u' ? parseInt(text.slice(i + 8, i + 12), 16) : NaN;
  return high(unit) && low(next) ? 12 : 6;
}

/**
 * The line of the rules text where a JSON pointer's member is; a member that is missing (such as
 * a required `key`) is shown at the nearest member around it that is there.
 */
function lineOf(at, text, pointer) {
  if (typeof pointer !== 'string') return null;
  for (let p = pointer; ; p = p.slice(0, Math.max(0, p.lastIndexOf('/')))) {
    const place = at.get(p);
    if (place) return lineColumn(text, place.name).line;
    if (p === '') return null;
  }
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
