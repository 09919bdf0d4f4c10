// A realistic pgx v4 session through the lsngate proxy (or, as the control, straight against
// PostgreSQL): the statement cache with evictions (capacity 4, and the default 512 overflowed,
// so pgx sends `deallocate lrupsc_N_M`), batches (SendBatch), CopyFrom, pgxpool with several
// goroutines, a context cancel and a CancelRequest of a long pg_sleep, LISTEN/NOTIFY, and
// read-after-write checks that count how many reads a replica served. Every step runs on
// connections of its own, so one failure does not hide the next; the program prints one line
// per step and a summary, and exits 1 when any step failed.
//
// Usage: pgx_session URL TABLE NODE_URL... (libpq URLs; the nodes are every server behind URL,
// asked directly whether the cancelled statement runs). Built by tests/proxy/drivers.rs in
// GOPATH mode against Debian's golang-github-jackc-pgx-v4-dev (no module download).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

var (
	baseURL string
	table   string
	nodes   []string
	steps   int
	failed  []string

	countsMu     sync.Mutex
	reads        int
	replicaReads int
)

// querier is what *pgx.Conn, *pgxpool.Conn and pgx.Tx have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...interface{}) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: pgx_session URL TABLE NODE_URL... (libpq URLs; the nodes are asked directly whether the cancelled statement runs)")
		os.Exit(2)
	}
	baseURL = withParams(os.Args[1], "application_name=pgx-session&connect_timeout=10")
	table = os.Args[2]
	nodes = os.Args[3:]

	step("setup", setup)
	step("read_after_write", readAfterWrite)
	step("statement_cache_capacity=4 with evictions", smallStatementCache)
	step("default statement cache (512) overflowed", defaultStatementCache)
	step("SendBatch", batches)
	step("CopyFrom", copyFrom)
	step("pgxpool, 8 goroutines", pool)
	step("context cancel of pg_sleep", contextCancel)
	step("CancelRequest of pg_sleep", cancelRequest)
	step("LISTEN/NOTIFY", listenNotify)

	counts := fmt.Sprintf("reads=%d replica=%d", reads, replicaReads)
	if len(failed) == 0 {
		fmt.Printf("OK pgx v4: %d steps, %s\n", steps, counts)
		return
	}
	fmt.Printf("FAILED pgx v4: %d of %d steps: %s (%s)\n", len(failed), steps, strings.Join(failed, "; "), counts)
	os.Exit(1)
}

func step(name string, body func(ctx context.Context) error) {
	steps++
	// A bound on every step: nothing here may hang the run.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := body(ctx); err != nil {
		failed = append(failed, name)
		fmt.Printf("FAIL %s: %v\n", name, err)
	} else {
		fmt.Printf("ok   %s\n", name)
	}
}

func withParams(url, params string) string {
	if strings.Contains(url, "?") {
		return url + "&" + params
	}
	return url + "?" + params
}

func connect(ctx context.Context, params string) (*pgx.Conn, error) {
	url := baseURL
	if params != "" {
		url = withParams(url, params)
	}
	return pgx.Connect(ctx, url)
}

// readBack selects row id on q (the read-after-write check) and counts who served it.
func readBack(ctx context.Context, q querier, id int, note string) error {
	var got string
	var onReplica bool
	err := q.QueryRow(ctx, "SELECT note, pg_is_in_recovery() FROM "+table+" WHERE id = $1", id).Scan(&got, &onReplica)
	countsMu.Lock()
	defer countsMu.Unlock()
	if errors.Is(err, pgx.ErrNoRows) {
		reads++
		return fmt.Errorf("row %d written on this connection was not read back (stale read)", id)
	}
	if err != nil {
		return fmt.Errorf("read back row %d: %w", id, err)
	}
	reads++
	if onReplica {
		replicaReads++
	}
	if got != note {
		return fmt.Errorf("row %d: note %q, wrote %q", id, got, note)
	}
	return nil
}

func insert(ctx context.Context, q querier, id int, note string) error {
	if _, err := q.Exec(ctx, "INSERT INTO "+table+" (id, note) VALUES ($1, $2)", id, note); err != nil {
		return fmt.Errorf("insert %d: %w", id, err)
	}
	return nil
}

