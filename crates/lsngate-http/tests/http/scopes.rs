//! `ScopeLayer`: the same user's requests see their writes on another instance of the app, through
//! a scope store in a real `redis-server`, with the replica held 50 ms behind — against the same
//! requests without a scope (the control, which must read stale).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use lsngate::{Config, Gate};
use lsngate_cluster::shared_delayed_cluster;
use lsngate_http::{RedisTokenStore, ScopeContext, ScopeLayer, TokenStore};
use tower::ServiceExt;

use crate::support::{RedisServer, user_header};

/// One instance of the app: its own gate, the shared store. `GET /items/{id}` answers
/// `<rows> <on replica>`, `POST /items/{id}` inserts the row; both under the request's scope, or
/// straight through the gate without one.
fn app(gate: Gate, store: Arc<dyn TokenStore>, table: &str) -> Router {
    let read_sql = format!("SELECT count(*), pg_is_in_recovery() FROM {table} WHERE id = $1");
    let write_sql = format!("INSERT INTO {table} VALUES ($1)");
    let reader = gate.clone();
    let writer = gate.clone();
    Router::new()
        .route(
            "/items/{id}",
            get(move |scope: ScopeContext, Path(id): Path<i64>| async move {
                let read = match scope.scope() {
                    Some(scope) => scope.query(&read_sql, &[&id]).await,
                    None => reader.query(&read_sql, &[&id]).await,
                }
                .unwrap();
                let row = &read.rows[0];
                format!("{} {}", row.get::<_, i64>(0), row.get::<_, bool>(1))
            })
            .post(move |scope: ScopeContext, Path(id): Path<i64>| async move {
                match scope.scope() {
                    Some(scope) => scope.write(&write_sql, &[&id]).await,
                    None => writer.write(&write_sql, &[&id]).await,
                }
                .unwrap();
                "written"
            }),
        )
        .layer(ScopeLayer::new(gate, store, |parts| {
            user_header(parts).map(|user| format!("user:{user}"))
        }))
}

async fn call(app: &Router, method: &str, path: &str, user: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_write_on_one_instance_is_read_on_another_under_the_scope() {
    let cluster = tokio::task::spawn_blocking(shared_delayed_cluster)
        .await
        .unwrap();
    let redis = RedisServer::start();
    let table = "http_scope_items";
    cluster
        .primary()
        .sql(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id bigint PRIMARY KEY)"
        ))
        .unwrap();
    let config = || Config::new(cluster.primary_url()).replicas(cluster.replica_urls());
    let store = || async {
        Arc::new(
            RedisTokenStore::connect(&redis.url())
                .await
                .unwrap()
                .with_prefix(lsngate_store::SCOPE_PREFIX),
        ) as Arc<dyn TokenStore>
    };
    let a = app(Gate::connect(config()).await.unwrap(), store().await, table);
    let b = app(Gate::connect(config()).await.unwrap(), store().await, table);
    // The table must be on the replica before reads of it can count.
    let created = cluster
        .primary()
        .sql("SELECT pg_current_wal_lsn()")
        .unwrap();
    tokio::task::spawn_blocking(move || {
        cluster
            .replica(0)
            .wait_replayed(created.trim(), Duration::from_secs(30))
    })
    .await
    .unwrap()
    .unwrap();

    let (mut stale, mut replica, mut control_stale) = (0, 0, 0);
    for id in 0..100i64 {
        let user = (id % 7).to_string();
        let (status, _) = call(&a, "POST", &format!("/items/{id}"), Some(&user)).await;
        assert_eq!(status, StatusCode::OK);
        let (_, seen) = call(&b, "GET", &format!("/items/{id}"), Some(&user)).await;
        stale += usize::from(seen.starts_with("0 "));
        replica += usize::from(seen.ends_with(" true"));
        // The control: the same write and read with no scope on either side.
        let control = 1000 + id;
        call(&a, "POST", &format!("/items/{control}"), None).await;
        let (_, seen) = call(&b, "GET", &format!("/items/{control}"), None).await;
        control_stale += usize::from(seen.starts_with("0 "));
    }
    println!(
        "100 writes on A read on B: under the user's scope stale={stale} replica={replica}; without a scope stale={control_stale}"
    );
    assert_eq!(stale, 0, "a read under the user's scope missed its write");
    assert!(
        control_stale > 0,
        "the control must read stale: the replica is behind"
    );

    // A scope name the request makes invalid is refused with what is wrong.
    let (status, body) = call(&b, "GET", "/items/1", Some("a b")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("letters, digits"), "{body}");
}
