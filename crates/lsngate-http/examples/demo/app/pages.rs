//! HTML of the demo, as plain strings: the item list, one item with its edit form, the request
//! log and the job list. Every value from the database or the client is escaped.

use std::fmt::Write as _;

use lsngate_core::Token;

use super::data::{Item, JobRow};
use super::log::{Entry, Served, clock};
use super::{Mode, Verdict};

pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn token_text(token: Option<Token>) -> String {
    token.map_or("none".to_owned(), |t| t.lsn.to_string())
}

const STYLE: &str =
    "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:60rem;color:#222}
nav a{margin-right:1rem} .mode{padding:.2rem .6rem;border-radius:1rem;color:#fff}
.fixed{background:#2a7d2a} .naive{background:#b03a2e} table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;font-size:.9rem}
.panel{background:#f4f6f8;border-radius:.5rem;padding:.8rem 1rem;margin:1rem 0}
.replica{color:#2a7d2a} .primary{color:#8a5a00} code{font-size:.95em}
.stale{background:#fbe3e0;color:#8a1c10} .fresh{color:#2a7d2a}";

/// The page frame: navigation, the mode toggle and `body`'s `data-status` for the browser test.
pub fn frame(title: &str, mode: Mode, status: &str, content: &str) -> String {
    let (other, label) = match mode {
        Mode::Fixed => ("naive", "switch to naive (no token)"),
        Mode::Naive => ("fixed", "switch to fixed (token)"),
    };
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{title} · lsngate demo</title>\
         <style>{STYLE}</style></head><body data-status=\"{status}\" data-mode=\"{mode}\">\
         <nav><a href=\"/\">items</a><a href=\"/requests\">requests</a><a href=\"/jobs\">jobs</a>\
         <span class=\"mode {mode}\">{mode}</span> <a id=\"toggle\" href=\"/mode?set={other}\">{label}</a></nav>\
         <h1>{title}</h1>{content}</body></html>",
        title = escape(title),
    )
}

/// Which node served this page, with which token, after how long a wait.
pub fn served_panel(served: &Served, token: Option<Token>) -> String {
    let class = if served.node == "primary" {
        "primary"
    } else {
        "replica"
    };
    let fallback = served
        .fallback
        .as_ref()
        .map(|why| format!(" (fell back: {})", escape(why)))
        .unwrap_or_default();
    format!(
        "<div class=panel>served by <b id=served-by class={class}>{node}</b>{fallback} · token \
         <code id=token>{token}</code> · waited <span id=wait>{wait:.1} ms</span></div>",
        node = escape(&served.node),
        token = token_text(token),
        wait = served.wait.as_secs_f64() * 1000.0,
    )
}

pub fn index(items: &[Item], served: &Served, token: Option<Token>, mode: Mode) -> String {
    let mut rows = String::new();
    for item in items {
        let _ = write!(
            rows,
            "<tr><td><a href=\"/items/{id}\">{title}</a></td><td>{value}</td></tr>",
            id = item.id,
            title = escape(&item.title),
            value = escape(&item.value),
        );
    }
    let content = format!(
        "{panel}<form method=post action=\"/items\"><input id=new-title name=title required \
         placeholder=\"new item title\"> <button id=create>Create</button></form>\
         <table><tr><th>title</th><th>value</th></tr>{rows}</table>",
        panel = served_panel(served, token),
    );
    frame("Items", mode, "found", &content)
}

pub fn item(
    item: Option<&Item>,
    id: i64,
    served: &Served,
    token: Option<Token>,
    mode: Mode,
    verdict: &Verdict,
) -> String {
    let mut panel = served_panel(served, token);
    if let Verdict::Stale { saved } = verdict {
        let _ = write!(
            panel,
            "<div class=\"panel stale\" id=stale>STALE: the last save was <b>{}</b>; this replica \
             has not replayed it yet</div>",
            escape(saved)
        );
    }
    let Some(item) = item else {
        let content = format!(
            "{panel}<p>Item {id} was not found on <b>{}</b>: the read did not see the write that \
             created it (a stale replica).</p>",
            escape(&served.node)
        );
        return frame("Not found", mode, "missing", &content);
    };
    let content = format!(
        "{panel}<p>Title: <b id=title>{title}</b></p><p>Value: <b id=value>{value}</b></p>\
         <form method=post action=\"/items/{id}\"><input id=value-input name=value \
         value=\"{value}\" size=40> <button id=save>Save</button></form>",
        title = escape(&item.title),
        value = escape(&item.value),
        id = item.id,
    );
    frame(&item.title, mode, "found", &content)
}

pub fn requests(entries: &[Entry], mode: Mode) -> String {
    let mut rows = String::new();
    for entry in entries {
        let class = if entry.served.node == "primary" {
            "primary"
        } else {
            "replica"
        };
        let _ = write!(
            rows,
            "<tr><td>{at}</td><td>{what}</td><td><span class=\"mode {m}\">{m}</span></td>\
             <td class={class}>{node}</td><td><code>{token}</code></td><td>{wait:.1} ms</td><td>{fallback}</td>{verdict}</tr>",
            at = clock(entry.at),
            what = escape(&entry.what),
            m = entry.mode,
            node = escape(&entry.served.node),
            token = token_text(entry.token),
            wait = entry.served.wait.as_secs_f64() * 1000.0,
            fallback = escape(entry.served.fallback.as_deref().unwrap_or("")),
            verdict = verdict_cell(entry.verdict.as_ref()),
        );
    }
    let content = format!(
        "<p>Every read, newest first: the node that served it, the token it carried and how long \
         it waited for a replica to replay that token.</p><table><tr><th>time (UTC)</th>\
         <th>request</th><th>mode</th><th>served by</th><th>token</th><th>wait</th><th>fallback</th><th>page</th></tr>{rows}</table>"
    );
    frame("Requests", mode, "found", &content)
}

fn verdict_cell(verdict: Option<&Verdict>) -> String {
    match verdict {
        None => "<td></td>".to_owned(),
        Some(Verdict::Fresh) => "<td class=fresh>fresh</td>".to_owned(),
        Some(Verdict::Stale { saved }) => {
            format!("<td class=stale>STALE (last save: {})</td>", escape(saved))
        }
        Some(Verdict::Missing) => "<td class=stale>NOT FOUND</td>".to_owned(),
    }
}

pub fn jobs(jobs: &[JobRow], mode: Mode) -> String {
    let mut rows = String::new();
    for job in jobs {
        let _ = write!(
            rows,
            "<tr><td>{id}</td><td>{payload}</td><td>{state}</td><td>{node}</td><td>{wait}</td></tr>",
            id = job.id,
            payload = escape(&job.payload),
            state = match job.found {
                None => "queued",
                Some(true) => "found the row",
                Some(false) => "ROW NOT FOUND",
            },
            node = escape(job.served_by.as_deref().unwrap_or("")),
            wait = job
                .wait_ms
                .map(|ms| format!("{ms:.1} ms"))
                .unwrap_or_default(),
        );
    }
    let content = format!(
        "<p>Each create enqueues a job (PostgreSQL, <code>FOR UPDATE SKIP LOCKED</code>) whose \
         payload carries the create's token; the worker reads the new row with it.</p>\
         <table><tr><th>job</th><th>payload</th><th>result</th><th>served by</th><th>wait</th></tr>{rows}</table>"
    );
    frame("Jobs", mode, "found", &content)
}
