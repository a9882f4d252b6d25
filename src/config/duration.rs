//! Go duration strings, the form the reference's configuration uses for every
//! duration (`10s`, `500ms`, `1m30s`).

use std::time::Duration;

/// Parses a Go duration string: one or more decimal numbers, each with an optional
/// fraction and a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), such as `10s`,
/// `1.5h` or `1m30s`; `0` alone is zero. Negative durations are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!("`{text}` is not a duration ({why}); use e.g. \"10s\", \"500ms\", \"1m30s\"")
    };
    // As Go: the sign first, then a lone `0` (of either sign) is zero, then
    // nothing left is an error.
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    if negative {
        return Err(bad("negative"));
    }
    let mut total_nanos: u128 = 0;
    // Each pass consumes one number and its unit, so the loop ends within
    // `text.len()` passes.
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("missing unit"))?;
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad("expected a number"));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad("unknown unit")),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad("number too large"))?
        };
        let mut nanos = whole
            .checked_mul(unit_nanos)
            .ok_or_else(|| bad("too large"))?;
        // The fraction's digits beyond nanosecond precision are dropped.
        let mut scale = unit_nanos;
        for digit in fraction.bytes().take(20) {
            scale /= 10;
            nanos = nanos
                .checked_add(u128::from(digit - b'0') * scale)
                .ok_or_else(|| bad("too large"))?;
        }
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| bad("too large"))?;
        rest = tail;
    }
    // Go's durations are i64 nanoseconds (about 292 years): past that is an
    // error there, and here a deadline that far out would overflow a clock.
    if total_nanos > i64::MAX as u128 {
        return Err(bad("too large (at most 2562047h47m16.854775807s)"));
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| bad("too large"))?;
    Ok(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_that_overflows_is_refused_not_a_panic() {
        let huge = "340282366920938463463374607431768211.9us";
        let error = parse_duration(huge).unwrap_err();
        assert!(error.contains("too large"), "{error}");
    }

    #[test]
    fn durations_past_gos_range_are_refused() {
        assert_eq!(
            parse_duration("2562047h47m16.854775807s").unwrap(),
            Duration::new(9_223_372_036, 854_775_807)
        );
        for huge in ["2562047h47m16.854775808s", "3000000000000000h"] {
            let error = parse_duration(huge).unwrap_err();
            assert!(error.contains("too large"), "{huge}: {error}");
        }
    }

    #[test]
    fn durations_parse_as_go_does() {
        let ok = [
            ("0", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(9900)),
            ("300us", Duration::from_micros(300)),
            ("300µs", Duration::from_micros(300)),
            ("7ns", Duration::from_nanos(7)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("+1s", Duration::from_secs(1)),
            ("+0", Duration::ZERO),
            ("-0", Duration::ZERO),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for text in [
            "",
            "10",
            "s",
            "-1s",
            "+",
            "-",
            "1x",
            "1.2.3s",
            ".s",
            "1 s",
            "10S",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(text).is_err(), "{text} parsed");
        }
    }
}
