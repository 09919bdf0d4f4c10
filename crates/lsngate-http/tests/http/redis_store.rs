//! `RedisTokenStore` against a real `redis-server` started on a random port for this test.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::Request;
use http_body_util::BodyExt;
use lsngate_core::{Lsn, Token, TokenCodec};
use lsngate_http::{RedisTokenStore, StoreError, TokenContext, TokenLayer, TokenStore};
use tower::ServiceExt;

use crate::support::{CountingRecorder, RedisServer, user_header, with_recorder};

#[tokio::test]
async fn redis_store_merges_by_max_expires_and_survives_a_layer_round_trip() {
    let redis = RedisServer::start();
    let store = RedisTokenStore::connect(&redis.url()).await.unwrap();
    let ttl = Duration::from_secs(30);

    assert_eq!(store.load("ann").await.unwrap(), None);
    store
        .save(
            "ann",
            Token::new(Lsn::new(0x1_0000_0010)).with_timeline(2),
            ttl,
        )
        .await
        .unwrap();
    // Smaller in value but "larger" as an unpadded string: must not win.
    store
        .save("ann", Token::new(Lsn::new(0xFFFF_FFF0)), ttl)
        .await
        .unwrap();
    let kept = store.load("ann").await.unwrap().unwrap();
    assert_eq!(kept.lsn, Lsn::new(0x1_0000_0010));
    assert_eq!(kept.timeline, Some(2));
    store
        .save("ann", Token::new(Lsn::new(0x2_0000_0000)), ttl)
        .await
        .unwrap();
    assert_eq!(
        store.load("ann").await.unwrap().unwrap().lsn,
        Lsn::new(0x2_0000_0000)
    );

    // Redis' own TTL removes the token.
    store
        .save("eve", Token::new(Lsn::new(1)), Duration::from_millis(50))
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..100 {
        if store.load("eve").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the token outlived its TTL");

    // A foreign value under our key is reported, naming the fix.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("lsngate:token:mallory")
        .arg("0/10")
        .query_async(&mut connection)
        .await
        .unwrap();
    let error = store.load("mallory").await.unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt { .. }) && error.to_string().contains("delete the key")
    );

    // Through the layer: the phone writes, the laptop (no cookie) reads the token.
    let store = Arc::new(store.with_prefix("app1:"));
    let app = Router::new()
        .route(
            "/write",
            post(|tokens: TokenContext| async move {
                tokens.record_commit(Token::new(Lsn::new(0xABCDEF)));
            }),
        )
        .route(
            "/read",
            get(|tokens: TokenContext| async move {
                tokens
                    .current()
                    .map_or("none".to_owned(), |t| t.lsn.to_string())
            }),
        )
        .layer(TokenLayer::new(TokenCodec::signed(b"k".to_vec())).store(store, user_header));
    let request = |method: &str, uri: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("x-user", "ann")
            .body(Body::empty())
            .unwrap()
    };
    app.clone()
        .oneshot(request("POST", "/write"))
        .await
        .unwrap();
    let response = app.clone().oneshot(request("GET", "/read")).await.unwrap();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"0/00ABCDEF");
    let stored: String = redis::cmd("GET")
        .arg("app1:ann")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored, "0000000000ABCDEF");
}

#[tokio::test]
async fn unreachable_redis_is_an_error_naming_the_fix() {
    let port = lsngate_cluster::free_port().unwrap();
    let error = RedisTokenStore::connect(&format!("redis://127.0.0.1:{port}/0"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("check that Redis runs"),
        "{error}"
    );
}

/// Redis going away mid-run: requests are still served (with the cookie/header token only), and
/// the outage is counted.
#[test]
fn store_outage_is_counted_and_never_fails_a_request() {
    let recorder = CountingRecorder::default();
    let (load_status, save_status, header_token) = with_recorder(&recorder, async {
        let redis = RedisServer::start();
        let store = Arc::new(RedisTokenStore::connect(&redis.url()).await.unwrap());
        drop(redis);
        let app = Router::new()
            .route(
                "/write",
                post(|tokens: TokenContext| async move {
                    tokens.record_commit(Token::new(Lsn::new(0x10)));
                }),
            )
            .route("/read", get(|| async { "ok" }))
            .layer(
                TokenLayer::new(TokenCodec::signed(b"k".to_vec()))
                    .store(store, |_| Some("ann".into())),
            );
        let request = |method: &str, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap()
        };
        let read = app.clone().oneshot(request("GET", "/read")).await.unwrap();
        let write = app
            .clone()
            .oneshot(request("POST", "/write"))
            .await
            .unwrap();
        let header = write.headers().get("lsn-token").is_some();
        (read.status(), write.status(), header)
    });
    assert!(load_status.is_success() && save_status.is_success());
    assert!(header_token, "the written token still reaches the client");
    let outages = recorder.count(
        "lsngate_http_tokens_invalid_total",
        &[("source", "store"), ("reason", "unavailable")],
    );
    assert_eq!(
        outages, 3,
        "a failed load per request (2) plus the failed save (1)"
    );
}
