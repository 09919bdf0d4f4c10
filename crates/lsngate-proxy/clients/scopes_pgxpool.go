// Causal scopes through the lsngate proxy, the way a web application meets them: a pgxpool
// shared by WORKERS goroutines, each "request" writing a row on one pooled connection and
// reading it back on another (both acquired for the request, so they are never the same), as
// the POST and the GET that follows it borrow whatever connection the pool hands out. The request
// works under its user's scope, `user:<worker>`:
//
//	set      `SET lsngate.scope = 'user:N'` on each connection at checkout, RESET at release
//	comment  `/* lsngate_scope='user:N' */` in front of each statement (as sqlcommenter adds it)
//	none     no scope: the control, where the read's connection knows nothing of the write
//
// Prints `stale=S replica=R reads=N`: reads that missed the row just written, reads served by a
// replica, reads. Exits 1 on any error.
//
// Usage: scopes_pgxpool URL TABLE OPS WORKERS MODE. Built by tests/proxy/scopes.rs in GOPATH
// mode against Debian's golang-github-jackc-pgx-v4-dev (no module download).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: scopes_pgxpool URL TABLE OPS WORKERS set|comment|none")
		os.Exit(2)
	}
	url, table, mode := os.Args[1], os.Args[2], os.Args[5]
	ops, err1 := strconv.Atoi(os.Args[3])
	workers, err2 := strconv.Atoi(os.Args[4])
	if err1 != nil || err2 != nil || workers < 1 || (mode != "set" && mode != "comment" && mode != "none") {
		fmt.Fprintln(os.Stderr, "OPS and WORKERS are numbers, MODE is set, comment or none")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		fail(err)
	}
	// Two connections per request, held at once: enough for every worker never to wait on
	// another's.
	config.MaxConns = int32(2 * workers)
	pool, err := pgxpool.ConnectConfig(ctx, config)
	if err != nil {
		fail(err)
	}
	defer pool.Close()

	var stale, replica, reads int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			scope := fmt.Sprintf("user:%d", w)
			prefix := ""
			if mode == "comment" {
				prefix = fmt.Sprintf("/* lsngate_scope='%s' */ ", scope)
			}
			for i := 0; i < ops/workers; i++ {
				id := int64(w)*1_000_000 + int64(i)
				found, onReplica, err := request(ctx, pool, table, mode, scope, prefix, id)
				if err != nil {
					errs <- fmt.Errorf("worker %d request %d: %w", w, i, err)
					return
				}
				atomic.AddInt64(&reads, 1)
				if !found {
					atomic.AddInt64(&stale, 1)
				}
				if onReplica {
					atomic.AddInt64(&replica, 1)
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fail(err)
	}
	fmt.Printf("stale=%d replica=%d reads=%d\n", stale, replica, reads)
}

// request writes row `id` on one pooled connection and reads it on another.
func request(ctx context.Context, pool *pgxpool.Pool, table, mode, scope, prefix string, id int64) (bool, bool, error) {
	writer, err := pool.Acquire(ctx)
	if err != nil {
		return false, false, err
	}
	defer writer.Release()
	reader, err := pool.Acquire(ctx)
	if err != nil {
		return false, false, err
	}
	defer reader.Release()
	if mode == "set" {
		for _, conn := range []*pgxpool.Conn{writer, reader} {
			if _, err := conn.Exec(ctx, fmt.Sprintf("SET lsngate.scope = '%s'", scope)); err != nil {
				return false, false, fmt.Errorf("SET lsngate.scope: %w", err)
			}
			defer conn.Exec(ctx, "RESET lsngate.scope")
		}
	}
	if _, err := writer.Exec(ctx, prefix+"INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id); err != nil {
		return false, false, fmt.Errorf("insert: %w", err)
	}
	var n int64
	var onReplica bool
	err = reader.QueryRow(ctx, prefix+"SELECT count(*), pg_is_in_recovery() FROM "+table+" WHERE id = $1", id).Scan(&n, &onReplica)
	if err != nil {
		return false, false, fmt.Errorf("read: %w", err)
	}
	return n == 1, onReplica, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "FAILED:", err)
	os.Exit(1)
}
