//! Reading back what the node's processes wrote: Prometheus text, CDI specs,
//! JSON log lines.

use serde_json::Value;
use shared_state::CpuSet;

/// The value of an unlabelled sample `name` in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok())?
        })
}

/// The CPUs a CDI spec gives claim `claim_uid` (`DRA_CPUSET_<uid>=<cpulist>`
/// in any device's container edits).
pub fn cdi_spec_cpus(spec: &Value, claim_uid: &str) -> Option<CpuSet> {
    let prefix = format!("DRA_CPUSET_{claim_uid}=");
    spec.get("devices")?
        .as_array()?
        .iter()
        .filter_map(|d| d.pointer("/containerEdits/env")?.as_array())
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix(&prefix))
        .and_then(|list| CpuSet::parse_cpulist(list).ok())
}

/// The log lines (JSON, one per line) whose message contains `fragment`.
pub fn log_messages_with(log: &str, fragment: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v.pointer("/fields/message")
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains(fragment))
        })
        .collect()
}

/// The JSON log lines of `log` written inside a span named `span` (at any
/// depth of the line's `spans`).
pub fn json_lines_in_span(log: &str, span: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v.get("spans")
                .and_then(Value::as_array)
                .is_some_and(|spans| {
                    spans
                        .iter()
                        .any(|s| s.get("name").and_then(Value::as_str) == Some(span))
                })
        })
        .collect()
}

/// The value of field `field` of span `span` in one JSON log line.
pub fn json_span_field(line: &Value, span: &str, field: &str) -> Option<String> {
    line.get("spans")?
        .as_array()?
        .iter()
        .find(|s| s.get("name").and_then(Value::as_str) == Some(span))?
        .get(field)?
        .as_str()
        .map(str::to_string)
}

/// The fields of span `span` in one text log line, as the text format
/// writes a line's spans before its message (`outer{a=1}:span{k=v x=y}:
/// target: message`): `k=v x=y`. None where the line is not inside `span`
/// (a span whose name only ends in `span`, `unprepare` for `prepare`, is
/// another span).
pub fn text_span_fields<'a>(line: &'a str, span: &str) -> Option<&'a str> {
    let open = format!("{span}{{");
    let mut from = 0;
    while let Some(found) = line[from..].find(&open) {
        let start = from + found;
        let bounded = line[..start]
            .chars()
            .next_back()
            .is_none_or(|c| c == ' ' || c == ':');
        let fields = start + open.len();
        if bounded {
            let end = line[fields..].find('}')?;
            return Some(&line[fields..fields + end]);
        }
        from = fields;
    }
    None
}

/// What is wrong with a log of JSON lines, one problem a line: a line that
/// is not one JSON object, or an object (at any depth) that holds a key
/// twice, which a log pipeline reads as one value or refuses. Lines of
/// other output (a panic message) are problems too.
pub fn log_line_problems(log: &str) -> Vec<String> {
    log.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .filter_map(|(i, line)| {
            let mut de = serde_json::Deserializer::from_str(line);
            match serde::de::Deserializer::deserialize_any(&mut de, UniqueKeys)
                .and_then(|top| de.end().map(|()| top))
            {
                Ok(true) => None,
                Ok(false) => Some(format!("line {}: not a JSON object: {line}", i + 1)),
                Err(e) => Some(format!("line {}: {e}: {line}", i + 1)),
            }
        })
        .collect()
}

