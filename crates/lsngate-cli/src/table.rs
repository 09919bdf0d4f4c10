//! The one table style every command prints with.

use comfy_table::{Table, presets};

/// An empty table with `header`, in lsngate's style.
pub fn new<const N: usize>(header: [&str; N]) -> Table {
    let mut table = Table::new();
    table.load_style(presets::UTF8_FULL_CONDENSED);
    table.set_header(header);
    table
}
