//! The layer inside a real axum router, driven with `oneshot`: cookie and header paths,
//! signatures, expiry, merge, bad input, rejection mode and the per-user store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use lsngate_core::{Lsn, Token, TokenCodec};
use lsngate_http::{MemoryTokenStore, NewToken, TokenContext, TokenLayer};
use tower::ServiceExt;

use crate::support::{CountingRecorder, user_header, with_recorder};

const KEY: &[u8] = b"test signing key";

fn codec() -> TokenCodec {
    TokenCodec::signed(KEY.to_vec())
}

#[derive(serde::Deserialize)]
struct Write {
    lsn: String,
}

async fn read(tokens: TokenContext) -> String {
    tokens
        .current()
        .map_or("none".to_owned(), |t| t.lsn.to_string())
}

async fn write(tokens: TokenContext, Query(write): Query<Write>) -> Redirect {
    tokens.record_commit(Token::new(Lsn::parse(&write.lsn).unwrap()));
    Redirect::to("/read")
}

async fn write_part(Query(write): Query<Write>) -> impl IntoResponse {
    (
        NewToken(Token::new(Lsn::parse(&write.lsn).unwrap())),
        "written",
    )
}

fn app(layer: TokenLayer) -> Router {
    Router::new()
        .route("/read", get(read))
        .route("/write", post(write))
        .route("/write-part", post(write_part))
        .layer(layer)
}

