//! The requests tests/openapi/refused.json says the daemon refuses before anything runs:
//! `parse_request` refuses each case marked `parse` (the schema refuses all of them:
//! tests/openapi/check.py), so docs/openapi.json and the parser agree.

use plimsoll_wire::parse_request;

#[test]
fn parse_request_refuses_every_case_the_schema_refuses() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/openapi/refused.json"
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read refused.json"))
            .expect("refused.json is JSON");
    let cases = file["cases"].as_array().expect("a list of cases");
    let mut parse_cases = 0;
    for case in cases {
        let what = case["what"].as_str().unwrap();
        match case["refused_by"].as_str().unwrap() {
            "parse" => {
                let body = serde_json::to_vec(&case["body"]).unwrap();
                assert!(
                    parse_request(&body).is_err(),
                    "parse_request accepts {what}"
                );
                parse_cases += 1;
            }
            // Limits above the maximums: the engine's (crates/engine config tests).
            "limits" => {
                let body = serde_json::to_vec(&case["body"]).unwrap();
                assert!(
                    parse_request(&body).is_ok(),
                    "{what}: only its limit should be wrong"
                );
            }
            other => panic!("{what}: unknown refused_by {other}"),
        }
    }
    assert!(parse_cases >= 20, "{parse_cases}");
}
