//! Integration tests of `lsngate proxy` against real PostgreSQL clusters from lsngate-cluster, with
//! real clients (psql, pgbench, tokio-postgres, psycopg, asyncpg, node-postgres, pgjdbc, pgx).

#[path = "proxy/admin.rs"]
mod admin;
#[path = "proxy/auth_query.rs"]
mod auth_query;
#[path = "proxy/budget.rs"]
mod budget;
#[path = "proxy/causal.rs"]
mod causal;
#[path = "proxy/clients.rs"]
mod clients;
#[path = "proxy/dashboard.rs"]
mod dashboard;
#[path = "proxy/differential.rs"]
mod differential;
#[path = "proxy/discover.rs"]
mod discover;
#[path = "proxy/dns.rs"]
mod dns;
#[path = "proxy/drivers.rs"]
mod drivers;
#[path = "proxy/faults.rs"]
mod faults;
#[path = "proxy/hba.rs"]
mod hba;
#[path = "proxy/limits.rs"]
mod limits;
#[path = "proxy/patroni.rs"]
mod patroni;
#[path = "proxy/pooling.rs"]
mod pooling;
#[path = "proxy/psql.rs"]
mod psql;
#[path = "proxy/restart.rs"]
mod restart;
#[path = "proxy/routing.rs"]
mod routing;
#[path = "proxy/scopes.rs"]
mod scopes;
#[path = "proxy/server_auth.rs"]
mod server_auth;
#[path = "proxy/sessions.rs"]
mod sessions;
#[path = "proxy/signals.rs"]
mod signals;
#[path = "proxy/statements.rs"]
mod statements;
#[path = "proxy/support.rs"]
mod support;
#[path = "proxy/tls_servers.rs"]
mod tls_servers;
