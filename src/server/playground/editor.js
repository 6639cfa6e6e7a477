// The rules editor the playground and the console share: JSON handled as text (tokens, pretty
// printing, the place of each JSON pointer, where a text stops being JSON), a text area that
// marks the lines and characters problems point at, and the list of problems that selects them.

const $ = (id) => document.getElementById(id);
// JSON is handled as text wherever it is passed on or shown, not as parsed values: that keeps
// member order (JavaScript objects put integer-like names first), repeated names, and numbers
// beyond what a JavaScript number holds exactly as they were written.

/** One JSON token: a string, a punctuation mark, or a number or literal. */
const TOKEN = /\s*("(?:[^"\\]|\\.)*"|[{}[\],:]|[^\s{}[\],:"]+)/y;

/** The tokens of a valid JSON text, each with its offset. */
export function tokens(text) {
  const found = [];
  TOKEN.lastIndex = 0;
  for (let m; (m = TOKEN.exec(text)) !== null; ) {
    found.push({ text: m[1], at: TOKEN.lastIndex - m[1].length });
  }
  return found;
}

/** A valid JSON text indented by two spaces. A list of strings, numbers and literals that fits
 * in `inline` characters stays on one line (`["idMeal"]`, as rules are written by hand). */
export function pretty(text, inline = 0) {
  const list = tokens(text);
  let out = '';
  let depth = 0;
  const newline = () => '\n' + '  '.repeat(depth);
  /** The list opening at token `i` on one line, and the index of its `]`, when it fits. */
  const oneLine = (i) => {
    let line = '[';
    for (let j = i + 1; j < list.length && line.length < inline; j++) {
      const t = list[j].text;
      if (t === ']') return { line: `${line}]`, end: j };
      if (t === '{' || t === '[') return null;
      line += t === ',' ? ', ' : t;
    }
    return null;
  };
  for (let i = 0; i < list.length; i++) {
    const t = list[i].text;
    const short = t === '[' && inline > 0 ? oneLine(i) : null;
    if (short) {
      out += short.line;
      i = short.end;
    } else if (t === '{' || t === '[') {
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
export function compact(text) {
  return tokens(text).map((t) => t.text).join('');
}

/** A member name as a JSON-pointer segment (RFC 6901). */
export function pointerSegment(name) {
  return name.replaceAll('~', '~0').replaceAll('/', '~1');
}

/**
 * Where each value of a valid JSON text is, by JSON pointer: the offset of its member name (or
 * of the value itself, for list elements and the root) and the offsets its text starts and
 * ends at. A repeated member name points at its last occurrence, the one a duplicate is
 * reported at.
 */
export function places(text) {
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
export function lineColumn(text, offset) {
  const before = text.slice(0, offset);
  const lineStart = before.lastIndexOf('\n') + 1;
  return { line: before.split('\n').length, column: offset - lineStart + 1 };
}

/**
 * Why a text is not JSON, with the offset where it goes wrong, or null when it is JSON. Browsers'
 * own messages do not always say where, so a small checker finds the place.
 */
export function syntaxError(text) {
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
export class Editor {
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
    this.reveal(start);
  }

  /** Scrolls the text area so that the line holding offset `at` is in view (a browser does not
   * always scroll to a selection it is given). */
  reveal(at) {
    const { line } = lineColumn(this.area.value, at);
    // The backdrop lays the lines out as the text area does, wrapped lines included.
    const span = this.backdrop.children[line - 1];
    const top = span ? span.offsetTop : (line - 1) * parseFloat(getComputedStyle(this.area).lineHeight);
    const height = this.area.clientHeight;
    if (top < this.area.scrollTop || top > this.area.scrollTop + height * 0.8) {
      this.area.scrollTop = Math.max(0, top - height / 3);
    }
    this.follow();
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

/**
 * Lists `{location, message}` items; each location that is in the rules text of `editor` (below
 * `prefix`, when the locations are in a body the rules are part of) gets a button that selects its
 * line, and the line is marked as `kind`. An expression's problem at a character
 * (`at character N: ...`) selects that character, which is added to `spots`.
 */
export function listProblems(editor, list, problems, kind, marks, spots, prefix = '') {
  const text = editor.area.value;
  const at = places(text);
  list.replaceChildren(
    ...problems.map((p) => {
      const item = document.createElement('li');
      item.className = `item-${kind}`;
      const location = document.createElement('code');
      location.className = 'location';
      location.textContent = p.location === '' ? '(the whole document)' : p.location;
      item.append(location, ' ', p.message);
      const inRules = p.location === prefix || p.location.startsWith(`${prefix}/`);
      const pointer = inRules ? p.location.slice(prefix.length) : null;
      const line = pointer === null ? null : lineOf(at, text, pointer);
      if (line !== null) {
        if (marks.get(line) !== 'error') marks.set(line, kind);
        const spot = expressionSpot(at, text, { location: pointer, message: p.message });
        const go = document.createElement('button');
        go.type = 'button';
        go.className = 'line';
        if (spot) {
          spots.push(spot);
          const { line: spotLine, column } = lineColumn(text, spot.start);
          go.textContent = `line ${spotLine}, column ${column}`;
          go.setAttribute('aria-label', `Select the expression's character at line ${spotLine}, column ${column} of the rules`);
          go.addEventListener('click', () => editor.selectRange(spot.start, spot.end));
        } else {
          go.textContent = `line ${line}`;
          go.setAttribute('aria-label', `Select line ${line} of the rules`);
          go.addEventListener('click', () => editor.select(line));
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
export function lineOf(at, text, pointer) {
  if (typeof pointer !== 'string') return null;
  for (let p = pointer; ; p = p.slice(0, Math.max(0, p.lastIndexOf('/')))) {
    const place = at.get(p);
    if (place) return lineColumn(text, place.name).line;
    if (p === '') return null;
  }
}
