//! Whether a `/metrics` body serves the series the upstream Go driver
//! declares, read by both parsers a scrape may meet: Prometheus' own Go
//! parser ([`crate::prom_text`]) and the `prometheus-parse` crate.

/// One series as upstream's `pkg/metrics` declares it: name, type
/// (`counter`, `gauge`, `histogram` ...), help, label names (sorted).
pub type Series<'a> = (&'a str, &'a str, &'a str, &'a [&'a str]);

/// The type name of a parsed sample, as the text format spells it.
pub fn kind_of(value: &prometheus_parse::Value) -> &'static str {
    match value {
        prometheus_parse::Value::Counter(_) => "counter",
        prometheus_parse::Value::Gauge(_) => "gauge",
        prometheus_parse::Value::Histogram(_) => "histogram",
        prometheus_parse::Value::Summary(_) => "summary",
        prometheus_parse::Value::Untyped(_) => "untyped",
    }
}

/// Check that `text` serves every one of `series` with its type, help and
/// label names, as both parsers read it (the Go parser's check is skipped
/// outside CI where Go is missing). Returns the `prometheus-parse` reading
/// for the caller's checks of values.
pub fn check_served(text: &str, series: &[Series]) -> prometheus_parse::Scrape {
    // As Prometheus itself reads it: its Go parser.
    match crate::prom_text::parse(text) {
        Ok(families) => {
            for (name, kind, help, labels) in series {
                let family = families
                    .get(*name)
                    .unwrap_or_else(|| panic!("Prometheus' parser saw no {name}"));
                assert_eq!(
                    (family.kind.as_str(), family.help.as_str()),
                    (*kind, *help),
                    "{name}"
                );
                assert_eq!(family.labels, *labels, "{name} labels");
            }
        }
        Err(e) if e.is_missing_tool() => crate::skip::skip_or_fail_in_ci(e),
        Err(e) => panic!("{e}"),
    }
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the /metrics text parses");
    for (name, kind, help, labels) in series {
        let samples: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == *name)
            .collect();
        assert!(!samples.is_empty(), "no {name} in\n{text}");
        for sample in samples {
            assert_eq!(kind_of(&sample.value), *kind, "{name}");
            let mut got: Vec<&str> = sample.labels.keys().map(String::as_str).collect();
            got.sort_unstable();
            assert_eq!(got, *labels, "{name} labels");
        }
        assert_eq!(
            scrape.docs.get(*name).map(String::as_str),
            Some(*help),
            "{name} help"
        );
    }
    scrape
}
