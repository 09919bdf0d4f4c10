//! `--svg FILE`: the read-path latency distribution of every strategy as cumulative curves on a
//! log time axis. Plain SVG text (no font files, no plotting dependency): a curve further left
//! is faster; a curve that reaches 100% late has a long tail.

use std::fmt::Write as _;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 220.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One curve: a label and its latencies in milliseconds.
pub struct Series {
    pub label: String,
    pub latencies_ms: Vec<f64>,
}

/// The whole chart as an SVG document.
pub fn render(title: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.latencies_ms.iter().copied());
    let (min, max) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo_decade = if min.is_finite() && min > 0.0 {
        min.log10().floor()
    } else {
        -1.0
    };
    let hi_decade = if max > 0.0 {
        max.log10().ceil().max(lo_decade + 1.0)
    } else {
        2.0
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |ms: f64| {
        LEFT + (ms.max(10f64.powf(lo_decade)).log10() - lo_decade) / (hi_decade - lo_decade)
            * plot_w
    };
    let y = |fraction: f64| TOP + (1.0 - fraction) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid: decades and their 2× and 5× marks on x, quarters on y.
    let mut decade = lo_decade;
    while decade <= hi_decade {
        for (step, label) in [(1.0, true), (2.0, false), (5.0, false)] {
            let ms = step * 10f64.powf(decade);
            if ms > 10f64.powf(hi_decade) * 1.0001 {
                continue;
            }
            let px = x(ms);
            let stroke = if label { "#bbb" } else { "#e5e5e5" };
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="{stroke}"/>"##,
                TOP + plot_h
            );
            let _ = writeln!(
                svg,
                r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
                TOP + plot_h + 18.0,
                format_ms(ms)
            );
        }
        decade += 1.0;
    }
    for quarter in 0..=4 {
        let fraction = quarter as f64 / 4.0;
        let py = y(fraction);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}%</text>"##,
            LEFT - 8.0,
            py + 4.0,
            quarter * 25
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#222">read-path latency (from COMMIT returned to read result), log scale</text>"##,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        svg,
        r##"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle" fill="#222">reads completed</text>"##,
        TOP + plot_h / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut sorted = s.latencies_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let mut path = String::new();
        for (k, ms) in sorted.iter().enumerate() {
            let command = if k == 0 { 'M' } else { 'L' };
            let _ = write!(path, "{command}{:.1},{:.1} ", x(*ms), y((k + 1) as f64 / n));
        }
        let _ = writeln!(
            svg,
            r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#
        );
        let ly = TOP + 14.0 + i as f64 * 20.0;
        let lx = LEFT + plot_w + 16.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            lx + 22.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 28.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>"##
    );
    svg.push_str("</svg>\n");
    svg
}

fn format_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{}s", ms / 1000.0)
    } else {
        // Ticks are 1, 2 or 5 × a power of ten: rounding to 6 decimals prints them exactly.
        format!("{}ms", (ms * 1e6).round() / 1e6)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_path_and_legend_entry_per_series() {
        let svg = render(
            "t <1>",
            &[
                Series {
                    label: "primary".into(),
                    latencies_ms: vec![1.0, 2.0, 3.0],
                },
                Series {
                    label: "waitfor".into(),
                    latencies_ms: vec![2.0, 4.0, 50.0],
                },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<path ").count(), 2);
        assert!(svg.contains(">primary</text>") && svg.contains(">waitfor</text>"));
        assert!(svg.contains("t &lt;1&gt;"), "titles are escaped");
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