func count(ctx context.Context, q querier, from, to int) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id BETWEEN $1 AND $2", from, to).Scan(&n)
	return n, err
}

func setup(ctx context.Context) error {
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, note text)")
	return err
}

func readAfterWrite(ctx context.Context) error {
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for id := 1; id <= 40; id++ {
		note := fmt.Sprintf("raw%d", id)
		if err := insert(ctx, conn, id, note); err != nil {
			return err
		}
		if err := readBack(ctx, conn, id, note); err != nil {
			return err
		}
	}
	return nil
}

// smallStatementCache: six distinct statements per round through a cache of four, so every
// round evicts and pgx deallocates (`deallocate lrupsc_N_M`, a simple query) and re-prepares.
func smallStatementCache(ctx context.Context) error {
	conn, err := connect(ctx, "statement_cache_capacity=4")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if got := conn.StatementCache().Cap(); got != 4 {
		return fmt.Errorf("statement cache capacity %d, asked for 4", got)
	}
	selects := []string{
		"SELECT count(*) FROM " + table + " WHERE id >= $1 AND id < 200",
		"SELECT count(*) FROM " + table + " WHERE id > $1 AND id < 200",
		"SELECT count(*) FROM " + table + " WHERE id >= $1 AND id < 200 AND note IS NOT NULL",
		"SELECT count(*) FROM " + table + " WHERE id > $1 AND id < 200 AND note IS NOT NULL",
	}
	for round := 0; round < 10; round++ {
		id := 100 + round
		note := fmt.Sprintf("cache%d", id)
		if err := insert(ctx, conn, id, note); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if err := readBack(ctx, conn, id, note); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		for q, sql := range selects {
			var n int64
			if err := conn.QueryRow(ctx, sql, 100).Scan(&n); err != nil {
				return fmt.Errorf("round %d statement %d: %w", round, q, err)
			}
			expected := int64(round + 1)
			if q%2 == 1 {
				expected = int64(round)
			}
			if n != expected {
				return fmt.Errorf("round %d statement %d: %d rows, expected %d", round, q, n, expected)
			}
		}
		if got := conn.StatementCache().Len(); got > 4 {
			return fmt.Errorf("round %d: %d statements cached, capacity 4", round, got)
		}
	}
	return nil
}

// defaultStatementCache: 530 distinct statements through the default cache of 512, then the
// first 20 again (evicted, so deallocated and prepared anew).
func defaultStatementCache(ctx context.Context) error {
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if got := conn.StatementCache().Cap(); got != 512 {
		return fmt.Errorf("default statement cache capacity %d, expected 512", got)
	}
	run := func(k int) error {
		var n int
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d", k), 1).Scan(&n); err != nil {
			return fmt.Errorf("statement %d: %w", k, err)
		}
		if n != 1+k {
			return fmt.Errorf("statement %d returned %d", k, n)
		}
		return nil
	}
	for k := 0; k < 530; k++ {
		if err := run(k); err != nil {
			return err
		}
	}
	for k := 0; k < 20; k++ {
		if err := run(k); err != nil {
			return fmt.Errorf("again: %w", err)
		}
	}
	if got := conn.StatementCache().Len(); got != 512 {
		return fmt.Errorf("%d statements cached, expected a full cache of 512", got)
	}
	return nil
}

