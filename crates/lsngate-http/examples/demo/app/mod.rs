//! The demo app: items you create and edit through HTML forms (POST → 303 → GET), a toggle
//! between the naive behaviour (reads go to a replica with no token) and the fixed one (the
//! layer carries the write's token to the next read), a job queue whose worker reads the row a
//! request wrote, and pages showing which node served each read.
//!
//! Shared by `examples/demo/main.rs` (what a newcomer runs) and the crate's end-to-end test.

pub mod data;
pub mod jobs;
pub mod log;
pub mod pages;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use lsngate_core::{Token, TokenCodec};
use lsngate_http::{JobPayload, TokenContext, TokenLayer};

use data::{Db, ItemJob};
use log::RequestLog;

/// Naive: no token anywhere (what most apps do). Fixed: the token goes with every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Naive,
    Fixed,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Naive => "naive",
            Mode::Fixed => "fixed",
        })
    }
}

const MODE_COOKIE: &str = "demo_mode";

impl Mode {
    fn of(headers: &HeaderMap) -> Mode {
        let naive = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|line| line.split(';'))
            .any(|pair| pair.trim() == format!("{MODE_COOKIE}=naive"));
        if naive { Mode::Naive } else { Mode::Fixed }
    }

    /// The token a read carries in this mode.
    fn read_token(self, tokens: &TokenContext) -> Option<Token> {
        match self {
            Mode::Fixed => tokens.current(),
            Mode::Naive => None,
        }
    }

    /// Reports a write's token to the layer, in fixed mode only.
    fn record(self, tokens: &TokenContext, token: Token) {
        if self == Mode::Fixed {
            tokens.record_commit(token);
        }
    }
}

/// What every handler shares.
pub struct Demo {
    pub db: Db,
    pub log: RequestLog,
    /// The last value saved per item, as the server wrote it: the ground truth a page is
    /// compared with to flag it stale.
    saved: Mutex<HashMap<i64, String>>,
}

impl Demo {
    pub fn new(db: Db) -> Demo {
        Demo {
            db,
            log: RequestLog::default(),
            saved: Mutex::default(),
        }
    }

    fn remember(&self, id: i64, value: &str) {
        self.saved.lock().unwrap().insert(id, value.to_owned());
    }

    /// Whether a page showing `item` (or nothing) for `id` is older than the last save.
    fn verdict(&self, id: i64, item: Option<&data::Item>) -> Verdict {
        match (item, self.saved.lock().unwrap().get(&id)) {
            (None, Some(_)) => Verdict::Missing,
            (Some(item), Some(saved)) if item.value != *saved => Verdict::Stale {
                saved: saved.clone(),
            },
            _ => Verdict::Fresh,
        }
    }
}

/// A page compared with the last write the server made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fresh,
    /// The page shows an older value than `saved`.
    Stale {
        saved: String,
    },
    /// The item was created but the read did not find it.
    Missing,
}

/// Any failure, shown as a 500 page with its message.
pub struct DemoError(String);

impl<E: std::fmt::Display> From<E> for DemoError {
    fn from(error: E) -> Self {
        DemoError(error.to_string())
    }
}

impl IntoResponse for DemoError {
    fn into_response(self) -> Response {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("demo error: {}", self.0),
        )
            .into_response()
    }
}

type Page = Result<Response, DemoError>;

/// The app, wrapped in the token layer. `signing_key` signs the token cookie.
pub fn router(demo: Arc<Demo>, signing_key: &[u8]) -> Router {
    // Plain HTTP on 127.0.0.1 in the demo, so no `Secure` cookie; keep the default in production.
    let layer = TokenLayer::new(TokenCodec::signed(signing_key.to_vec())).secure(false);
    Router::new()
        .route("/", get(index).post(create))
        .route("/items", axum::routing::post(create))
        .route("/items/{id}", get(show).post(update))
        .route("/mode", get(set_mode))
        .route("/requests", get(requests))
        .route("/jobs", get(jobs))
        .layer(layer)
        .with_state(demo)
}

async fn index(State(demo): State<Arc<Demo>>, tokens: TokenContext, headers: HeaderMap) -> Page {
    let mode = Mode::of(&headers);
    let token = mode.read_token(&tokens);
    let (items, served) = demo.db.items(token).await?;
    demo.log
        .push("GET /".into(), mode_name(mode), token, &served, None);
    Ok(Html(pages::index(&items, &served, token, mode)).into_response())
}

#[derive(serde::Deserialize)]
struct NewItem {
    title: String,
}

/// Create → enqueue the job that reads the new row → 303 to the new item's page.
async fn create(
    State(demo): State<Arc<Demo>>,
    tokens: TokenContext,
    headers: HeaderMap,
    Form(new): Form<NewItem>,
) -> Page {
    let mode = Mode::of(&headers);
    let (id, created) = demo.db.create_item(&new.title).await?;
    demo.remember(id, "");
    mode.record(&tokens, created);
    // The job row commits after the item: its payload carries the item's commit token.
    let payload_token = (mode == Mode::Fixed).then_some(created);
    let enqueued = demo
        .db
        .enqueue(&JobPayload::new(ItemJob { item_id: id }, payload_token))
        .await?;
    mode.record(&tokens, enqueued);
    Ok(Redirect::to(&format!("/items/{id}")).into_response())
}

async fn show(
    State(demo): State<Arc<Demo>>,
    tokens: TokenContext,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Page {
    let mode = Mode::of(&headers);
    let token = mode.read_token(&tokens);
    let (item, served) = demo.db.item(id, token).await?;
    let verdict = demo.verdict(id, item.as_ref());
    let what = format!("GET /items/{id}");
    demo.log
        .push(what, mode_name(mode), token, &served, Some(verdict.clone()));
    let status = if item.is_some() {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    };
    let page = pages::item(item.as_ref(), id, &served, token, mode, &verdict);
    Ok((status, Html(page)).into_response())
}

#[derive(serde::Deserialize)]
struct Edit {
    value: String,
}

/// Save → 303 back to the item's page (the read that must see this write).
async fn update(
    State(demo): State<Arc<Demo>>,
    tokens: TokenContext,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(edit): Form<Edit>,
) -> Page {
    let mode = Mode::of(&headers);
    let written = demo.db.update_item(id, &edit.value).await?;
    demo.remember(id, &edit.value);
    mode.record(&tokens, written);
    Ok(Redirect::to(&format!("/items/{id}")).into_response())
}

#[derive(serde::Deserialize)]
struct SetMode {
    set: String,
}

async fn set_mode(Query(query): Query<SetMode>) -> Response {
    let mode = if query.set == "naive" {
        "naive"
    } else {
        "fixed"
    };
    let cookie = format!("{MODE_COOKIE}={mode}; Path=/; SameSite=Lax");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

async fn requests(State(demo): State<Arc<Demo>>, headers: HeaderMap) -> Html<String> {
    Html(pages::requests(&demo.log.entries(), Mode::of(&headers)))
}

async fn jobs(State(demo): State<Arc<Demo>>, headers: HeaderMap) -> Page {
    let rows = demo.db.jobs().await?;
    Ok(Html(pages::jobs(&rows, Mode::of(&headers))).into_response())
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Naive => "naive",
        Mode::Fixed => "fixed",
    }
}
