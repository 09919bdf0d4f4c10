//! Durations on the command line: `50ms`, `0.5s`, `2s`, or a bare number of milliseconds.

use std::time::Duration;

/// Parses `50ms`, `1.5s`, `2m` or `250` (milliseconds).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|at| text.split_at(at))
        .ok_or_else(|| format!("invalid duration {text:?}: expected e.g. 50ms, 0.5s or 2m"))?;
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 50ms, 0.5s or 2m"))?;
    let seconds = match unit {
        "us" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        "m" | "min" => number * 60.0,
        _ => {
            return Err(format!(
                "invalid duration unit {unit:?} in {text:?}: use us, ms, s or m"
            ));
        }
    };
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!(
            "invalid duration {text:?}: must be a non-negative number"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_bare_milliseconds() {
        assert_eq!(parse("50ms").unwrap(), Duration::from_millis(50));
        assert_eq!(parse("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("20").unwrap(), Duration::from_millis(20));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert!(parse("fast").unwrap_err().contains("expected e.g. 50ms"));
        assert!(parse("5h").unwrap_err().contains("use us, ms, s or m"));
    }
}
