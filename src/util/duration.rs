//! Durations as upstream's settings and API fields write them.

use std::time::Duration;

/// Parses a Go-style duration (`10s`, `1m30s`, `500ms`, `1.5h`), as upstream's settings take.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let invalid = || format!("invalid duration {s:?}: expected e.g. 10s, 1m30s or 500ms");
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(invalid)?;
        if number_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("10s", Duration::from_secs(10))]
    #[case("1s", Duration::from_secs(1))]
    #[case("500ms", Duration::from_millis(500))]
    #[case("1m30s", Duration::from_secs(90))]
    #[case("1.5h", Duration::from_secs(5400))]
    #[case("0", Duration::ZERO)]
    fn durations(#[case] input: &str, #[case] expected: Duration) {
        assert_eq!(parse_duration(input), Ok(expected));
    }

    #[rstest]
    #[case("")]
    #[case("10")]
    #[case("1d")]
    #[case("s")]
    #[case("-1s")]
    fn bad_durations(#[case] input: &str) {
        assert!(parse_duration(input).is_err(), "{input}");
    }
}
