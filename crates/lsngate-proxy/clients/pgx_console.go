// The lsngate admin console through pgx v4, as Go tools read PgBouncer's: with pgx's default
// extended protocol the console refuses the query (as PgBouncer's does) and says why; with
// PreferSimpleProtocol every SHOW given on the command line answers. Prints one line per step:
// "extended: <error>" then "SHOW X: <columns> | <rows> rows".
//
// Usage: pgx_console URL SHOW... (URL of the console database, e.g. .../pgbouncer).
// Built by tests/proxy/drivers.rs in GOPATH mode against Debian's golang-github-jackc-pgx-v4-dev.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v4"
)

func main() {
	ctx := context.Background()
	url := os.Args[1]
	extended, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(1)
	}
	// Query, not Exec: pgx v4 sends an Exec without arguments as a simple query.
	rows, err := extended.Query(ctx, "SHOW POOLS")
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	fmt.Println("extended:", err)
	extended.Close(ctx)

	config, err := pgx.ParseConfig(url)
	if err != nil {
		fmt.Println("config:", err)
		os.Exit(1)
	}
	config.PreferSimpleProtocol = true
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(1)
	}
	defer conn.Close(ctx)
	failed := false
	for _, show := range os.Args[2:] {
		rows, err := conn.Query(ctx, "SHOW "+show)
		if err != nil {
			fmt.Printf("SHOW %s: error %v\n", show, err)
			failed = true
			continue
		}
		var names []string
		for _, field := range rows.FieldDescriptions() {
			names = append(names, string(field.Name))
		}
		count := 0
		for rows.Next() {
			if _, err := rows.Values(); err != nil {
				fmt.Printf("SHOW %s: row error %v\n", show, err)
				failed = true
			}
			count++
		}
		if err := rows.Err(); err != nil {
			fmt.Printf("SHOW %s: error %v\n", show, err)
			failed = true
			continue
		}
		fmt.Printf("SHOW %s: %s | %d rows\n", show, strings.Join(names, ","), count)
	}
	if failed {
		os.Exit(1)
	}
}
