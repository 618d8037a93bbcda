//! Where a request may hold a JSON array. serde's derived structs also read a JSON array, its
//! items taken as the members in order, so `"limits": [100]` would read as
//! `{"timeout_ms": 100}` and share its digest. The schema (docs/openapi.json) allows an array
//! only where it names a list, so the raw JSON is checked for one anywhere else before the
//! typed parse: no two texts that the schema does not both allow read as one request.

use serde_json::Value;

/// The first array in `value` outside the `lists` (dotted member paths from the top; a list's
/// items are `PATH[]`), as a message for the caller.
pub(crate) fn array_outside(value: &Value, lists: &[&str], what: &str) -> Option<String> {
    let mut path = String::new();
    find(value, lists, &mut path).map(|at| {
        let named = if lists.is_empty() {
            format!("a {what} holds no list")
        } else {
            format!(
                "the only lists in a {what} are {}",
                lists
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!("`{at}` is an array where protocol 1 takes none: {named}; send an object where the schema says object")
    })
}

fn find(value: &Value, lists: &[&str], path: &mut String) -> Option<String> {
    match value {
        Value::Array(items) => {
            if !lists.contains(&path.as_str()) {
                return Some(if path.is_empty() {
                    "(the body)".to_owned()
                } else {
                    path.clone()
                });
            }
            let len = path.len();
            path.push_str("[]");
            let found = items.iter().find_map(|item| find(item, lists, path));
            path.truncate(len);
            found
        }
        Value::Object(members) => members.iter().find_map(|(name, member)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
            let found = find(member, lists, path);
            path.truncate(len);
            found
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTS: &[&str] = &["run.files", "run.steps", "run.artifacts"];

    fn at(json: &str) -> Option<String> {
        let v: Value = serde_json::from_str(json).unwrap();
        array_outside(&v, LISTS, "run request").map(|m| m.split('`').nth(1).unwrap().to_owned())
    }

    #[test]
    fn arrays_are_found_only_outside_the_lists() {
        assert_eq!(at(r#"{"limits":[100]}"#).as_deref(), Some("limits"));
        assert_eq!(at(r#"{"run":["snippet"]}"#).as_deref(), Some("run"));
        assert_eq!(at(r#"[1]"#).as_deref(), Some("(the body)"));
        assert_eq!(
            at(r#"{"run":{"files":[["a","x"]]}}"#).as_deref(),
            Some("run.files[]")
        );
        assert_eq!(
            at(r#"{"run":{"files":[{"content":[1]}]}}"#).as_deref(),
            Some("run.files[].content")
        );
        assert_eq!(
            at(r#"{"run":{"steps":[{"run":"x"}],"artifacts":["a"],"files":[]}}"#),
            None
        );
        // A list name elsewhere is not a list.
        assert_eq!(
            at(r#"{"limits":{"steps":[]}}"#).as_deref(),
            Some("limits.steps")
        );
    }
}