/// A JSON value read only to refuse an object with a key twice; yields
/// whether the value was an object.
struct UniqueKeys;

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("key {key:?} twice")));
            }
            map.next_value_seed(UniqueKeys)?;
        }
        Ok(true)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element_seed(UniqueKeys)?.is_some() {}
        Ok(false)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use shared_state::cdi_spec::CDI_KIND;

    #[test]
    fn metric_values_table() {
        let text = "# HELP a x\n# TYPE a gauge\na 1\nab 2\nc{x=\"y\"} 3\nd notanumber\n";
        let cases = [
            ("a", Some(1.0)),
            ("ab", Some(2.0)),
            ("c", None),
            ("d", None),
            ("e", None),
        ];
        for (name, want) in cases {
            assert_eq!(metric_value(text, name), want, "{name}");
        }
    }

    #[test]
    fn text_span_fields_table() {
        let line = "2026-12-06T06:00:00Z  INFO unprepare{claim_uid=u2}:prepare{claim_uid=u1 namespace=n}: dra_plugin: claim prepared cpus=1";
        let cases = [
            (line, "prepare", Some("claim_uid=u1 namespace=n")),
            (line, "unprepare", Some("claim_uid=u2")),
            (line, "repare", None),
            (line, "create_container", None),
            ("prepare{claim_uid=u}: m", "prepare", Some("claim_uid=u")),
            ("INFO prepare{claim_uid=u", "prepare", None),
            ("INFO prepare: no fields", "prepare", None),
        ];
        for (line, span, want) in cases {
            assert_eq!(text_span_fields(line, span), want, "{span} in {line}");
        }
    }

    #[test]
    fn json_span_lines_and_fields() {
        let log = concat!(
            "{\"spans\":[{\"name\":\"rpc\"},{\"name\":\"prepare\",\"claim_uid\":\"u1\"}]}\n",
            "{\"spans\":[{\"name\":\"unprepare\",\"claim_uid\":\"u2\"}]}\n",
            "not json\n",
            "{\"fields\":{\"message\":\"no span\"}}\n",
        );
        let lines = json_lines_in_span(log, "prepare");
        assert_eq!(lines.len(), 1);
        assert_eq!(
            json_span_field(&lines[0], "prepare", "claim_uid").as_deref(),
            Some("u1")
        );
        assert_eq!(json_span_field(&lines[0], "rpc", "claim_uid"), None);
        assert_eq!(json_span_field(&lines[0], "unprepare", "claim_uid"), None);
        assert_eq!(json_lines_in_span(log, "unprepare").len(), 1);
    }

    #[test]
    fn cdi_spec_cpus_table() {
        let spec = |env: Value| {
            json!({"cdiVersion": "0.6.0", "kind": CDI_KIND,
                "devices": [{"name": "claim-u1", "containerEdits": {"env": env}}]})
        };
        let cases = [
            (spec(json!(["DRA_CPUSET_u1=1"])), "u1", Some("1")),
            (
                spec(json!(["X=1", "DRA_CPUSET_u1=0-3,8"])),
                "u1",
                Some("0-3,8"),
            ),
            (spec(json!(["DRA_CPUSET_u1=1"])), "u2", None),
            (spec(json!(["DRA_CPUSET_u1=x"])), "u1", None),
            (spec(json!("not a list")), "u1", None),
            (json!({"devices": "none"}), "u1", None),
        ];
        for (i, (spec, uid, want)) in cases.into_iter().enumerate() {
            let want = want.map(|w| CpuSet::parse_cpulist(w).unwrap());
            assert_eq!(cdi_spec_cpus(&spec, uid), want, "case {i}");
        }
    }

    #[test]
    fn log_lines_are_found_by_message() {
        let log = concat!(
            "{\"level\":\"WARN\",\"fields\":{\"message\":\"refusing container\",\"reason\":\"x\"}}\n",
            "not json\n",
            "{\"level\":\"INFO\",\"fields\":{\"message\":\"started\"}}\n",
        );
        assert_eq!(log_messages_with(log, "refusing").len(), 1);
        assert_eq!(log_messages_with(log, "start").len(), 1);
        assert!(log_messages_with(log, "absent").is_empty());
    }

    proptest! {
        #[test]
        fn metric_value_reads_back_any_gauge(name in "[a-z_]{1,20}", value in 0u32..1_000_000) {
            let text = format!("# TYPE {name} gauge\n{name} {value}\n{name}_other 7\n");
            prop_assert_eq!(metric_value(&text, &name), Some(f64::from(value)));
        }

        #[test]
        fn cdi_spec_cpus_reads_back_any_cpulist(cpus in proptest::collection::btree_set(0u32..256, 1..20)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let spec = json!({"devices": [{"containerEdits": {"env": [format!("DRA_CPUSET_u={}", set.to_cpulist())]}}]});
            prop_assert_eq!(cdi_spec_cpus(&spec, "u"), Some(set));
        }
    }

    #[test]
    fn log_line_problems_name_duplicate_keys_at_any_depth() {
        let log = concat!(
            "{\"fields\":{\"message\":\"ok\"},\"span\":{\"claim_uid\":\"u\",\"name\":\"prepare\"}}\n",
            "{\"span\":{\"name\":\"app\",\"name\":\"create_container\"}}\n",
            "{\"spans\":[{\"a\":1},{\"a\":1,\"a\":2}]}\n",
            "\n",
            "thread 'main' panicked\n",
            "[1]\n",
            "{\"a\":1} {\"b\":2}\n",
        );
        let problems = log_line_problems(log);
        let lines: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap_or_default())
            .collect();
        assert_eq!(
            lines,
            ["line 2", "line 3", "line 5", "line 6", "line 7"],
            "{problems:#?}"
        );
        assert!(
            problems[0].contains("key \"name\" twice"),
            "{}",
            problems[0]
        );
    }
}
