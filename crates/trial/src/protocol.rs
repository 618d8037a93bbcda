//! The line protocol between the runner and the controller (docs/trials.md, "Line protocol"):
//! one state line out, one action line back, per tick.

/// The longest answer line accepted, newline included.
pub const MAX_LINE_BYTES: usize = 4096;

/// The state as the controller receives it: every state value, separated by one space, then
/// `\n`, each number in Rust's `{}` form for f64 (the shortest decimal that parses back to the
/// same double; never an exponent; `-0` for negative zero).
pub fn state_line(state: &[f64]) -> String {
    let mut line = String::with_capacity(state.len() * 20);
    for (i, v) in state.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&v.to_string());
    }
    line.push('\n');
    line
}

/// Why an answer line is not an action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseActionError {
    /// Not UTF-8.
    #[error("the answer is not UTF-8: {0}")]
    NotUtf8(String),
    /// Empty (or only whitespace).
    #[error("the answer is empty")]
    Empty,
    /// Another count of numbers than the simulator's action has.
    #[error("the answer {line} holds {got} values; the simulator takes {expected}")]
    Count {
        /// The line.
        line: String,
        /// Values the action has.
        expected: usize,
        /// Values the line holds.
        got: usize,
    },
    /// Not a decimal number.
    #[error("the answer {0} is not a number")]
    NotANumber(String),
    /// NaN or infinite.
    #[error("the answer {0} is not finite")]
    NotFinite(String),
}

/// Parses one answer line (without its newline) into `expected` numbers, separated by ASCII
/// whitespace (spaces, tabs; a trailing `\r` included): each a decimal number, optionally
/// signed, with an optional fraction and exponent. `inf`, `nan` and anything else that is
/// not a finite double is refused.
pub fn parse_action(line: &[u8], expected: usize) -> Result<Vec<f64>, ParseActionError> {
    let text = std::str::from_utf8(line).map_err(|_| ParseActionError::NotUtf8(shown(line)))?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    if words.is_empty() {
        return Err(ParseActionError::Empty);
    }
    if words.len() != expected {
        return Err(ParseActionError::Count {
            line: shown(line),
            expected,
            got: words.len(),
        });
    }
    words
        .iter()
        .map(|word| {
            // Rust's parser also takes "inf", "infinity" and "nan" (any case); only digits
            // make a number.
            if !word.bytes().any(|b| b.is_ascii_digit()) {
                return Err(ParseActionError::NotANumber(shown(line)));
            }
            let value: f64 = word
                .parse()
                .map_err(|_| ParseActionError::NotANumber(shown(line)))?;
            if !value.is_finite() {
                // "1e999" parses to infinity.
                return Err(ParseActionError::NotFinite(shown(line)));
            }
            Ok(value)
        })
        .collect()
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
            let s = [v, -v, v / 7.0, v * 3.0];
            let line = state_line(&s);
            assert!(line.ends_with('\n') && !line.contains('e'), "{line}");
            let back: Vec<f64> = line
                .trim_end()
                .split(' ')
                .map(|t| t.parse().unwrap())
                .collect();
            for (b, w) in back.iter().zip(s) {
                assert_eq!(b.to_bits(), w.to_bits(), "{line}");
            }
        }
        assert_eq!(state_line(&[-0.0, 0.0, 0.5, -2.0]), "-0 0 0.5 -2\n");
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
            let got = parse_action(text.as_bytes(), 1).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].to_bits(), want.to_bits(), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_finite_number() {
        assert_eq!(parse_action(b"", 1), Err(ParseActionError::Empty));
        assert_eq!(parse_action(b"  \r", 1), Err(ParseActionError::Empty));
        for text in ["nan", "NaN", "inf", "-Infinity", "abc", "1,5", "0x10", "1e"] {
            assert!(
                matches!(
                    parse_action(text.as_bytes(), 1),
                    Err(ParseActionError::NotANumber(_))
                ),
                "{text}"
            );
        }
        assert!(matches!(
            parse_action(b"1e999", 1),
            Err(ParseActionError::NotFinite(_))
        ));
        assert!(matches!(
            parse_action(b"\xff1", 1),
            Err(ParseActionError::NotUtf8(_))
        ));
    }

    #[test]
    fn an_action_has_exactly_as_many_numbers_as_the_simulator_takes() {
        assert_eq!(
            parse_action(b" 1.5\t-2 3e-1\r", 3).unwrap(),
            vec![1.5, -2.0, 0.3]
        );
        for (line, expected, got) in [("1 2", 1, 2), ("1", 2, 1), ("1 2 3 4", 3, 4)] {
            assert!(
                matches!(
                    parse_action(line.as_bytes(), expected),
                    Err(ParseActionError::Count { expected: e, got: g, .. }) if e == expected && g == got
                ),
                "{line}"
            );
        }
        assert!(matches!(
            parse_action(b"1 nan", 2),
            Err(ParseActionError::NotANumber(_))
        ));
        assert!(matches!(
            parse_action(b"1 -1e400", 2),
            Err(ParseActionError::NotFinite(_))
        ));
    }

    #[test]
    fn long_lines_are_cut_in_messages() {
        let long = vec![b'x'; 200];
        let s = shown(&long);
        assert!(s.contains("first 80 of 200 bytes"), "{s}");
    }
}
