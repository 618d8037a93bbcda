//! The line protocol between the runner and the controller (docs/trials.md, "Line protocol"):
//! one state line out, one force line back, per tick.

use crate::sim::State;

/// The longest answer line accepted, newline included.
pub const MAX_LINE_BYTES: usize = 4096;

/// The state as the controller receives it: `x x_dot theta theta_dot\n`, each number in Rust's
/// `{}` form for f64 (the shortest decimal that parses back to the same double; never an
/// exponent; `-0` for negative zero).
pub fn state_line(state: &State) -> String {
    format!(
        "{} {} {} {}\n",
        state.x, state.x_dot, state.theta, state.theta_dot
    )
}

/// Why an answer line is not a force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseForceError {
    /// Not UTF-8.
    #[error("the answer is not UTF-8: {0}")]
    NotUtf8(String),
    /// Empty (or only whitespace).
    #[error("the answer is empty")]
    Empty,
    /// Not a decimal number.
    #[error("the answer {0} is not a number")]
    NotANumber(String),
    /// NaN or infinite.
    #[error("the answer {0} is not finite")]
    NotFinite(String),
}

/// Parses one answer line (without its newline): a decimal number, optionally signed, with an
/// optional fraction and exponent, surrounded by optional ASCII whitespace (a trailing `\r`
/// included). `inf`, `nan` and anything else that is not a finite double is refused.
pub fn parse_force(line: &[u8]) -> Result<f64, ParseForceError> {
    let text = std::str::from_utf8(line).map_err(|_| ParseForceError::NotUtf8(shown(line)))?;
    let text = text.trim_ascii();
    if text.is_empty() {
        return Err(ParseForceError::Empty);
    }
    // Rust's parser also takes "inf", "infinity" and "nan" (any case); only digits make a force.
    if !text.bytes().any(|b| b.is_ascii_digit()) {
        return Err(ParseForceError::NotANumber(shown(line)));
    }
    let value: f64 = text
        .parse()
        .map_err(|_| ParseForceError::NotANumber(shown(line)))?;
    if !value.is_finite() {
        // "1e999" parses to infinity.
        return Err(ParseForceError::NotFinite(shown(line)));
    }
    Ok(value)
}

/// At most 80 bytes of a line, quoted and escaped, for a message.
pub fn shown(line: &[u8]) -> String {
    let cut = &line[..line.len().min(80)];
    let mut s = format!("{:?}", String::from_utf8_lossy(cut));
    if line.len() > 80 {
        s.push_str(&format!(" (first 80 of {} bytes)", line.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_lines_round_trip_exactly() {
        let values = [
            0.0,
            -0.0,
            0.1,
            -1.0 / 3.0,
            1e-300,
            5e-324,
            2.4,
            std::f64::consts::PI,
            123_456_789.123_456_79,
        ];
        for &v in &values {
            let s = State {
                x: v,
                x_dot: -v,
                theta: v / 7.0,
                theta_dot: v * 3.0,
            };
            let line = state_line(&s);
            assert!(line.ends_with('\n') && !line.contains('e'), "{line}");
            let back: Vec<f64> = line
                .trim_end()
                .split(' ')
                .map(|t| t.parse().unwrap())
                .collect();
            let want = [s.x, s.x_dot, s.theta, s.theta_dot];
            for (b, w) in back.iter().zip(want) {
                assert_eq!(b.to_bits(), w.to_bits(), "{line}");
            }
        }
        assert_eq!(
            state_line(&State {
                x: -0.0,
                x_dot: 0.0,
                theta: 0.5,
                theta_dot: -2.0
            }),
            "-0 0 0.5 -2\n"
        );
    }

    #[test]
    fn forces_parse_like_javascript_and_python_print_them() {
        for (text, want) in [
            ("1.5", 1.5f64),
            ("-3.2e-7", -3.2e-7),
            ("1e-07", 1e-7),
            ("1e+21", 1e21),
            ("-0", -0.0),
            ("-0.0", -0.0),
            (" 2 \r", 2.0),
            ("\t.5", 0.5),
            ("+4.", 4.0),
            ("10000000000", 1e10),
        ] {
            let got = parse_force(text.as_bytes()).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_finite_number() {
        assert_eq!(parse_force(b""), Err(ParseForceError::Empty));
        assert_eq!(parse_force(b"  \r"), Err(ParseForceError::Empty));
        for text in [
            "nan",
            "NaN",
            "inf",
            "-Infinity",
            "abc",
            "1,5",
            "0x10",
            "1 2",
            "1e",
        ] {
            assert!(
                matches!(
                    parse_force(text.as_bytes()),
                    Err(ParseForceError::NotANumber(_))
                ),
                "{text}"
            );
        }
        assert!(matches!(
            parse_force(b"1e999"),
            Err(ParseForceError::NotFinite(_))
        ));
        assert!(matches!(
            parse_force(b"\xff1"),
            Err(ParseForceError::NotUtf8(_))
        ));
    }

    #[test]
    fn long_lines_are_cut_in_messages() {
        let long = vec![b'x'; 200];
        let s = shown(&long);
        assert!(s.contains("first 80 of 200 bytes"), "{s}");
    }
}
