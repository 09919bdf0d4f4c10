// Scripted node-postgres session through the lsngate proxy: DDL, insert, named prepared
// statements, a transaction, COPY in/out (pg-copy-streams), an error and recovery.
// Usage: node node_session.js URL TABLE. Prints OK and exits 0 on success.
const { Client } = require('pg');
const { from: copyFrom, to: copyTo } = require('pg-copy-streams');
const { pipeline } = require('stream/promises');
const { Readable, Writable } = require('stream');
const assert = require('assert');

const [url, t] = process.argv.slice(2);
const PRIMARY = '/* lsngate:route=primary */ ';

(async () => {
  const c = new Client({ connectionString: url });
  await c.connect();
  await c.query(`CREATE TABLE ${t} (id int PRIMARY KEY, note text)`);
  await c.query(`INSERT INTO ${t} VALUES ($1, $2)`, [1, 'one']);
  for (let i = 2; i < 7; i++) {
    await c.query({ name: 'insert_note', text: `INSERT INTO ${t} VALUES ($1, $2)`, values: [i, `n${i}`] });
  }
  await c.query('BEGIN');
  await c.query(`UPDATE ${t} SET note = 'updated' WHERE id = 1`);
  const inside = await c.query(`SELECT note FROM ${t} WHERE id = 1`);
  assert.strictEqual(inside.rows[0].note, 'updated');
  await c.query('COMMIT');
  await pipeline(Readable.from(['100\tcopied\n', '101\tcopied\n']), c.query(copyFrom(`COPY ${t} FROM STDIN`)));
  try {
    await c.query(`INSERT INTO ${t} VALUES (1, 'duplicate')`);
    throw new Error('duplicate insert did not fail');
  } catch (e) {
    if (e.code !== '23505') throw e;
  }
  const count = await c.query(PRIMARY + `SELECT count(*)::int AS n FROM ${t}`);
  assert.strictEqual(count.rows[0].n, 8);
  let copied = '';
  await pipeline(c.query(copyTo(PRIMARY + `COPY (SELECT id FROM ${t} ORDER BY id) TO STDOUT`)),
    new Writable({ write(chunk, _enc, cb) { copied += chunk; cb(); } }));
  assert.strictEqual(copied.split('\n')[0], '1');
  for (let i = 0; i < 5; i++) {
    const r = await c.query({ name: 'replica_check', text: 'SELECT pg_is_in_recovery() AS r, $1::int AS i', values: [i] });
    assert.strictEqual(r.rows[0].r, true);
  }
  await c.end();
  console.log('OK node-postgres');
})().catch((e) => { console.error(e); process.exit(1); });