async fn send(app: &Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> Response<Body> {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn body(response: Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn set_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The `name=value` pair of a Set-Cookie line, as a browser would send it back.
fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

fn signed(lsn: u64) -> String {
    codec()
        .with_ttl(Duration::from_secs(30))
        .issue(&Token::new(Lsn::new(lsn)), SystemTime::now())
}

#[tokio::test]
async fn no_token_reads_none_and_sets_nothing() {
    let app = app(TokenLayer::new(codec()));
    let response = send(&app, "GET", "/read", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(set_cookie(response.headers()), None);
    assert!(response.headers().get("lsn-token").is_none());
    assert_eq!(body(response).await, "none");
}

#[tokio::test]
async fn write_sets_a_signed_cookie_that_the_next_read_carries() {
    let app = app(TokenLayer::new(codec()));
    let response = send(&app, "POST", "/write?lsn=0/3F8A120", &[]).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let line = set_cookie(response.headers()).expect("Set-Cookie after a write");
    for attribute in ["HttpOnly", "SameSite=Lax", "Secure", "Max-Age=30", "Path=/"] {
        assert!(line.contains(attribute), "{attribute} missing in {line}");
    }
    let header = response.headers()["lsn-token"].to_str().unwrap().to_owned();
    let token = codec().verify(&header, SystemTime::now()).unwrap();
    assert_eq!(token.lsn, Lsn::new(0x3F8A120));
    assert!(token.expires_at.is_some(), "issued tokens carry the TTL");
    let next = send(&app, "GET", "/read", &[("cookie", &cookie_pair(&line))]).await;
    assert_eq!(body(next).await, "0/03F8A120");
}

#[tokio::test]
async fn header_path_round_trips_and_merges_with_the_cookie_by_max() {
    let app = app(TokenLayer::new(codec()));
    let response = send(&app, "GET", "/read", &[("lsn-token", &signed(0x20))]).await;
    assert_eq!(body(response).await, "0/00000020");
    let cookie = format!("lsn_token={}", signed(0x10));
    let both = [("cookie", cookie.as_str()), ("lsn-token", &signed(0x30))];
    assert_eq!(
        body(send(&app, "GET", "/read", &both).await).await,
        "0/00000030"
    );
    let two_headers = format!("{}, {}", signed(0x50), signed(0x40));
    let response = send(&app, "GET", "/read", &[("lsn-token", &two_headers)]).await;
    assert_eq!(body(response).await, "0/00000050");
}

#[tokio::test]
async fn response_token_is_the_max_of_incoming_and_written() {
    let app = app(TokenLayer::new(codec()));
    let response = send(
        &app,
        "POST",
        "/write?lsn=0/15",
        &[("lsn-token", &signed(0x20))],
    )
    .await;
    let header = response.headers()["lsn-token"].to_str().unwrap();
    assert_eq!(
        codec().verify(header, SystemTime::now()).unwrap().lsn,
        Lsn::new(0x20)
    );
    let response = send(
        &app,
        "POST",
        "/write?lsn=0/25",
        &[("lsn-token", &signed(0x20))],
    )
    .await;
    let header = response.headers()["lsn-token"].to_str().unwrap();
    assert_eq!(
        codec().verify(header, SystemTime::now()).unwrap().lsn,
        Lsn::new(0x25)
    );
}

#[tokio::test]
async fn new_token_response_part_is_issued_too() {
    let app = app(TokenLayer::new(codec()));
    let response = send(&app, "POST", "/write-part?lsn=1/0", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let header = response.headers()["lsn-token"].to_str().unwrap();
    assert_eq!(
        codec().verify(header, SystemTime::now()).unwrap().lsn,
        Lsn::new(1 << 32)
    );
    assert!(set_cookie(response.headers()).is_some());
}

/// Every kind of bad token: the read goes on without it (200, "none"), and the refusal is
/// counted by source and reason.
#[test]
fn bad_tokens_are_treated_as_absent_and_counted() {
    let recorder = CountingRecorder::default();
    with_recorder(&recorder, async {
        let app = app(TokenLayer::new(codec()));
        let past = SystemTime::now() - Duration::from_secs(120);
        let expired = codec()
            .with_ttl(Duration::from_secs(30))
            .issue(&Token::new(Lsn::new(9)), past);
        let tampered = signed(0x10).replacen("0/00000010", "0/00000099", 1);
        let other_key = TokenCodec::signed(b"other".to_vec()).issue(&Token::new(Lsn::new(9)), past);
        let injection = "0/1'; DROP TABLE items; --";
        let cases = [
            ("lsn-token", expired.as_str(), "expired"),
            ("lsn-token", tampered.as_str(), "bad_signature"),
            ("lsn-token", other_key.as_str(), "bad_signature"),
            ("lsn-token", "0/10", "unsigned"),
            ("lsn-token", injection, "malformed"),
            ("cookie", "lsn_token=garbage", "malformed"),
        ];
        for (name, value, _) in &cases {
            let response = send(&app, "GET", "/read", &[(name, value)]).await;
            assert_eq!(response.status(), StatusCode::OK, "{name}: {value}");
            assert_eq!(body(response).await, "none", "{name}: {value}");
        }
        let too_long = "9".repeat(400);
        let response = send(&app, "GET", "/read", &[("lsn-token", &too_long)]).await;
        assert_eq!(body(response).await, "none");
        // A bad token beside a good one costs nothing: the good one is honoured.
        let mixed = format!("garbage, {}", signed(0x77));
        assert_eq!(
            body(send(&app, "GET", "/read", &[("lsn-token", &mixed)]).await).await,
            "0/00000077"
        );
    });
    let invalid = "lsngate_http_tokens_invalid_total";
    assert_eq!(recorder.count(invalid, &[("reason", "expired")]), 1);
    assert_eq!(recorder.count(invalid, &[("reason", "bad_signature")]), 2);
    assert_eq!(recorder.count(invalid, &[("reason", "unsigned")]), 1);
    assert_eq!(
        recorder.count(invalid, &[("reason", "malformed"), ("source", "header")]),
        2
    );
    assert_eq!(
        recorder.count(invalid, &[("reason", "malformed"), ("source", "cookie")]),
        1
    );
    assert_eq!(recorder.count(invalid, &[("reason", "too_long")]), 1);
}

#[test]
fn issued_tokens_are_counted() {
    let recorder = CountingRecorder::default();
    with_recorder(&recorder, async {
        let app = app(TokenLayer::new(codec()));
        send(&app, "POST", "/write?lsn=0/1", &[]).await;
        send(&app, "GET", "/read", &[]).await;
    });
    assert_eq!(recorder.count("lsngate_http_tokens_issued_total", &[]), 1);
}

#[tokio::test]
async fn reject_mode_answers_400_naming_the_fix() {
    let app = app(TokenLayer::new(codec()).reject_invalid(true));
    let response = send(&app, "GET", "/read", &[("lsn-token", "0/XYZ")]).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let message = body(response).await;
    assert!(
        message.contains("lsn-token") && message.contains("like 0/3F8A120"),
        "{message}"
    );
    let good = send(&app, "GET", "/read", &[("lsn-token", &signed(0x5))]).await;
    assert_eq!(good.status(), StatusCode::OK);
}

#[tokio::test]
async fn names_ttl_and_secure_are_configurable() {
    let layer = TokenLayer::new(codec())
        .cookie(Some("rw"))
        .header(Some(http::HeaderName::from_static("x-commit")))
        .ttl(Duration::from_secs(5))
        .secure(false);
    let app = app(layer);
    let response = send(&app, "POST", "/write?lsn=0/AB", &[]).await;
    let line = set_cookie(response.headers()).unwrap();
    assert!(
        line.starts_with("rw=") && line.contains("Max-Age=5"),
        "{line}"
    );
    assert!(!line.contains("Secure"), "{line}");
    assert!(response.headers().get("x-commit").is_some());
    assert!(response.headers().get("lsn-token").is_none());
    // The default names are no longer read.
    let ignored = send(&app, "GET", "/read", &[("lsn-token", &signed(0x1))]).await;
    assert_eq!(body(ignored).await, "none");
    let cookie = cookie_pair(&line);
    assert_eq!(
        body(send(&app, "GET", "/read", &[("cookie", &cookie)]).await).await,
        "0/000000AB"
    );
}

#[tokio::test]
async fn header_only_and_cookie_only_modes() {
    let header_only = app(TokenLayer::new(codec()).cookie(None));
    let response = send(&header_only, "POST", "/write?lsn=0/1", &[]).await;
    assert!(set_cookie(response.headers()).is_none());
    assert!(response.headers().get("lsn-token").is_some());
    let cookie = format!("lsn_token={}", signed(0x9));
    assert_eq!(
        body(send(&header_only, "GET", "/read", &[("cookie", &cookie)]).await).await,
        "none"
    );

    let cookie_only = app(TokenLayer::new(codec()).header(None));
    let response = send(&cookie_only, "POST", "/write?lsn=0/1", &[]).await;
    assert!(set_cookie(response.headers()).is_some());
    assert!(response.headers().get("lsn-token").is_none());
}

#[tokio::test]
async fn unsigned_codec_accepts_plain_lsn_headers() {
    let app = app(TokenLayer::new(TokenCodec::unsigned()));
    let response = send(&app, "GET", "/read", &[("lsn-token", "0/3F8A120")]).await;
    assert_eq!(body(response).await, "0/03F8A120");
}

#[tokio::test]
async fn store_carries_the_token_to_another_device() {
    let store = Arc::new(MemoryTokenStore::new());
    let app = app(TokenLayer::new(codec()).store(store, user_header));
    send(&app, "POST", "/write?lsn=0/4242", &[("x-user", "ann")]).await;
    // The laptop has no cookie, only the same user.
    let laptop = send(&app, "GET", "/read", &[("x-user", "ann")]).await;
    assert_eq!(body(laptop).await, "0/00004242");
    let stranger = send(&app, "GET", "/read", &[("x-user", "bob")]).await;
    assert_eq!(body(stranger).await, "none");
    let anonymous = send(&app, "GET", "/read", &[]).await;
    assert_eq!(body(anonymous).await, "none");
}

#[tokio::test]
async fn extractor_without_the_layer_names_the_fix() {
    let bare = Router::new().route("/read", get(read));
    let response = send(&bare, "GET", "/read", &[]).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body(response).await.contains("TokenLayer"));
}

/// Not only axum: a bare `tower::service_fn` over `http` types, with `String` bodies.
#[tokio::test]
async fn works_over_a_plain_tower_service() {
    use tower::{Layer, service_fn};
    let service =
        TokenLayer::new(codec()).layer(service_fn(|request: Request<String>| async move {
            let tokens = request.extensions().get::<TokenContext>().cloned().unwrap();
            let seen = tokens.current().map(|t| t.lsn.to_string());
            tokens.record_commit(Token::new(Lsn::new(0x99)));
            Ok::<_, std::convert::Infallible>(Response::new(seen.unwrap_or_default()))
        }));
    let request = Request::builder()
        .header("lsn-token", signed(0x42))
        .body(String::new())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.body(), "0/00000042");
    let header = response.headers()["lsn-token"].to_str().unwrap();
    assert_eq!(
        codec().verify(header, SystemTime::now()).unwrap().lsn,
        Lsn::new(0x99)
    );
}
