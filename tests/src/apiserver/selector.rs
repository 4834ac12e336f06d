//! Label and field selectors as the Kubernetes API server parses them from
//! `labelSelector=` and `fieldSelector=` query parameters.

use serde_json::Value;
use std::collections::BTreeSet;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// One requirement of a field selector: `field=value` or `field!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b`).
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn valid_label_key(key: &str) -> bool {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return false;
            }
            name
        }
        None => key,
    };
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(key: &str, rest: &str, original: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement {original:?}: expected a parenthesised set after {key:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// Parses a label selector such as `app=x,tier!=db,env in (a,b),!legacy`.
pub fn parse_label_selector(input: &str) -> Result<Vec<LabelRequirement>, String> {
    let mut requirements = Vec::new();
    if input.trim().is_empty() {
        return Ok(requirements);
    }
    for raw in split_top_level(input) {
        let part = raw.trim();
        if part.is_empty() {
            return Err(format!("empty requirement in label selector {input:?}"));
        }
        let requirement = if let Some(key) = part.strip_prefix('!') {
            LabelRequirement::DoesNotExist(key.trim().to_string())
        } else if let Some((key, value)) = part.split_once("!=") {
            LabelRequirement::NotEquals(key.trim().to_string(), value.trim().to_string())
        } else if let Some((key, value)) = part.split_once("==") {
            LabelRequirement::Equals(key.trim().to_string(), value.trim().to_string())
        } else if let Some((key, value)) = part.split_once('=') {
            LabelRequirement::Equals(key.trim().to_string(), value.trim().to_string())
        } else if let Some((key, rest)) = part.split_once(" notin ") {
            LabelRequirement::NotIn(key.trim().to_string(), parse_set(key, rest, part)?)
        } else if let Some((key, rest)) = part.split_once(" in ") {
            LabelRequirement::In(key.trim().to_string(), parse_set(key, rest, part)?)
        } else {
            LabelRequirement::Exists(part.to_string())
        };
        let key = match &requirement {
            LabelRequirement::Equals(k, _)
            | LabelRequirement::NotEquals(k, _)
            | LabelRequirement::In(k, _)
            | LabelRequirement::NotIn(k, _)
            | LabelRequirement::Exists(k)
            | LabelRequirement::DoesNotExist(k) => k,
        };
        if !valid_label_key(key) {
            return Err(format!(
                "invalid label key {key:?} in label selector {input:?}"
            ));
        }
        requirements.push(requirement);
    }
    Ok(requirements)
}

/// Whether an object's `metadata.labels` satisfy every requirement.
pub fn labels_match(requirements: &[LabelRequirement], object: &Value) -> bool {
    let labels = object.pointer("/metadata/labels");
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    requirements.iter().all(|r| match r {
        LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
        LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
        LabelRequirement::In(k, set) => label(k).is_some_and(|l| set.contains(l)),
        LabelRequirement::NotIn(k, set) => !label(k).is_some_and(|l| set.contains(l)),
        LabelRequirement::Exists(k) => label(k).is_some(),
        LabelRequirement::DoesNotExist(k) => label(k).is_none(),
    })
}

/// Parses a field selector such as `spec.nodeName=node-1,spec.driver!=x`,
/// accepting only the fields in `supported` (as the API server does, which
/// answers 400 for any other field label).
pub fn parse_field_selector(
    input: &str,
    supported: &[&str],
) -> Result<Vec<FieldRequirement>, String> {
    let mut requirements = Vec::new();
    if input.trim().is_empty() {
        return Ok(requirements);
    }
    for raw in input.split(',') {
        let part = raw.trim();
        let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = part.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = part.split_once('=') {
            (f, v, false)
        } else {
            return Err(format!("invalid field selector requirement {part:?}"));
        };
        let field = field.trim();
        if !supported.contains(&field) {
            return Err(format!("field label not supported: {field}"));
        }
        requirements.push(FieldRequirement {
            field: field.to_string(),
            value: value.trim().to_string(),
            negated,
        });
    }
    Ok(requirements)
}

/// The value of a dotted field path as a field selector sees it: strings as
/// they are, booleans and numbers in their text form, absent as "".
pub fn field_value(object: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match object.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

pub fn fields_match(requirements: &[FieldRequirement], object: &Value) -> bool {
    requirements.iter().all(|r| {
        let actual = field_value(object, &r.field);
        (actual == r.value) != r.negated
    })
}

/// Decodes one `application/x-www-form-urlencoded` query component.
pub fn percent_decode(input: &str) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a query string into decoded (key, value) pairs.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "labels": labels}, "spec": {"nodeName": "n1", "driver": "dra.cpu", "allNodes": false}})
    }

    #[test]
    fn label_selector_table() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db, cache)", true),
            ("app notin (web)", false),
            ("missing notin (web)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (web,db),tier", true),
            ("example.com/role=x", false),
        ];
        for (selector, expected) in cases {
            let parsed = parse_label_selector(selector)
                .unwrap_or_else(|e| panic!("{selector:?} failed to parse: {e}"));
            assert_eq!(
                labels_match(&parsed, &o),
                *expected,
                "selector {selector:?}"
            );
        }
    }

    #[test]
    fn label_selector_rejects_malformed() {
        for bad in ["app=web,,x", "a b c d=", "x in web", "=v", "bad key=1"] {
            assert!(
                parse_label_selector(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn field_selector_table() {
        let o = obj(json!({}));
        let supported = ["metadata.name", "spec.nodeName", "spec.driver"];
        let cases: &[(&str, bool)] = &[
            ("spec.nodeName=n1", true),
            ("spec.nodeName==n1", true),
            ("spec.nodeName=n2", false),
            ("spec.nodeName!=n2", true),
            ("spec.nodeName=n1,spec.driver=dra.cpu", true),
            ("spec.nodeName=n1,spec.driver=other", false),
            ("metadata.name=x", true),
        ];
        for (selector, expected) in cases {
            let parsed = parse_field_selector(selector, &supported)
                .unwrap_or_else(|e| panic!("{selector:?} failed: {e}"));
            assert_eq!(
                fields_match(&parsed, &o),
                *expected,
                "selector {selector:?}"
            );
        }
        let err = parse_field_selector("spec.allNodes=true", &supported).unwrap_err();
        assert!(err.contains("spec.allNodes"), "{err}");
        assert!(parse_field_selector("spec.nodeName", &supported).is_err());
    }

    #[test]
    fn query_decoding_table() {
        let cases: &[(&str, &str)] = &[
            ("spec.nodeName%3Dnode-1", "spec.nodeName=node-1"),
            ("a+b", "a b"),
            ("%2", "%2"),
            ("%zz", "%zz"),
            ("100%", "100%"),
            ("app%20in%20%28a%2Cb%29", "app in (a,b)"),
        ];
        for (raw, decoded) in cases {
            assert_eq!(percent_decode(raw), *decoded, "decoding {raw:?}");
        }
        assert_eq!(
            parse_query("watch=true&fieldSelector=spec.nodeName%3Dn&flag"),
            vec![
                ("watch".to_string(), "true".to_string()),
                ("fieldSelector".to_string(), "spec.nodeName=n".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
    }

    proptest! {
        #[test]
        fn equality_and_inequality_are_complements(key in "[a-z]{1,8}", value in "[a-z0-9]{0,8}", label in proptest::option::of("[a-z0-9]{0,8}")) {
            let o = match &label {
                Some(l) => obj(json!({ key.clone(): l })),
                None => obj(json!({})),
            };
            let eq = parse_label_selector(&format!("{key}={value}")).unwrap();
            let ne = parse_label_selector(&format!("{key}!={value}")).unwrap();
            prop_assert_ne!(labels_match(&eq, &o), labels_match(&ne, &o));
            let exists = parse_label_selector(&key).unwrap();
            let absent = parse_label_selector(&format!("!{key}")).unwrap();
            prop_assert_eq!(labels_match(&exists, &o), label.is_some());
            prop_assert_ne!(labels_match(&exists, &o), labels_match(&absent, &o));
        }

        #[test]
        fn percent_decoding_never_panics_and_inverts_encoding(s in "\\PC{0,16}", noise in "[%0-9a-fA-F+]{0,8}") {
            let encoded: String = s.bytes().map(|b| format!("%{b:02X}")).collect();
            prop_assert_eq!(percent_decode(&encoded), s);
            let _ = percent_decode(&noise);
        }
    }
}
