//! What the proxy knows about a client's SQL text before it sends it anywhere: where it may run
//! (`class`), whether it is one of the proxy's own commands or changes a session setting
//! (`command`), which route hints its comments carry (`hints`), and the key it is cached under
//! (`key`, `cache`).
//!
//! Pure: text in, answer out — no sockets, no session state, no node; choosing the node is the
//! session's decision (`frontend/`), made with these answers. Conservative: whatever is not
//! understood counts as a write and goes to the primary. Cached: classification runs the SQL
//! parser, so answers are kept by a literal-free key, shared by the proxy and memoised per
//! session. This module sits below `backend`, `causal`, `frontend` and `admin` and imports none
//! of them.

mod cache;
mod class;
mod command;
mod hints;
mod key;
mod split;

pub use cache::{ClassCache, ClassMemo};
pub use class::{Class, several_statements};
pub use command::{
    LocalCommand, MixedCommands, Verb, local_command, may_reset_in_parts, mentions_lsngate_setting,
    mixed_commands, resets_all_in_parts, session_set, sets_session_in_parts, setting_reset,
};
pub use hints::{Hints, RouteHint, comment_hints};
pub use split::{
    after_block_end, chains_block, ends_block, may_end_block, parses_in_failed_block, statements,
};

#[cfg(test)]
mod tests {
    use super::class::classify;
    use super::key::cache_key;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn classification_never_panics(sql in ".{0,200}") {
            let _ = classify(&sql, &[]);
            let _ = local_command(&sql);
            let _ = comment_hints(&sql);
            let _ = session_set(&sql);
            let _ = cache_key(&sql);
        }
    }
}
