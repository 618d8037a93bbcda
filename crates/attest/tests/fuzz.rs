//! Property-based fuzzing of the bundle parser (`verify_bundle_bytes`): arbitrary bytes never
//! panic and never verify; a valid bundle with lines dropped, repeated, swapped, cut or with
//! bytes changed either fails verification or, when it still verifies, says exactly what the
//! original said (same entries, same exchanges, same close): no edit is accepted as new
//! content.
//!
//! Cases per property are bounded (`PROPTEST_CASES` raises them; DEVELOPERS.md). Failures are
//! kept in `tests/fuzz.proptest-regressions` and replayed first: commit that file.

use plimsoll_attest::sample::{join_lines, sample_bundle_lines};
use plimsoll_attest::{AttestKey, VerifiedBundle, verify_bundle_bytes};
use proptest::prelude::*;

#[path = "../../../tests/fuzz/common.rs"]
mod common;
use common::config;

fn key() -> AttestKey {
    AttestKey::from_seed(&[7; 32])
}

/// What a verified bundle says, to compare.
fn meaning(b: &VerifiedBundle) -> String {
    let entries: Vec<String> = b
        .entries
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                String::from_utf8(e.exchange.canonical_json()).unwrap(),
                serde_json::to_string(&e.predicate).unwrap()
            )
        })
        .collect();
    format!(
        "{entries:?} close={} last={}",
        b.close_line, b.last_entry_sha256
    )
}

#[derive(Debug, Clone)]
enum Edit {
    Drop(prop::sample::Index),
    Repeat(prop::sample::Index),
    Swap(prop::sample::Index, prop::sample::Index),
    Byte(prop::sample::Index, prop::sample::Index, u8),
    Insert(prop::sample::Index, prop::sample::Index, u8),
    Cut(prop::sample::Index),
    Blank(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    use prop::sample::Index;
    prop_oneof![
        1 => any::<Index>().prop_map(Edit::Drop),
        1 => any::<Index>().prop_map(Edit::Repeat),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Swap(a, b)),
        4 => (any::<Index>(), any::<Index>(), any::<u8>()).prop_map(|(l, i, b)| Edit::Byte(l, i, b)),
        2 => (any::<Index>(), any::<Index>(), prop_oneof![Just(b' '), Just(b'\n'), Just(b'"'), Just(b'0'), any::<u8>()])
            .prop_map(|(l, i, b)| Edit::Insert(l, i, b)),
        1 => any::<Index>().prop_map(Edit::Cut),
        1 => any::<Index>().prop_map(Edit::Blank),
    ]
}

fn apply(lines: &mut Vec<Vec<u8>>, edit: &Edit) {
    if lines.is_empty() {
        return;
    }
    match edit {
        Edit::Drop(i) => {
            lines.remove(i.index(lines.len()));
        }
        Edit::Repeat(i) => {
            let l = lines[i.index(lines.len())].clone();
            lines.insert(i.index(lines.len()), l);
        }
        Edit::Swap(a, b) => {
            let (a, b) = (a.index(lines.len()), b.index(lines.len()));
            lines.swap(a, b);
        }
        Edit::Byte(l, i, b) => {
            let n = lines.len();
            let l = &mut lines[l.index(n)];
            if !l.is_empty() {
                let i = i.index(l.len());
                l[i] = *b;
            }
        }
        Edit::Insert(l, i, b) => {
            let n = lines.len();
            let l = &mut lines[l.index(n)];
            let i = i.index(l.len() + 1);
            l.insert(i, *b);
        }
        Edit::Cut(l) => {
            let n = lines.len();
            let l = &mut lines[l.index(n)];
            l.truncate(l.len() / 2);
        }
        Edit::Blank(i) => {
            lines.insert(i.index(lines.len() + 1), Vec::new());
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_verify(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(verify_bundle_bytes(&bytes, key().public()).is_err());
    }

    #[test]
    fn an_edited_bundle_fails_or_says_the_same(
        n in 0u64..4,
        edits in proptest::collection::vec(edit(), 1..4),
        unterminated in any::<bool>(),
    ) {
        let key = key();
        let lines = sample_bundle_lines(&key, 0, n);
        let original = verify_bundle_bytes(&join_lines(&lines), key.public()).unwrap();
        let mut edited = lines.clone();
        for e in &edits {
            apply(&mut edited, e);
        }
        let mut bytes = join_lines(&edited);
        if unterminated {
            bytes.pop();
        }
        match verify_bundle_bytes(&bytes, key.public()) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(v) => {
                prop_assert_eq!(meaning(&v), meaning(&original), "edits {:?} were accepted", edits);
                prop_assert!(bytes.ends_with(b"\n"), "an unterminated last line verified");
            }
        }
        // Another key never verifies it, edited or not.
        let other = AttestKey::from_seed(&[8; 32]);
        prop_assert!(verify_bundle_bytes(&bytes, other.public()).is_err());
    }
}