// batches: a batch of writes and reads (one Sync, one implicit transaction), the same in an
// explicit transaction, and a batch of reads only.
func batches(ctx context.Context) error {
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	batch := &pgx.Batch{}
	for id := 1000; id < 1020; id++ {
		batch.Queue("INSERT INTO "+table+" (id, note) VALUES ($1, $2)", id, fmt.Sprintf("batch%d", id))
	}
	batch.Queue("SELECT count(*) FROM "+table+" WHERE id BETWEEN $1 AND $2", 1000, 1019)
	batch.Queue("UPDATE "+table+" SET note = note || '!' WHERE id BETWEEN $1 AND $2", 1000, 1009)
	batch.Queue("SELECT note FROM "+table+" WHERE id = $1", 1000)
	results := conn.SendBatch(ctx, batch)
	for id := 1000; id < 1020; id++ {
		if _, err := results.Exec(); err != nil {
			results.Close()
			return fmt.Errorf("batched insert %d: %w", id, err)
		}
	}
	var n int64
	if err := results.QueryRow().Scan(&n); err != nil || n != 20 {
		results.Close()
		return fmt.Errorf("batched count: %d rows (expected 20), %v", n, err)
	}
	tag, err := results.Exec()
	if err != nil || tag.RowsAffected() != 10 {
		results.Close()
		return fmt.Errorf("batched update: %v rows, %v", tag, err)
	}
	var note string
	if err := results.QueryRow().Scan(&note); err != nil || note != "batch1000!" {
		results.Close()
		return fmt.Errorf("batched select: %q, %v", note, err)
	}
	if err := results.Close(); err != nil {
		return fmt.Errorf("closing the batch: %w", err)
	}
	if err := readBack(ctx, conn, 1019, "batch1019"); err != nil {
		return err
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	batch = &pgx.Batch{}
	for id := 1100; id < 1110; id++ {
		batch.Queue("INSERT INTO "+table+" (id, note) VALUES ($1, $2)", id, fmt.Sprintf("txbatch%d", id))
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		tx.Rollback(ctx)
		return fmt.Errorf("batch in a transaction: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit of the batch: %w", err)
	}

	batch = &pgx.Batch{}
	for _, id := range []int{1000, 1019, 1100, 1109} {
		batch.Queue("SELECT note, pg_is_in_recovery() FROM "+table+" WHERE id = $1", id)
	}
	results = conn.SendBatch(ctx, batch)
	for _, id := range []int{1000, 1019, 1100, 1109} {
		var onReplica bool
		err := results.QueryRow().Scan(&note, &onReplica)
		countsMu.Lock()
		reads++
		if err == nil && onReplica {
			replicaReads++
		}
		countsMu.Unlock()
		if err != nil {
			results.Close()
			return fmt.Errorf("read-only batch, row %d (written on this connection): %w", id, err)
		}
	}
	return results.Close()
}

func copyFrom(ctx context.Context) error {
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows := make([][]interface{}, 0, 500)
	for id := 2000; id < 2500; id++ {
		rows = append(rows, []interface{}{id, fmt.Sprintf("copy%d", id)})
	}
	n, err := conn.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "note"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("CopyFrom: %w", err)
	}
	if n != 500 {
		return fmt.Errorf("CopyFrom reported %d rows of 500", n)
	}
	if got, err := count(ctx, conn, 2000, 2499); err != nil || got != 500 {
		return fmt.Errorf("rows after CopyFrom: %d of 500, %v", got, err)
	}
	if err := readBack(ctx, conn, 2499, "copy2499"); err != nil {
		return err
	}
	// CopyFrom inside a transaction, then a read of it in the same transaction.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "note"},
		pgx.CopyFromRows([][]interface{}{{2500, "copy2500"}, {2501, "copy2501"}})); err != nil {
		return fmt.Errorf("CopyFrom in a transaction: %w", err)
	}
	if err := readBack(ctx, tx, 2501, "copy2501"); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// pool: 8 goroutines on a pool of 4 connections; each holds a connection for an insert and the
// read of it (read-your-writes holds per connection), runs a transaction, and plain pool reads.
func pool(ctx context.Context) error {
	p, err := pgxpool.Connect(ctx, withParams(baseURL, "pool_max_conns=4"))
	if err != nil {
		return err
	}
	defer p.Close()
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			errs <- poolWorker(ctx, p, g)
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	// Read-your-writes holds per connection; this count reads rows other pool connections wrote,
	// so it runs in a transaction (a proxy serves transactions on the primary).
	var n int64
	err = p.BeginFunc(ctx, func(tx pgx.Tx) error {
		var err error
		n, err = count(ctx, tx, 3000, 3999)
		return err
	})
	if err != nil || n != 8*21 {
		return fmt.Errorf("rows written by the pool: %d of %d, %v", n, 8*21, err)
	}
	return nil
}

