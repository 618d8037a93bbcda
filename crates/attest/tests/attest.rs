//! Integration tests of plimsoll-attest: golden vectors, tampering of every kind refused with a
//! precise message, concurrent appends, the independent Python check, and run/verify/replay
//! against a real in-process daemon.

use std::path::{Path, PathBuf};
use std::process::Output;

use plimsoll_attest::bundle::{close_statement, entry_statement};
use plimsoll_attest::dsse::{PAYLOAD_TYPE, pae};
use plimsoll_attest::line::envelope_sha256;
use plimsoll_attest::sample::{
    join_lines, restate_digests, sample_bundle_lines, sample_exchange, sample_session, signed_lines,
};
use plimsoll_attest::statement::{GENESIS_SHA256, to_payload};
use plimsoll_attest::{
    AppendError, AttestKey, BundleLine, CheckExchangeError, Exchange, LineProblem, PublicKey,
    SessionChainError, SessionLinkProblem, SignChainError, SignExchangeError, VerifyBundleError,
    append_entry, check_exchange, close_bundle, sign_chain, sign_exchange, sign_session,
    verify_bundle, verify_bundle_bytes,
};
use plimsoll_env as env;

fn golden_key() -> AttestKey {
    // The golden seed: bytes 0x00, 0x01, ..., 0x1f.
    AttestKey::from_seed(&std::array::from_fn(|i| i as u8))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Prints `SKIP` and returns true, or panics under CI=true.
fn skip(test: &str, reason: &str) -> bool {
    assert!(
        !env::strict(),
        "SKIP not allowed under CI=true: {test}: {reason}"
    );
    eprintln!("SKIP {test}: {reason}");
    true
}

/// A bundle of `n` entries (sample exchanges), closed, signed by `key`.
fn bundle_bytes(key: &AttestKey, n: u64) -> Vec<u8> {
    bundle_bytes_from(key, 0, n)
}

/// Like [`bundle_bytes`] but with exchanges numbered from `first`.
fn bundle_bytes_from(key: &AttestKey, first: u64, n: u64) -> Vec<u8> {
    join_lines(&sample_bundle_lines(key, first, n))
}

fn lines_of(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    assert_eq!(v.pop(), Some(vec![]), "a bundle ends with a newline");
    v
}

fn refusal(bytes: &[u8], key: &PublicKey) -> String {
    match verify_bundle_bytes(bytes, key) {
        Ok(_) => panic!("the bundle verified, but it should have been refused"),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------- golden vectors

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The golden files: name and expected content (text files end with one newline).
fn golden_files() -> Vec<(&'static str, Vec<u8>)> {
    let key = golden_key();
    let ex = sample_exchange(0);
    let d = check_exchange(&ex).unwrap();
    let entry_payload = to_payload(&entry_statement(&ex, &d, 0, GENESIS_SHA256));
    let entry_pae = pae(PAYLOAD_TYPE, &entry_payload);
    let entry_line = sign_exchange(&key, &ex, 0, GENESIS_SHA256).unwrap();
    let last = envelope_sha256(&entry_line.envelope);
    let close_payload = to_payload(&close_statement(1, &last));
    let close_pae = pae(PAYLOAD_TYPE, &close_payload);
    let text = |mut b: Vec<u8>| {
        b.push(b'\n');
        b
    };
    vec![
        ("public.pem", key.public_pem().into_bytes()),
        ("key_id", text(key.key_id().as_bytes().to_vec())),
        ("entry.statement.json", text(entry_payload)),
        ("entry.pae.hex", text(hex::encode(&entry_pae).into_bytes())),
        (
            "entry.sig.hex",
            text(hex::encode(key.sign(&entry_pae)).into_bytes()),
        ),
        ("close.statement.json", text(close_payload)),
        ("close.pae.hex", text(hex::encode(&close_pae).into_bytes())),
        (
            "close.sig.hex",
            text(hex::encode(key.sign(&close_pae)).into_bytes()),
        ),
        ("bundle.jsonl", bundle_bytes(&key, 1)),
        ("session.jsonl", golden_session_bundle(&key, &[0, 3, 1, 2])),
        (
            "session-reordered.jsonl",
            golden_session_bundle(&key, &[0, 2, 1]),
        ),
    ]
}

/// The golden session's id.
const GOLDEN_SESSION: &str = "ses_0123456789abcdef_00112233445566778899aabbccddeeff";

/// A closed bundle of the golden session's three calls and one plain run (index 3), in the
/// order given: `[0, 3, 1, 2]` verifies; `[0, 2, 1]` (calls 1, 3, 2) is refused.
fn golden_session_bundle(key: &AttestKey, order: &[usize]) -> Vec<u8> {
    let mut all = sample_session(GOLDEN_SESSION, 0, 3);
    all.push(sample_exchange(7));
    let exchanges: Vec<Exchange> = order.iter().map(|&i| all[i].clone()).collect();
    join_lines(&signed_lines(key, &exchanges))
}

fn line_diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut out = String::new();
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    out.push_str(&format!("-{x}\n"));
                }
                if let Some(y) = y {
                    out.push_str(&format!("+{y}\n"));
                }
            }
        }
    }
    out
}

/// The statement JSON, PAE bytes, signatures and a whole bundle for a fixed key and exchange.
/// `PLIMSOLL_BLESS=1` rewrites the files and prints the diff (refused under CI=true).
#[test]
fn golden_vectors() {
    let bless = env::get(env::PLIMSOLL_BLESS).is_some_and(|v| v == "1");
    assert!(
        !(bless && env::strict()),
        "PLIMSOLL_BLESS=1 is refused under CI=true: bless on a developer machine and commit"
    );
    let dir = golden_dir();
    let mut stale = Vec::new();
    for (name, want) in golden_files() {
        let path = dir.join(name);
        let have = std::fs::read(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        let diff = line_diff(
            &String::from_utf8_lossy(&have),
            &String::from_utf8_lossy(&want),
        );
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
            eprintln!("blessed {}:\n{diff}", path.display());
        } else {
            stale.push(format!("{}:\n{diff}", path.display()));
        }
    }
    assert!(
        stale.is_empty(),
        "golden vectors differ (if the change is intended: PLIMSOLL_BLESS=1 cargo nextest run -p plimsoll-attest golden_vectors):\n{}",
        stale.join("\n")
    );
}

