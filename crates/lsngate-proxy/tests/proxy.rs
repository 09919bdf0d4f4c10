//! Integration tests of `lsngate proxy` against real PostgreSQL clusters from the testkit, with
//! real clients (psql, pgbench, tokio-postgres, psycopg, asyncpg, node-postgres).

#[path = "proxy/clients.rs"]
mod clients;
#[path = "proxy/psql.rs"]
mod psql;
#[path = "proxy/routing.rs"]
mod routing;
#[path = "proxy/support.rs"]
mod support;