func poolWorker(ctx context.Context, p *pgxpool.Pool, g int) error {
	for i := 0; i < 20; i++ {
		id := 3000 + g*100 + i
		note := fmt.Sprintf("pool%d", id)
		conn, err := p.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("goroutine %d: acquire: %w", g, err)
		}
		err = insert(ctx, conn, id, note)
		if err == nil {
			err = readBack(ctx, conn, id, note)
		}
		conn.Release()
		if err != nil {
			return fmt.Errorf("goroutine %d: %w", g, err)
		}
		var one int
		if err := p.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
			return fmt.Errorf("goroutine %d: pool read: %d, %v", g, one, err)
		}
	}
	id := 3000 + g*100 + 99
	err := p.BeginFunc(ctx, func(tx pgx.Tx) error {
		if err := insert(ctx, tx, id, "pooltx"); err != nil {
			return err
		}
		return readBack(ctx, tx, id, "pooltx")
	})
	if err != nil {
		return fmt.Errorf("goroutine %d: transaction: %w", g, err)
	}
	return nil
}

// awaitOnNodes waits (at most 20 s) until a statement containing marker runs on some node
// (running) or on none, asking every node directly.
func awaitOnNodes(ctx context.Context, marker string, running bool) error {
	const sql = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0"
	for i := 0; i < 200; i++ {
		var active int64
		for _, node := range nodes {
			conn, err := pgx.Connect(ctx, node)
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			var n int64
			err = conn.QueryRow(ctx, sql, marker).Scan(&n)
			conn.Close(ctx)
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			active += n
		}
		if (active > 0) == running {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if running {
		return fmt.Errorf("the statement %s was not seen running on any node within 20 s", marker)
	}
	return fmt.Errorf("the statement %s still runs on a node 20 s after its cancel", marker)
}

// contextCancel: the context of a 60 s pg_sleep is cancelled once the sleep runs on a server;
// pgx returns at once, closes the connection and sends a CancelRequest, which must stop the
// sleep on the server.
func contextCancel(ctx context.Context) error {
	marker := "pgx-ctx-cancel-" + table
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	sleepCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan error, 1)
	go func() {
		err := awaitOnNodes(ctx, marker, true)
		cancel()
		watched <- err
	}()
	_, err = conn.Exec(sleepCtx, "SELECT pg_sleep(60), '"+marker+"'")
	if werr := <-watched; werr != nil {
		return werr
	}
	if err == nil {
		return errors.New("pg_sleep(60) finished: the context cancel did not stop it")
	}
	if !errors.Is(err, context.Canceled) {
		return fmt.Errorf("expected context.Canceled, got %w", err)
	}
	if !conn.IsClosed() {
		return errors.New("pgx kept the connection of a cancelled query open")
	}
	return awaitOnNodes(ctx, marker, false)
}

// cancelRequest: a CancelRequest on the same connection while a pg_sleep runs: the server ends
// the statement with 57014 and the connection goes on.
func cancelRequest(ctx context.Context) error {
	marker := "pgx-cancel-request-" + table
	conn, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	watched := make(chan error, 1)
	go func() {
		err := awaitOnNodes(ctx, marker, true)
		if err == nil {
			err = conn.PgConn().CancelRequest(ctx)
		}
		watched <- err
	}()
	var slept string
	err = conn.QueryRow(ctx, "SELECT pg_sleep($1)::text || '"+marker+"'", 60.0).Scan(&slept)
	if werr := <-watched; werr != nil {
		return werr
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		return fmt.Errorf("expected SQLSTATE 57014, got %v", err)
	}
	var alive string
	if err := conn.QueryRow(ctx, "SELECT 'alive'").Scan(&alive); err != nil || alive != "alive" {
		return fmt.Errorf("connection after the cancel: %q, %v", alive, err)
	}
	return nil
}

func listenNotify(ctx context.Context) error {
	channel := table + "_channel"
	listener, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer listener.Close(ctx)
	sender, err := connect(ctx, "")
	if err != nil {
		return err
	}
	defer sender.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+channel); err != nil {
		return err
	}
	if _, err := sender.Exec(ctx, "SELECT pg_notify($1, $2)", channel, "from pgx"); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(waitCtx)
	if err != nil {
		return fmt.Errorf("no notification within 10 s: %w", err)
	}
	if n.Channel != channel || n.Payload != "from pgx" {
		return fmt.Errorf("notification %q on %q", n.Payload, n.Channel)
	}
	return nil
}
