// What the browser tests share: checks that fail with what was found, waiting for the page, the
// headless Chromium they drive, and how a run ends (its verdict, failure.png, the cleanup).

import { join } from 'node:path';

import { chromium } from 'playwright-core';

/** How long one check waits for the page. */
export const WAIT_MS = 10_000;

export class Failed extends Error {}

export function check(condition, what, found) {
  if (!condition) {
    throw new Failed(found === undefined ? what : `${what}\n  found: ${found}`);
  }
}

/** Waits until `read()` gives something `accept` takes; fails with the last reading. */
export async function waitFor(what, read, accept) {
  const deadline = Date.now() + WAIT_MS;
  let last;
  for (;;) {
    last = await read();
    if (accept(last)) return last;
    if (Date.now() > deadline) throw new Failed(`${what}\n  found: ${JSON.stringify(last)}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The system's Chromium, headless, on its own profile in `profile`, 1280×900, light. */
export async function launch(profile) {
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1280, height: 900 },
    colorScheme: 'light',
  });
  const page = context.pages()[0] ?? (await context.newPage());
  return { context, page };
}

/** Collects into `problems` what must not happen in a page: an uncaught error, a console
 * error (but for the failed loads of error answers, which are expected), a request to an
 * origin other than `origins`. */
export function watch(page, origins, problems) {
  page.on('request', (request) => {
    const url = request.url();
    if (!origins.some((origin) => url.startsWith(origin)) && !url.startsWith('data:')) {
      problems.push(`the page asked another origin: ${url}`);
    }
  });
  page.on('pageerror', (error) => problems.push(`uncaught error in the page: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) {
      problems.push(`console error: ${message.text()}`);
    }
  });
}

/** Runs `run`, prints the verdict of the test `name`, saves failure.png in `artifacts` on a
 * failure, runs `cleanup`, and exits 0 or 1. `state()` gives the step reached, the page (if
 * any) and the page's problems so far. */
export async function finish(name, artifacts, run, state, cleanup) {
  const started = Date.now();
  let failed = false;
  try {
    await run();
    console.log(`${name}: all checks passed in ${((Date.now() - started) / 1000).toFixed(1)} s; screenshots in ${artifacts}`);
  } catch (error) {
    failed = true;
    const { step, page, problems } = state();
    const why = error instanceof Failed ? error.message : error.stack;
    console.error(`${name}: FAILED at "${step}": ${why}`);
    if (problems.length > 0) console.error(`page problems so far:\n  ${problems.join('\n  ')}`);
    if (page) await page.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => {});
  } finally {
    await cleanup();
  }
  process.exit(failed ? 1 : 0);
}
