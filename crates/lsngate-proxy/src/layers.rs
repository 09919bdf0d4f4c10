//! The crate's layers, as a test: each top-level module has a rank, and a file may name
//! (`crate::…`) only modules of its own rank or below. From the bottom: the wire codec and the
//! leaves every layer uses (`net`, `runtime`, `tally`; `socket`, `timer`, `auth`; `config`),
//! statement classification, the server side (`backend`: connections, pools, monitor, replay
//! knowledge), causal state, the shared proxy state (with `topology`, which follows Patroni or
//! the primary into its node set), client sessions (`frontend`), the admin
//! port, and `serve`, which starts them all. Read top-down, a read is routed in
//! `frontend::session` (→ `flight`), which asks `causal` and `backend`.

/// Top-level modules by rank; a module may import only from modules of its rank or below.
const LAYERS: &[(&str, u8)] = &[
    ("net", 0),
    ("runtime", 0),
    ("tally", 0),
    ("traffic", 0),
    // SHOW STATS' totals and periods, over `traffic`'s readings.
    ("stats", 0),
    ("whatif", 0),
    ("socket", 1),
    ("timer", 1),
    ("notify", 1),
    ("handover", 1),
    ("auth", 1),
    ("config", 2),
    ("statement", 3),
    ("backend", 4),
    ("causal", 5),
    ("proxy", 6),
    ("clients", 6),
    // Who a login name is: the config's users, or auth_query's secrets from a server.
    ("logins", 6),
    // Beside the shared state it feeds: follows the topology source into `Proxy`'s node set.
    ("topology", 6),
    ("frontend", 7),
    ("admin", 8),
    // The control socket: takeover and forwarded cancels, answered from the shared state.
    ("control", 8),
    ("serve", 9),
    ("lib", 9),
    ("layers", 9),
];

#[cfg(test)]
mod tests {
    use super::LAYERS;
    use std::path::{Path, PathBuf};

    fn rank(module: &str) -> Option<u8> {
        LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The top-level module a file belongs to (`src/backend/pool.rs` → `backend`).
    fn module_of(src: &Path, file: &Path) -> String {
        let relative = file.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a component");
        let name = first.as_os_str().to_string_lossy();
        name.trim_end_matches(".rs").to_string()
    }

    /// Every `crate::NAME` a text mentions, comments and docs included (a doc link upward is
    /// a reader's import too).
    fn mentions(text: &str) -> Vec<String> {
        text.match_indices("crate::")
            .filter(|(at, _)| {
                // not `lsngate_core::…`-style paths of other crates ending in "crate"
                !text[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            })
            .map(|(at, m)| {
                text[at + m.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect()
    }

    #[test]
    fn no_module_imports_a_higher_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut wrong = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("layers.rs")) {
            let module = module_of(&src, file);
            let Some(own) = rank(&module) else {
                wrong.push(format!(
                    "{}: module `{module}` has no layer in LAYERS",
                    file.display()
                ));
                continue;
            };
            let text = std::fs::read_to_string(file).expect("source");
            for named in mentions(&text) {
                match rank(&named) {
                    Some(r) if r > own => wrong.push(format!(
                        "{}: `{module}` (layer {own}) names `crate::{named}` (layer {r})",
                        file.display()
                    )),
                    None => wrong.push(format!(
                        "{}: names `crate::{named}`, which has no layer in LAYERS",
                        file.display()
                    )),
                    _ => {}
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports against the layers:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn the_checker_sees_mentions() {
        assert_eq!(
            mentions("use crate::backend::Nodes; // see crate::frontend\nlsngate_core::x"),
            vec!["backend".to_string(), "frontend".to_string()]
        );
    }
}
