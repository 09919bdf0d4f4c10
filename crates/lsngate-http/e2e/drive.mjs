// Drives the lsngate demo in Debian's headless Chromium through playwright-core, like a person:
// edit form → Save (POST) → 303 → the item page (GET), then create → redirect → the new item.
// Prints one JSON line with what the pages showed; the Rust test decides pass or fail.
//
// usage: node drive.mjs <base-url> <mode: fixed|naive> <cycles> [screenshot-dir]
//        (with a screenshot dir: item.png of the last item page and requests.png of the log)
//        node drive.mjs <base-url> showcase <cycles> <screenshot-dir>
//        (the README picture: <cycles> fixed saves, then <cycles> naive ones, then the log)
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [base, mode, cyclesText, shots] = process.argv.slice(2);
const cycles = Number(cyclesText);
if (!base || !['fixed', 'naive', 'showcase'].includes(mode) || !(cycles > 0)) {
  console.error('usage: node drive.mjs <base-url> <fixed|naive> <cycles> [screenshot-dir]');
  process.exit(2);
}

const profile = mkdtempSync(join(tmpdir(), 'lsngate-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1100, height: 900 },
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
const result = { mode, cycles, edits: [], creates: [] };
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  page.setDefaultTimeout(20000);
  if (mode === 'showcase') {
    await showcase(page);
  } else {
    await run(page);
  }
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(result));

async function run(page) {
  await page.goto(`${base}/mode?set=${mode}`);
  // Create: form POST → 303 → the new item's page, which must exist.
  for (let i = 0; i < Math.min(cycles, 10); i++) {
    const title = `${mode}-item-${i}-${Date.now()}`;
    await page.goto(`${base}/`);
    await page.fill('#new-title', title);
    await Promise.all([page.waitForURL(/\/items\/\d+$/), page.click('#create')]);
    result.creates.push(await shown(page, 'title', title));
  }
  // Edit: 50 save → redirect → read cycles on one item.
  const item = page.url();
  // Without the token the new item may not be visible yet: reload until it is (that wait is
  // exactly what the token makes unnecessary).
  for (let i = 0; i < 100 && (await page.locator('body').getAttribute('data-status')) !== 'found'; i++) {
    await page.waitForTimeout(100);
    await page.goto(item);
  }
  for (let i = 0; i < cycles; i++) {
    const value = `value ${i} ${Math.random().toString(36).slice(2, 8)}`;
    await page.fill('#value-input', value);
    await Promise.all([page.waitForURL(item), page.click('#save')]);
    result.edits.push(await shown(page, 'value', value));
  }
  if (shots) {
    await page.screenshot({ path: join(shots, 'item.png') });
    await page.goto(`${base}/requests`);
    await page.screenshot({ path: join(shots, 'requests.png') });
  }
}

// One item, saved `cycles` times naive then `cycles` times fixed: the log shows both side by side.
async function showcase(page) {
  await page.goto(`${base}/`);
  await page.fill('#new-title', `showcase-${Date.now()}`);
  await Promise.all([page.waitForURL(/\/items\/\d+$/), page.click('#create')]);
  const item = page.url();
  for (const phase of ['fixed', 'naive']) {
    await page.goto(`${base}/mode?set=${phase}`);
    await page.goto(item);
    for (let i = 0; i < 100 && (await page.locator('body').getAttribute('data-status')) !== 'found'; i++) {
      await page.waitForTimeout(100);
      await page.goto(item);
    }
    for (let i = 0; i < cycles; i++) {
      await page.fill('#value-input', `${phase} save ${i}`);
      await Promise.all([page.waitForURL(item), page.click('#save')]);
      result.edits.push(await shown(page, 'value', `${phase} save ${i}`));
    }
  }
  await page.goto(`${base}/requests`);
  await page.screenshot({ path: join(shots, 'showcase.png'), clip: { x: 0, y: 0, width: 1100, height: 620 } });
}

// What the item page showed after the redirect, beside what it should have shown.
async function shown(page, field, expected) {
  const status = await page.locator('body').getAttribute('data-status');
  const seen = status === 'found'
    ? (await page.locator(`#${field}`).textContent()).trim()
    : null;
  const served = (await page.locator('#served-by').textContent()).trim();
  const wait_ms = parseFloat(await page.locator('#wait').textContent());
  return { expected, status, seen, served, wait_ms, fresh: seen === expected };
}