/// The golden statement is the in-toto shape the docs promise, and the PAE is exactly DSSE's.
#[test]
fn golden_statement_shape() {
    let files = golden_files();
    let stmt = &files
        .iter()
        .find(|(n, _)| *n == "entry.statement.json")
        .unwrap()
        .1;
    let v: serde_json::Value = serde_json::from_slice(stmt).unwrap();
    assert_eq!(v["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(v["predicateType"], "urn:plimsoll:attest:run:v1");
    assert_eq!(v["subject"][0]["name"], "run:sample-0");
    assert_eq!(
        v["subject"][0]["digest"]["sha256"],
        sample_exchange(0).response.record.record_sha256.as_str()
    );
    assert_eq!(v["predicate"]["sequence"], 0);
    assert_eq!(v["predicate"]["previous_sha256"], GENESIS_SHA256);
    let body = &stmt[..stmt.len() - 1];
    let pae_bytes = pae(PAYLOAD_TYPE, body);
    let prefix = format!("DSSEv1 28 application/vnd.in-toto+json {} ", body.len());
    assert!(pae_bytes.starts_with(prefix.as_bytes()));
    assert_eq!(&pae_bytes[prefix.len()..], body);
}

// ---------------------------------------------------------------- tampering

/// Flipping any bit of a small bundle is refused. Every byte position is flipped; in debug
/// builds one bit per position (rotating) plus all eight bits of every structural byte, in
/// release builds (`cargo nextest run --release`) all eight bits of every byte.
#[test]
fn every_bit_flip_is_refused() {
    let key = golden_key();
    let bundle = bundle_bytes(&key, 1);
    verify_bundle_bytes(&bundle, key.public()).expect("the untouched bundle verifies");
    let all_bits = !cfg!(debug_assertions);
    let mut flips: Vec<(usize, u8)> = Vec::new();
    for (pos, &b) in bundle.iter().enumerate() {
        let structural = !b.is_ascii_alphanumeric();
        if all_bits || structural {
            flips.extend((0..8).map(|bit| (pos, bit)));
        } else {
            flips.push((pos, (pos % 8) as u8));
        }
    }
    let threads = 2;
    let chunk = flips.len().div_ceil(threads);
    let results: Vec<(Vec<String>, std::collections::BTreeMap<String, usize>)> =
        std::thread::scope(|s| {
            let handles: Vec<_> = flips
                .chunks(chunk)
                .map(|part| {
                    let (bundle, key) = (&bundle, &key);
                    s.spawn(move || {
                        let mut accepted = Vec::new();
                        let mut kinds = std::collections::BTreeMap::new();
                        let mut copy = bundle.clone();
                        for &(pos, bit) in part {
                            copy[pos] ^= 1 << bit;
                            match verify_bundle_bytes(&copy, key.public()) {
                                Ok(_) => accepted.push(format!(
                                    "byte {pos} bit {bit} ({:?} -> {:?})",
                                    bundle[pos] as char, copy[pos] as char
                                )),
                                Err(e) => *kinds.entry(kind_of(&e)).or_insert(0) += 1,
                            }
                            copy[pos] ^= 1 << bit;
                        }
                        (accepted, kinds)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
    let mut accepted = Vec::new();
    let mut kinds = std::collections::BTreeMap::new();
    for (a, k) in results {
        accepted.extend(a);
        for (name, n) in k {
            *kinds.entry(name).or_insert(0) += n;
        }
    }
    eprintln!(
        "{} flips over {} bytes, refused as: {kinds:?}",
        flips.len(),
        bundle.len()
    );
    assert!(
        accepted.is_empty(),
        "{} flips verified: {:?}",
        accepted.len(),
        &accepted[..accepted.len().min(20)]
    );
}

fn kind_of(e: &VerifyBundleError) -> String {
    match e {
        VerifyBundleError::Line { problem, .. } => {
            let d = format!("{problem:?}");
            d[..d.find(['(', ' ', '{']).unwrap_or(d.len())].to_owned()
        }
        other => {
            let d = format!("{other:?}");
            d[..d.find(['(', ' ', '{']).unwrap_or(d.len())].to_owned()
        }
    }
}

#[test]
fn dropped_duplicated_reordered_and_unclosed_are_refused_by_name() {
    let key = golden_key();
    let bundle = bundle_bytes(&key, 3);
    let ok = verify_bundle_bytes(&bundle, key.public()).unwrap();
    assert_eq!(ok.entries.len(), 3);
    assert!(
        ok.summary().starts_with("bundle OK: 3 entries"),
        "{}",
        ok.summary()
    );
    let lines = lines_of(&bundle);
    assert_eq!(lines.len(), 4);
    let pk = key.public();

    // An entry dropped from the middle.
    let mut l = lines.clone();
    l.remove(1);
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "line 2 (sequence 2): sequence 2 where 1 was expected: 1 entry missing before it, or out of order"
    );
    // The last entry dropped (the close then counts one more).
    let mut l = lines.clone();
    l.remove(2);
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "line 3 (sequence 3): sequence 3 where 2 was expected: 1 entry missing before it, or out of order"
    );
    // The first entry dropped.
    let mut l = lines.clone();
    l.remove(0);
    assert!(
        refusal(&join_lines(&l), pk)
            .starts_with("line 1 (sequence 1): sequence 1 where 0 was expected")
    );
    // An entry duplicated.
    let mut l = lines.clone();
    l.insert(2, lines[1].clone());
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "line 3 (sequence 1): sequence 1 where 2 was expected: an entry is repeated or out of order"
    );
    // Two entries swapped.
    let mut l = lines.clone();
    l.swap(0, 1);
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "line 1 (sequence 1): sequence 1 where 0 was expected: 1 entry missing before it, or out of order"
    );
    // The close dropped.
    let l = lines[..3].to_vec();
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "no close: the bundle ends at line 3 (sequence 2) after 3 entries; it was cut short, or never closed (`plimsoll-attest close`)"
    );
    // The close moved before the last entry.
    let mut l = lines.clone();
    l.swap(2, 3);
    assert!(
        refusal(&join_lines(&l), pk)
            .starts_with("line 3 (sequence 3): sequence 3 where 2 was expected")
    );
    // A line after the close.
    let mut l = lines.clone();
    l.push(lines[0].clone());
    assert_eq!(
        refusal(&join_lines(&l), pk),
        "line 5 (expected sequence 3): follows the close at line 4: nothing may follow a close"
    );
    // The close duplicated.
    let mut l = lines.clone();
    l.push(lines[3].clone());
    assert!(refusal(&join_lines(&l), pk).contains("follows the close at line 4"));
    // An entry with the right sequence from another bundle of the same signer.
    let other = lines_of(&bundle_bytes_from(&key, 10, 3));
    let mut l = lines.clone();
    l[1] = other[1].clone();
    let msg = refusal(&join_lines(&l), pk);
    assert!(
        msg.starts_with("line 2 (sequence 1): names ") && msg.contains("as its predecessor"),
        "{msg}"
    );
    // Cut short in the middle of the last line.
    let cut = &bundle[..bundle.len() - 10];
    assert_eq!(
        refusal(cut, pk),
        "line 4 (expected sequence 3): does not end with a newline: the bundle was cut short while being written"
    );
    assert_eq!(
        refusal(b"", pk),
        "the bundle is empty: it holds no entry and no close"
    );
    assert!(refusal(b"\n", pk).starts_with("line 1 (expected sequence 0): empty line"));
}

#[test]
fn the_wrong_key_is_refused() {
    let key = golden_key();
    let bundle = bundle_bytes(&key, 2);
    let other = AttestKey::from_seed(&[7; 32]);
    let msg = refusal(&bundle, other.public());
    assert_eq!(
        msg,
        format!(
            "line 1 (expected sequence 0): signed by key {}, not by the key given ({}): check --pub",
            key.key_id(),
            other.key_id()
        )
    );
    // Claiming the other key's id does not help: the signature is checked against the key.
    let mut l = lines_of(&bundle);
    let mut line: BundleLine = serde_json::from_slice(&l[0]).unwrap();
    line.envelope.signatures[0].keyid = other.key_id().to_owned();
    l[0] = line.to_bytes();
    assert!(refusal(&join_lines(&l), other.public()).ends_with(
        "the signature does not verify: the signed statement was changed or signed by another key"
    ));
}

#[test]
fn edits_to_the_stored_exchange_are_refused_by_name() {
    let key = golden_key();
    let bundle = bundle_bytes(&key, 2);
    let lines = lines_of(&bundle);
    let pk = key.public();
    let edit = |f: &dyn Fn(&mut BundleLine)| {
        let mut l = lines.clone();
        let mut line: BundleLine = serde_json::from_slice(&l[1]).unwrap();
        f(&mut line);
        l[1] = line.to_bytes();
        refusal(&join_lines(&l), pk)
    };
    // The output changed, digests left stale.
    let msg = edit(&|l| l.exchange.as_mut().unwrap().response.result.stdout = "9\n".into());
    assert!(
        msg.starts_with("line 2 (sequence 1): the stored exchange does not check: result_sha256 recomputed from the stored result is "),
        "{msg}"
    );
    // The output changed and every digest restated (no key needed for that): the signature
    // still names the old record.
    let msg = edit(&|l| {
        let ex = l.exchange.as_mut().unwrap();
        ex.response.result.stdout = "9\n".into();
        restate_digests(ex);
    });
    assert!(
        msg.starts_with("line 2 (sequence 1): the signed subject is run:sample-1 sha256:"),
        "{msg}"
    );
    // The request changed and restated.
    let msg = edit(&|l| {
        let ex = l.exchange.as_mut().unwrap();
        ex.request.minimum_isolation = None;
        restate_digests(ex);
    });
    assert!(msg.contains("the signed subject is"), "{msg}");
    // A field no protocol digest covers.
    let msg = edit(&|l| l.exchange.as_mut().unwrap().response.duration_ms += 1);
    assert!(
        msg.starts_with("line 2 (sequence 1): the signed exchange_sha256 is `"),
        "{msg}"
    );
    // The exchange removed.
    let msg = edit(&|l| l.exchange = None);
    assert!(
        msg.ends_with(
            "a signed run without its stored exchange: the request and response were removed"
        ),
        "{msg}"
    );
    // A signature byte changed.
    let msg = edit(&|l| {
        let s = &mut l.envelope.signatures[0].sig;
        let c = if s.starts_with('A') { "B" } else { "A" };
        s.replace_range(0..1, c);
    });
    assert!(msg.ends_with("the signature does not verify: the signed statement was changed or signed by another key"), "{msg}");
    // The same content, written with a space: refused as non-canonical.
    let mut l = lines.clone();
    let text = String::from_utf8(l[1].clone())
        .unwrap()
        .replacen(":", ": ", 1);
    l[1] = text.into_bytes();
    assert!(
        refusal(&join_lines(&l), pk)
            .starts_with("line 2 (expected sequence 1): not in canonical form")
    );
}

// ---------------------------------------------------------------- appending

#[test]
fn appends_chain_close_and_refuse_after_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = golden_key();
    for i in 0..3 {
        let a = append_entry(&path, &key, &sample_exchange(i)).unwrap();
        assert_eq!((a.sequence, a.line), (i, i + 1));
    }
    let c = close_bundle(&path, &key).unwrap();
    assert_eq!(c.sequence, 3);
    // Same bytes as signing in memory: appending adds nothing of its own.
    assert_eq!(std::fs::read(&path).unwrap(), bundle_bytes(&key, 3));
    let v = verify_bundle(&path, key.public()).unwrap();
    assert_eq!(v.close_line, 4);

    let e = append_entry(&path, &key, &sample_exchange(9)).unwrap_err();
    assert!(matches!(e, AppendError::Closed { sequence: 3, .. }), "{e}");
    assert!(e.to_string().contains("is closed"), "{e}");
    assert!(matches!(
        close_bundle(&path, &key),
        Err(AppendError::Closed { .. })
    ));
    let missing = dir.path().join("typo.jsonl");
    assert!(matches!(
        close_bundle(&missing, &key),
        Err(AppendError::Missing { .. })
    ));
    assert!(!missing.exists());
    // An existing empty bundle can be closed: it then verifies with no entries.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(close_bundle(&empty, &key).unwrap().sequence, 0);
    let v = verify_bundle(&empty, key.public()).unwrap();
    assert!(
        v.summary()
            .starts_with("bundle OK: no entries, closed at line 1"),
        "{}",
        v.summary()
    );

    // Another signer's bundle, or a damaged last line: nothing is chained onto it.
    let open = dir.path().join("open.jsonl");
    append_entry(&open, &key, &sample_exchange(0)).unwrap();
    let other = AttestKey::from_seed(&[7; 32]);
    let e = append_entry(&open, &other, &sample_exchange(1)).unwrap_err();
    assert!(
        matches!(
            e,
            AppendError::Tail {
                problem: LineProblem::Envelope(_),
                ..
            }
        ),
        "{e}"
    );
    let mut bytes = std::fs::read(&open).unwrap();
    let n = bytes.len();
    bytes[n - 20] ^= 1;
    std::fs::write(&open, &bytes).unwrap();
    let e = append_entry(&open, &key, &sample_exchange(1)).unwrap_err();
    assert!(matches!(e, AppendError::Tail { .. }), "{e}");
    assert_eq!(std::fs::read(&open).unwrap(), bytes, "nothing was written");
}

#[test]
fn an_exchange_that_does_not_check_is_never_signed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = golden_key();
    let mut ex = sample_exchange(0);
    ex.response.result.exit_code = Some(1);
    let e = append_entry(&path, &key, &ex).unwrap_err();
    assert!(
        matches!(e, AppendError::Sign(SignExchangeError::Check(_))),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("refusing to sign: result_sha256"),
        "{e}"
    );
    assert!(!path.exists(), "no bundle was created");
    let e = sign_exchange(&key, &ex, 0, GENESIS_SHA256).unwrap_err();
    assert!(matches!(e, SignExchangeError::Check(_)));
    // Below the floor, digests restated: still refused.
    let mut ex = sample_exchange(0);
    ex.request.minimum_isolation = Some(plimsoll_wire::Tier::Container);
    restate_digests(&mut ex);
    let e = sign_exchange(&key, &ex, 0, GENESIS_SHA256).unwrap_err();
    assert!(e.to_string().contains("below the floor"), "{e}");
}

/// Appends from several threads, each with its own open file (flock is per open file, as
/// between processes), take turns: the chain verifies with every entry present.
#[test]
fn concurrent_appends_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = golden_key();
    let (threads, each) = (4u64, 8u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (path, key) = (&path, &key);
            s.spawn(move || {
                for i in 0..each {
                    append_entry(path, key, &sample_exchange(t * 100 + i)).unwrap();
                }
            });
        }
    });
    close_bundle(&path, &key).unwrap();
    let v = verify_bundle(&path, key.public()).unwrap();
    assert_eq!(v.entries.len() as u64, threads * each);
    let mut ids: Vec<String> = v
        .entries
        .iter()
        .map(|e| e.exchange.request.request_id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len() as u64,
        threads * each,
        "every append is there once"
    );
}

// ---------------------------------------------------------------- sessions

/// A session id of the daemon's shape, `n` telling sessions apart.
fn session_id(n: u8) -> String {
    format!("ses_0123456789abcdef_{}", hex::encode([n; 16]))
}

/// Signs `exchanges` one by one with `append_entry` (which checks each exchange on its own,
/// never a session's chain: what a signer holding the key could do) and closes the bundle.
fn append_each_and_close(path: &Path, key: &AttestKey, exchanges: &[&Exchange]) {
    for ex in exchanges {
        append_entry(path, key, ex).unwrap();
    }
    close_bundle(path, key).unwrap();
}

/// The session problem `verify` names for a bundle, with its line.
fn session_refusal(path: &Path, key: &PublicKey) -> (usize, SessionChainError, String) {
    match verify_bundle(path, key) {
        Err(e @ VerifyBundleError::Session { .. }) => {
            let message = e.to_string();
            let VerifyBundleError::Session { line, problem, .. } = e else {
                unreachable!()
            };
            (line, problem, message)
        }
        other => panic!("expected a session refusal, got {other:?}"),
    }
}

#[test]
fn a_session_signed_as_one_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let key = golden_key();
    let calls = sample_session(&session_id(1), 0, 3);
    let signed = sign_session(&path, &key, &calls).unwrap();
    let sequences: Vec<u64> = signed.entries.iter().map(|a| a.sequence).collect();
    assert_eq!(sequences, [0, 1, 2]);
    assert_eq!((signed.close.sequence, signed.close.line), (3, 4));
    let v = verify_bundle(&path, key.public()).unwrap();
    assert_eq!(v.entries.len(), 3);
    assert_eq!(v.close_sha256, signed.close.envelope_sha256);
    // Every digest is real: each call names the record digest the previous call's record has.
    for pair in v.entries.windows(2) {
        let link = pair[1].exchange.response.record.session.as_ref().unwrap();
        assert_eq!(
            link.previous_record_sha256.as_deref(),
            Some(pair[0].exchange.response.record.record_sha256.as_str())
        );
    }
    // The same bytes as signing the calls one by one and closing.
    let one_by_one = dir.path().join("o.jsonl");
    append_each_and_close(&one_by_one, &key, &calls.iter().collect::<Vec<_>>());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&one_by_one).unwrap()
    );
    // The bundle is closed: a further chain is refused, nothing written.
    let before = std::fs::read(&path).unwrap();
    let e = sign_session(&path, &key, &calls).unwrap_err();
    assert!(
        matches!(
            e,
            SignChainError::Append(AppendError::Closed { sequence: 3, .. })
        ),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

/// A call dropped, repeated, two swapped, a wrong previous digest, a session starting at call
/// 2, a call run elsewhere: signed with the real key through `append_entry` (no session
/// check), every bundle verifies line by line, and is refused for its session chain, naming the
/// session and the call. `sign_session` refuses the same lists before writing anything.
#[test]
fn broken_session_chains_are_refused_by_name_even_when_re_signed() {
    let dir = tempfile::tempdir().unwrap();
    let key = golden_key();
    let id = session_id(2);
    let c = sample_session(&id, 0, 4);

    // A wrong previous digest: call 2 names another record (its digests restated).
    let mut c2_wrong = c[1].clone();
    let elsewhere = sample_exchange(50).response.record.record_sha256;
    c2_wrong
        .response
        .record
        .session
        .as_mut()
        .unwrap()
        .previous_record_sha256 = Some(elsewhere.clone());
    restate_digests(&mut c2_wrong);
    // Call 2 ran on another environment.
    let mut c2_moved = c[1].clone();
    c2_moved.response.record.environment = "another image".into();
    restate_digests(&mut c2_moved);

    type Expect = fn(&SessionChainError) -> bool;
    let cases: Vec<(&str, Vec<&Exchange>, usize, Expect)> = vec![
        ("dropped", vec![&c[0], &c[2], &c[3]], 2, |e| {
            matches!(
                e,
                SessionChainError::Missing {
                    sequence: 3,
                    expected: 2,
                    ..
                }
            )
        }),
        ("repeated", vec![&c[0], &c[1], &c[1], &c[2]], 3, |e| {
            matches!(e, SessionChainError::Repeated { sequence: 2, .. })
        }),
        ("swapped", vec![&c[0], &c[2], &c[1], &c[3]], 2, |e| {
            matches!(
                e,
                SessionChainError::OutOfOrder {
                    sequence: 3,
                    expected: 2,
                    ..
                }
            )
        }),
        ("wrong previous", vec![&c[0], &c2_wrong], 2, |e| {
            matches!(e, SessionChainError::Previous { sequence: 2, .. })
        }),
        ("starts at call 2", vec![&c[1], &c[2]], 1, |e| {
            matches!(e, SessionChainError::StartsLate { sequence: 2, .. })
        }),
        ("run elsewhere", vec![&c[0], &c2_moved], 2, |e| {
            matches!(
                e,
                SessionChainError::Changed {
                    sequence: 2,
                    field: "environment",
                    ..
                }
            )
        }),
    ];
    for (name, list, want_line, expect) in cases {
        let path = dir.path().join(format!("{name}.jsonl"));
        append_each_and_close(&path, &key, &list);
        let (line, problem, message) = session_refusal(&path, key.public());
        assert!(expect(&problem), "{name}: {problem:?}");
        assert_eq!(line, want_line, "{name}: {message}");
        assert_eq!(problem.session_id(), id, "{name}");
        assert!(
            message.starts_with(&format!(
                "line {want_line} (sequence {}): session `{id}` call ",
                want_line - 1
            )),
            "{name}: {message}"
        );
        // The in-memory signer gives the same bytes, and the same refusal.
        let owned: Vec<Exchange> = list.iter().map(|e| (*e).clone()).collect();
        let bytes = join_lines(&signed_lines(&key, &owned));
        assert_eq!(bytes, std::fs::read(&path).unwrap(), "{name}");
        assert_eq!(refusal(&bytes, key.public()), message, "{name}");
        // Signing the list as one chain is refused before anything is written.
        let fresh = dir.path().join(format!("{name}.fresh.jsonl"));
        let e = sign_chain(&fresh, &key, &owned).unwrap_err();
        match &e {
            SignChainError::Session {
                sequence, problem, ..
            } => {
                assert!(expect(problem), "{name}: {e}");
                assert_eq!(*sequence, want_line as u64 - 1, "{name}: {e}");
            }
            other => panic!("{name}: {other}"),
        }
        assert!(!fresh.exists(), "{name}: no bundle was created");
    }
    let msg = refusal(
        &join_lines(&signed_lines(&key, &[c[0].clone(), c2_wrong.clone()])),
        key.public(),
    );
    assert!(
        msg.contains(&elsewhere) && msg.contains(&c[0].response.record.record_sha256),
        "{msg}"
    );
}

#[test]
fn malformed_session_links_are_never_signed() {
    let dir = tempfile::tempdir().unwrap();
    let key = golden_key();
    let c = sample_session(&session_id(3), 0, 2);
    let broken = |f: fn(&mut plimsoll_wire::SessionLink)| {
        let mut ex = c[1].clone();
        f(ex.response.record.session.as_mut().unwrap());
        restate_digests(&mut ex);
        ex
    };
    for (ex, want) in [
        (broken(|l| l.sequence = 0), SessionLinkProblem::ZeroSequence),
        (
            broken(|l| l.sequence = 1),
            SessionLinkProblem::PreviousOnFirst,
        ),
        (
            broken(|l| l.previous_record_sha256 = None),
            SessionLinkProblem::NoPrevious,
        ),
    ] {
        let e = check_exchange(&ex).unwrap_err();
        assert!(
            matches!(e, CheckExchangeError::SessionLink { problem, .. } if problem == want),
            "{e}"
        );
        let path = dir.path().join("b.jsonl");
        assert!(append_entry(&path, &key, &ex).is_err());
        assert!(!path.exists());
    }
    let e = check_exchange(&broken(|l| l.previous_record_sha256 = Some("ABC".into()))).unwrap_err();
    assert!(
        matches!(
            e,
            CheckExchangeError::NotHex {
                field: "record.session.previous_record_sha256",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn interleaved_sessions_and_plain_runs_verify() {
    let dir = tempfile::tempdir().unwrap();
    let key = golden_key();
    let (a, b) = (session_id(4), session_id(5));
    let s = sample_session(&a, 0, 3);
    let t = sample_session(&b, 10, 2);
    let plain = |n| sample_exchange(n);
    let chain = vec![
        plain(20),
        s[0].clone(),
        t[0].clone(),
        s[1].clone(),
        plain(21),
        t[1].clone(),
        s[2].clone(),
    ];
    let path = dir.path().join("mixed.jsonl");
    let signed = sign_chain(&path, &key, &chain).unwrap();
    assert_eq!(signed.entries.len(), 7);
    let v = verify_bundle(&path, key.public()).unwrap();
    assert_eq!(v.entries.len(), 7);

    // A session continued across two chains into one bundle: calls 1 then 2 and 3.
    let cont = dir.path().join("cont.jsonl");
    append_entry(&cont, &key, &s[0]).unwrap();
    sign_session(&cont, &key, &s[1..]).unwrap();
    verify_bundle(&cont, key.public()).unwrap();
    // The whole session again after call 1 is in the bundle: refused, nothing written.
    let again = dir.path().join("again.jsonl");
    append_entry(&again, &key, &s[0]).unwrap();
    let before = std::fs::read(&again).unwrap();
    let e = sign_session(&again, &key, &s).unwrap_err();
    assert!(
        matches!(&e, SignChainError::Session { sequence: 1, problem, .. }
            if matches!(**problem, SessionChainError::Repeated { sequence: 1, .. })),
        "{e}"
    );
    assert_eq!(std::fs::read(&again).unwrap(), before);

    // sign_session takes the calls of one session only.
    let e = sign_session(&dir.path().join("x"), &key, &[s[0].clone(), t[0].clone()]).unwrap_err();
    assert!(
        matches!(e, SignChainError::OtherSession { number: 2, .. }),
        "{e}"
    );
    let e = sign_session(&dir.path().join("x"), &key, &[s[0].clone(), plain(1)]).unwrap_err();
    assert!(
        matches!(e, SignChainError::NotSessionCall { number: 2, .. }),
        "{e}"
    );
    assert!(matches!(
        sign_session(&dir.path().join("x"), &key, &[]),
        Err(SignChainError::Empty)
    ));
    assert!(!dir.path().join("x").exists());
}

#[test]
fn cli_sign_signs_stored_exchanges_as_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let o = attest(&["keygen", "--out", &d("k")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let c = sample_session(&session_id(6), 0, 3);
    let jsonl = |order: &[usize]| {
        let mut out = String::new();
        for &i in order {
            out.push_str(&String::from_utf8(c[i].canonical_json()).unwrap());
            out.push('\n');
        }
        out
    };
    std::fs::write(d("calls.jsonl"), jsonl(&[0, 1, 2])).unwrap();
    let o = attest(
        &["sign", "--key", &d("k.key"), &d("b"), &d("calls.jsonl")],
        &[],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o)
            .0
            .starts_with("signed 3 entries (sequences 0 to 2)"),
        "{:?}",
        text(&o)
    );
    let o = attest(&["verify", "--pub", &d("k.pub"), &d("b")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.starts_with("bundle OK: 3 entries"),
        "{:?}",
        text(&o)
    );

    // Reordered: refused, naming the session and the call, and no bundle is created.
    std::fs::write(d("swapped.jsonl"), jsonl(&[0, 2, 1])).unwrap();
    let o = attest(
        &["sign", "--key", &d("k.key"), &d("b2"), &d("swapped.jsonl")],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    let err = text(&o).1;
    assert!(
        err.contains(&format!(
            "session `{}` call 3 comes before call 2",
            session_id(6)
        )),
        "{err}"
    );
    assert!(!dir.path().join("b2").exists());
    // A line that is not an exchange is named.
    std::fs::write(d("bad.jsonl"), format!("{}{{}}\n", jsonl(&[0]))).unwrap();
    let o = attest(
        &["sign", "--key", &d("k.key"), &d("b3"), &d("bad.jsonl")],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("line 2 is not an exchange"),
        "{:?}",
        text(&o)
    );
}

/// `sign` stores each request in plimsoll's reading of it, as docs/attestation.md says: a
/// member with a default that the stored exchange left out is written with it, a `null`
/// member is left out, and the digest is the one the daemon answered (issue 28, finding 10).
#[test]
fn cli_sign_stores_a_request_in_its_canonical_reading() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let o = attest(&["keygen", "--out", &d("k")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let mut ex = sample_exchange(0);
    ex.request.run = plimsoll_wire::RunSpec::Project(plimsoll_wire::Project {
        files: vec![plimsoll_wire::ProjectFile {
            path: "a.py".into(),
            content: "print(0)\n".into(),
            executable: false,
        }],
        steps: vec![plimsoll_wire::Step {
            name: None,
            run: "python3 a.py".into(),
        }],
        artifacts: Vec::new(),
    });
    restate_digests(&mut ex);
    // As a client may have sent it: no `executable`, no `artifacts`, a `null` grant.
    let mut line: serde_json::Value = serde_json::from_slice(&ex.canonical_json()).unwrap();
    let run = &mut line["request"]["run"];
    run["files"][0]
        .as_object_mut()
        .unwrap()
        .remove("executable");
    run.as_object_mut().unwrap().remove("artifacts");
    line["request"]["grant"] = serde_json::Value::Null;
    std::fs::write(d("sent.jsonl"), format!("{line}\n")).unwrap();
    let o = attest(
        &["sign", "--key", &d("k.key"), &d("b"), &d("sent.jsonl")],
        &[],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let bundle = std::fs::read_to_string(d("b")).unwrap();
    let first: serde_json::Value = serde_json::from_str(bundle.lines().next().unwrap()).unwrap();
    let stored = &first["exchange"]["request"];
    assert_eq!(stored["run"]["files"][0]["executable"], false, "{stored}");
    assert_eq!(
        stored["run"]["artifacts"],
        serde_json::json!([]),
        "{stored}"
    );
    assert!(stored.get("grant").is_none(), "{stored}");
    let reread: plimsoll_wire::RunRequest = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(
        plimsoll_wire::digest::request_sha256(&reread),
        ex.response.request_sha256
    );
    let o = attest(&["verify", "--pub", &d("k.pub"), &d("b")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
}

// ---------------------------------------------------------------- the binary

#[expect(
    clippy::disallowed_methods,
    reason = "tests run the binary under test and the independent checker with chosen environments"
)]
fn command(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut c = std::process::Command::new(program);
    c.env_clear();
    c
}

fn attest(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = command(env!("CARGO_BIN_EXE_plimsoll-attest"));
    c.args(args).envs(envs.iter().copied());
    c.output().expect("run plimsoll-attest")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `keygen`'s private key loads in OpenSSL (`openssl pkey`) and in Python's `cryptography`,
/// and signs what its public key verifies there.
#[test]
fn keygen_keys_load_in_openssl_and_python_cryptography() {
    let test = "keygen_keys_load_in_openssl_and_python_cryptography";
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("k");
    let o = attest(&["keygen", "--out", &prefix.display().to_string()], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let key = dir.path().join("k.key");
    let public = dir.path().join("k.pub");
    let pem = std::fs::read_to_string(&key).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");

    match which("openssl") {
        None => {
            if skip(test, "no openssl on PATH") {
                return;
            }
        }
        Some(openssl) => {
            let o = command(&openssl)
                .arg("pkey")
                .arg("-in")
                .arg(&key)
                .arg("-noout")
                .output()
                .expect("run openssl");
            assert!(
                o.status.success(),
                "openssl pkey refused the key: {:?}",
                text(&o)
            );
            // The public key OpenSSL derives from the private key is the one in PREFIX.pub.
            let o = command(&openssl)
                .arg("pkey")
                .arg("-in")
                .arg(&key)
                .arg("-pubout")
                .output()
                .expect("run openssl");
            assert!(o.status.success(), "{:?}", text(&o));
            assert_eq!(text(&o).0, std::fs::read_to_string(&public).unwrap());
        }
    }

    let python = match python_with_cryptography() {
        Ok(p) => p,
        Err(why) => {
            skip(test, &why);
            return;
        }
    };
    let script = r#"
import sys
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
key = load_pem_private_key(open(sys.argv[1], "rb").read(), password=None)
pub = load_pem_public_key(open(sys.argv[2], "rb").read())
pub.verify(key.sign(b"plimsoll"), b"plimsoll")
print("ok")
"#;
    let o = command(&python)
        .arg("-c")
        .arg(script)
        .arg(&key)
        .arg(&public)
        .output()
        .expect("run python");
    assert!(
        o.status.success() && text(&o).0.trim() == "ok",
        "cryptography refused the key: {:?}",
        text(&o)
    );
}

/// `program` on PATH, if it is there.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[test]
fn cli_keygen_close_verify_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let o = attest(&["keygen", "--out", &d("k")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = attest(&["keygen", "--out", &d("k")], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("already exists"), "{:?}", text(&o));

    let key = plimsoll_attest::load_private_key(Path::new(&d("k.key"))).unwrap();
    for i in 0..2 {
        append_entry(Path::new(&d("b")), &key, &sample_exchange(i)).unwrap();
    }
    let o = attest(&["verify", "--pub", &d("k.pub"), &d("b")], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("no close"), "{:?}", text(&o));
    let o = attest(&["close", "--key", &d("k.key"), &d("b")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("after 2 entries"), "{:?}", text(&o));
    let o = attest(&["verify", "--pub", &d("k.pub"), &d("b")], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.starts_with("bundle OK: 2 entries"),
        "{:?}",
        text(&o)
    );
    // Both digests, named: the last entry's and the close's (the close's pins the bundle).
    let verified = plimsoll_attest::verify_bundle(Path::new(&d("b")), key.public()).unwrap();
    let out = text(&o).0;
    assert!(
        out.contains(&format!(
            "\nlast entry: sha256:{}\n",
            verified.last_entry_sha256
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("\nclose: sha256:{}\n", verified.close_sha256)),
        "{out}"
    );
    let lines = std::fs::read(d("b")).unwrap();
    let close_line = lines.split(|&b| b == b'\n').nth(2).unwrap();
    let close: BundleLine = serde_json::from_slice(close_line).unwrap();
    assert_eq!(verified.close_sha256, envelope_sha256(&close.envelope));
    assert_ne!(verified.close_sha256, verified.last_entry_sha256);

    let o = attest(&["keygen", "--out", &d("other")], &[]);
    assert!(o.status.success());
    let o = attest(&["verify", "--pub", &d("other.pub"), &d("b")], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o).1;
    assert!(
        err.contains("REFUSED") && err.contains("line 1 (expected sequence 0): signed by key"),
        "{err}"
    );
    // Replay verifies first and sends nothing (there is no daemon at this address).
    let o = attest(
        &[
            "replay",
            "--daemon",
            "http://127.0.0.1:9",
            "--pub",
            &d("other.pub"),
            &d("b"),
        ],
        &[("PLIMSOLL_TOKEN", "x")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o)
            .1
            .contains("nothing was sent: the bundle does not verify"),
        "{:?}",
        text(&o)
    );
}

// ---------------------------------------------------------------- independent check

/// A Python with the `cryptography` package: the project's venv, build/pyenv, made (or
/// brought up to date) by scripts/python-env from tests/python/requirements.txt.
fn python_with_cryptography() -> Result<PathBuf, String> {
    let o = command(root().join("scripts/python-env"))
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .map_err(|e| format!("cannot run scripts/python-env: {e}"))?;
    if !o.status.success() {
        return Err(format!("scripts/python-env failed: {:?}", text(&o)));
    }
    let python = PathBuf::from(text(&o).0.trim());
    let has = command(&python)
        .args(["-c", "import cryptography"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        return Err(format!("{} has no `cryptography`", python.display()));
    }
    Ok(python)
}

fn attest_check(python: &Path, args: &[&Path]) -> Output {
    let script = root().join("tests/independent/attest_check.py");
    command(python)
        .arg(&script)
        .args(args)
        .output()
        .expect("run attest_check.py")
}

#[test]
fn independent_python_check_agrees() {
    let python = match python_with_cryptography() {
        Ok(p) => p,
        Err(why) => {
            skip("independent_python_check_agrees", &why);
            return;
        }
    };
    let golden = golden_dir();
    let o = command(&python)
        .arg(root().join("tests/independent/attest_check.py"))
        .arg("golden")
        .arg(&golden)
        .output()
        .unwrap();
    assert!(o.status.success(), "golden: {:?}", text(&o));

    // A bundle written by append/close with a key from keygen, with non-ASCII and binary output.
    let dir = tempfile::tempdir().unwrap();
    let files = plimsoll_attest::keygen(&dir.path().join("k")).unwrap();
    let key = plimsoll_attest::load_private_key(&files.private).unwrap();
    let bundle = dir.path().join("b.jsonl");
    for i in 0..3 {
        let mut ex = sample_exchange(i);
        ex.response.result.stdout = format!("é\t\"{i}\"\u{1}\n").as_str().into();
        ex.response.result.stderr = plimsoll_wire::Bytes(vec![0xff, 0, i as u8]);
        restate_digests(&mut ex);
        append_entry(&bundle, &key, &ex).unwrap();
    }
    close_bundle(&bundle, &key).unwrap();
    let o = attest_check(&python, &[Path::new("bundle"), &files.public, &bundle]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("OK: 3 entries"), "{:?}", text(&o));

    // It refuses too: a changed byte, and the wrong key.
    let mut bytes = std::fs::read(&bundle).unwrap();
    // The escaped tab of the first entry's stdout becomes an escaped newline.
    let at = bytes.windows(2).position(|w| w == b"\\t").unwrap();
    bytes[at + 1] = b'n';
    let tampered = dir.path().join("t.jsonl");
    std::fs::write(&tampered, &bytes).unwrap();
    let o = attest_check(&python, &[Path::new("bundle"), &files.public, &tampered]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(text(&o).1.contains("REFUSED: line 1"), "{:?}", text(&o));
    let o = attest_check(
        &python,
        &[Path::new("bundle"), &golden.join("public.pem"), &bundle],
    );
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));

    // Sessions: a chain signed whole passes; each break re-signed with the key is refused
    // there too, naming the session.
    let id = session_id(8);
    let c = sample_session(&id, 0, 3);
    let whole = dir.path().join("session.jsonl");
    sign_chain(
        &whole,
        &key,
        &[c[0].clone(), sample_exchange(9), c[1].clone(), c[2].clone()],
    )
    .unwrap();
    let o = attest_check(&python, &[Path::new("bundle"), &files.public, &whole]);
    assert!(o.status.success(), "{:?}", text(&o));
    for (name, order) in [
        ("dropped", &[0, 2][..]),
        ("repeated", &[0, 1, 1, 2]),
        ("swapped", &[0, 2, 1]),
        ("late", &[1, 2]),
    ] {
        let path = dir.path().join(format!("{name}.jsonl"));
        let list: Vec<&Exchange> = order.iter().map(|&i| &c[i]).collect();
        append_each_and_close(&path, &key, &list);
        assert!(verify_bundle(&path, key.public()).is_err(), "{name}");
        let o = attest_check(&python, &[Path::new("bundle"), &files.public, &path]);
        assert_eq!(o.status.code(), Some(1), "{name}: {:?}", text(&o));
        assert!(
            text(&o).1.contains(&format!("session {id}")),
            "{name}: {:?}",
            text(&o)
        );
    }
}

// ---------------------------------------------------------------- against a real daemon

/// A daemon offering the process provider (default floor `process`), with a state directory
/// sandbox uids can enter.
struct Daemon {
    daemon: plimsoll_test_daemon::TestDaemon,
    _state: tempfile::TempDir,
}

impl Daemon {
    /// Starts one, or prints SKIP (fails under CI=true) when the process provider is not
    /// available on this host.
    fn start(test: &str) -> Option<Daemon> {
        let state = tempfile::Builder::new()
            .prefix("plimsoll-attest-test-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(
            state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        let daemon = plimsoll_test_daemon::TestDaemon::start(&format!(
            "providers = [\"process\"]\ndefault_floor = \"process\"\nstate_dir = \"{}\"\n",
            state.path().display()
        ));
        let client = plimsoll_client::Client::new(
            daemon.url.clone(),
            plimsoll_client::Token::new(daemon.token.clone()),
        );
        let providers = client.providers().expect("GET /v1/providers");
        let why = match providers.providers.iter().find(|p| p.name == "process") {
            Some(p) if p.available => None,
            Some(p) => Some(
                p.unavailable_reason
                    .clone()
                    .unwrap_or_else(|| "unavailable".into()),
            ),
            None => Some("no process provider".into()),
        };
        if let Some(why) = why {
            skip(test, &format!("the process provider is unavailable: {why}"));
            return None;
        }
        Some(Daemon {
            daemon,
            _state: state,
        })
    }

    fn run_args<'a>(&'a self, key: &'a str, bundle: &'a str) -> Vec<&'a str> {
        vec![
            "run",
            "--daemon",
            &self.daemon.url,
            "--key",
            key,
            "--bundle",
            bundle,
        ]
    }

    fn env(&self) -> Vec<(&str, &str)> {
        vec![("PLIMSOLL_TOKEN", self.daemon.token.as_str())]
    }
}

/// Three deterministic snippets signed into a bundle through the binary, closed, verified
/// (by us and by the Python check), replayed with the same results; then tampering is
/// refused, and replay sends nothing for a bundle that does not verify.
#[test]
fn run_close_verify_replay_against_a_daemon() {
    let Some(d) = Daemon::start("run_close_verify_replay_against_a_daemon") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    assert!(attest(&["keygen", "--out", &p("k")], &[]).status.success());
    let (key, bundle) = (p("k.key"), p("runs.jsonl"));
    std::fs::write(p("hello.js"), "console.log('hello from a file')\n").unwrap();

    let runs: [&[&str]; 3] = [
        &[
            "--lang",
            "python",
            "-e",
            "print(6 * 7)",
            "--min-isolation",
            "process",
        ],
        &[&p("hello.js"), "--timeout-ms", "20000"],
        &[
            "--lang",
            "js",
            "-e",
            "process.stdout.write('é\\t' + [3, 1, 2].sort().join(','))",
            "--provider",
            "process",
        ],
    ];
    for (i, extra) in runs.iter().enumerate() {
        let mut args = d.run_args(&key, &bundle);
        args.extend_from_slice(extra);
        let o = attest(&args, &d.env());
        assert!(o.status.success(), "run {i}: {:?}", text(&o));
        let out = text(&o).0;
        assert!(
            out.starts_with(&format!("signed entry {i} (line {}) run:", i + 1))
                && out.contains("process (process), exit 0"),
            "{out}"
        );
    }
    let entry_sizes: Vec<usize> = lines_of(&std::fs::read(&bundle).unwrap())
        .iter()
        .map(|l| l.len() + 1)
        .collect();
    eprintln!("entry line sizes from real runs: {entry_sizes:?} bytes");

    // A floor nobody here meets: refused before anything ran, nothing signed.
    let before = std::fs::read(&bundle).unwrap();
    let mut args = d.run_args(&key, &bundle);
    args.extend_from_slice(&[
        "--lang",
        "python",
        "-e",
        "print(1)",
        "--min-isolation",
        "vm",
    ]);
    let o = attest(&args, &d.env());
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("not dispatched (isolation)"),
        "{:?}",
        text(&o)
    );
    assert_eq!(
        std::fs::read(&bundle).unwrap(),
        before,
        "nothing was signed"
    );

    let o = attest(&["close", "--key", &key, &bundle], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = attest(&["verify", "--pub", &p("k.pub"), &bundle], &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o)
            .0
            .starts_with("bundle OK: 3 entries (sequences 0 to 2), closed at line 4"),
        "{:?}",
        text(&o)
    );
    let v = verify_bundle(
        Path::new(&bundle),
        &plimsoll_attest::load_public_key(Path::new(&p("k.pub"))).unwrap(),
    )
    .unwrap();
    let outs: Vec<String> = v
        .entries
        .iter()
        .map(|e| e.exchange.response.result.stdout.to_string_lossy())
        .collect();
    assert_eq!(outs, ["42\n", "hello from a file\n", "é\t1,2,3"]);
    match python_with_cryptography() {
        Ok(python) => {
            let o = attest_check(
                &python,
                &[
                    Path::new("bundle"),
                    Path::new(&p("k.pub")),
                    Path::new(&bundle),
                ],
            );
            assert!(o.status.success(), "{:?}", text(&o));
        }
        Err(why) => {
            skip(
                "run_close_verify_replay_against_a_daemon (python part)",
                &why,
            );
        }
    }

    // Closed: a further run is refused before anything is sent.
    let mut args = d.run_args(&key, &bundle);
    args.extend_from_slice(&["--lang", "python", "-e", "print(1)"]);
    let o = attest(&args, &d.env());
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("nothing was sent") && text(&o).1.contains("is closed"),
        "{:?}",
        text(&o)
    );

    let replay = |b: &str| {
        attest(
            &["replay", "--daemon", &d.daemon.url, "--pub", &p("k.pub"), b],
            &d.env(),
        )
    };
    let o = replay(&bundle);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o)
            .0
            .ends_with("replay: 3 entries, 3 same, 0 differ, 0 failed\n"),
        "{:?}",
        text(&o)
    );

    // Tampered: the output of the first run changed.
    let bytes = std::fs::read(&bundle).unwrap();
    let at = bytes.windows(4).position(|w| w == b"\"42\\").unwrap();
    let mut t = bytes.clone();
    t[at + 2] = b'3';
    std::fs::write(p("tampered.jsonl"), &t).unwrap();
    let o = attest(&["verify", "--pub", &p("k.pub"), &p("tampered.jsonl")], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o)
            .1
            .contains("line 1 (sequence 0): the stored exchange does not check: result_sha256"),
        "{:?}",
        text(&o)
    );
    let o = replay(&p("tampered.jsonl"));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("nothing was sent"), "{:?}", text(&o));
    assert!(text(&o).0.is_empty());

    // A run that is not deterministic: replay reports it and fails.
    let random = p("random.jsonl");
    let mut args = d.run_args(&key, &random);
    args.extend_from_slice(&[
        "--lang",
        "python",
        "-e",
        "import os; print(os.urandom(8).hex())",
    ]);
    assert!(attest(&args, &d.env()).status.success());
    assert!(
        attest(&["close", "--key", &key, &random], &[])
            .status
            .success()
    );
    let o = replay(&random);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("DIFFERS: signed result sha256:"),
        "{:?}",
        text(&o)
    );
    assert!(
        text(&o)
            .0
            .ends_with("replay: 1 entries, 0 same, 1 differ, 0 failed\n")
    );
}

/// Concurrent `plimsoll-attest run` processes into one bundle take turns on the lock.
#[test]
fn concurrent_run_processes_keep_one_chain() {
    let Some(d) = Daemon::start("concurrent_run_processes_keep_one_chain") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    assert!(attest(&["keygen", "--out", &p("k")], &[]).status.success());
    let (key, bundle) = (p("k.key"), p("b.jsonl"));
    let n = 4; // the default per-caller limit
    let children: Vec<_> = (0..n)
        .map(|i| {
            let code = format!("print({i})");
            let mut args = d.run_args(&key, &bundle);
            args.extend_from_slice(&["--lang", "python", "-e", &code]);
            let mut c = command(env!("CARGO_BIN_EXE_plimsoll-attest"));
            c.args(&args).envs(d.env());
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{:?}", text(&o));
    }
    assert!(
        attest(&["close", "--key", &key, &bundle], &[])
            .status
            .success()
    );
    let v = verify_bundle(
        Path::new(&bundle),
        &plimsoll_attest::load_public_key(Path::new(&p("k.pub"))).unwrap(),
    )
    .unwrap();
    let mut outs: Vec<String> = v
        .entries
        .iter()
        .map(|e| e.exchange.response.result.stdout.to_string_lossy())
        .collect();
    outs.sort();
    assert_eq!(outs, (0..n).map(|i| format!("{i}\n")).collect::<Vec<_>>());
}
